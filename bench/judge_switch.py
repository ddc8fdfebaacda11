"""``make bench-judge-switch``: what a blue/green judge switch costs a pool of 4 replicas under step load.

A simulated pool of 4 replicas (an engine that takes 10 s to load, as a small model would; a real
one takes minutes, which adds to ``change_to_promotion_s`` and to ``extra_gpu_seconds`` in
proportion) on the local cluster, ``judgeUpdate: BlueGreen`` with ``IdleGap`` promotion
(``idleGapSeconds`` 2, ``scaleDownDelaySeconds`` 10), under step-structured load from the unmodified
``openai`` client and a ``requests`` session through its ClusterIP (`e2e.steps`): 12 steps, each a
burst of 24 verdicts, 8 s apart. The judge changes in the middle of the third step.

- ``change_to_promotion_s``: from the spec change to the new revision taking the pool's Service
  (``status.judge.active``);
- ``extra_gpu_seconds``: GPU-seconds held beyond the pool's 4 replicas, from the change until the
  previous revision is gone (pods sampled every 0.25 s);
- ``mixed_steps``: steps whose verdicts name more than one judge revision;
- ``lost``: verdicts that did not arrive.

Run from the repository root: ``python -m bench.judge_switch``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from e2e.harness import Cluster, Sampler, operated_cluster, pool_manifest, wait_for
from e2e.steps import StepLoad, mixed

REPLICAS = 4
STEPS = 12
CHANGE_AT_STEP = 2
GAP_SECONDS = 8.0
ENGINE = {"extraArgs": ["--sim-startup-seconds", "10", "--sim-ttft-ms", "20", "--sim-itl-ms", "5"],
          "startupTimeoutSeconds": 120}
JUDGE_UPDATE = {"strategy": "BlueGreen",
                "blueGreen": {"promotion": "IdleGap", "idleGapSeconds": 2, "scaleDownDelaySeconds": 10}}


class GpuMeter(Sampler):
    """The pool's live pods every 0.25 s, integrating those beyond ``REPLICAS`` (GPU-seconds)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        super().__init__(0.25)
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.extra_gpu_seconds = 0.0
        self._last = time.monotonic()

    def sample(self) -> None:
        pods = len(self.cluster.pod_addresses(self.namespace, self.name))
        now = time.monotonic()
        self.extra_gpu_seconds += max(0, pods - REPLICAS) * (now - self._last)
        self._last = now


def measure(cluster: Cluster) -> str:
    """One pool through one judge change under step load; the ``judge-switch:`` line."""
    namespace = name = "switch-bench"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        name, namespace, replicas=REPLICAS, engine=ENGINE, judgeUpdate=JUDGE_UPDATE,
        model={"path": "sim/judge", "servedName": "judge"}))
    cluster.wait_serving(namespace, name, REPLICAS, timeout=180)
    url = cluster.service_answering(namespace, name)

    def active() -> str:
        return str(((cluster.pool(namespace, name).get("status") or {}).get("judge") or {}).get("active"))

    def operating() -> bool:
        return bool((cluster.pool(namespace, name).get("status") or {}).get("operation"))
    first, changed, promoted_at = active(), 0.0, 0.0
    load, steps = StepLoad(url, "judge"), []
    change = json.dumps({"spec": {"model": {"path": "sim/judge-v2"}}})
    with GpuMeter(cluster, namespace, name) as meter:
        try:
            for n in range(STEPS):
                if n == CHANGE_AT_STEP:
                    changed = time.monotonic()
                    patch = ("patch", "genrmpool", name, "-n", namespace, "--type", "merge", "-p", change)
                    threading.Timer(0.2, cluster.kubectl, patch).start()
                steps.append(load.step(n))
                deadline = time.monotonic() + GAP_SECONDS
                while time.monotonic() < deadline:
                    if changed and not promoted_at and active() != first:
                        promoted_at = time.monotonic()
                    time.sleep(0.2)
        finally:
            load.close()
        wait_for("the switch to end", lambda: not operating(), 180)
        if not promoted_at and active() != first:
            promoted_at = time.monotonic()
    lost = sum(len(s.failures) for s in steps)
    promotion = f"{promoted_at - changed:.1f}" if promoted_at else "none"
    return (f"judge-switch: change_to_promotion_s={promotion} extra_gpu_seconds={meter.extra_gpu_seconds:.0f} "
            f"mixed_steps={len(mixed(steps))} lost={lost} steps={len(steps)} replicas={REPLICAS}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--log-dir", type=Path, help="keep the operator's log here (default: a temporary directory)")
    args = parser.parse_args()
    with operated_cluster(args.log_dir) as (cluster, _):
        line = measure(cluster)
    print(line)
    return 0 if "change_to_promotion_s=none" not in line and " mixed_steps=0 lost=0 " in line else 1


if __name__ == "__main__":
    raise SystemExit(main())

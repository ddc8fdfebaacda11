"""``make bench-autoscaler``: the built-in autoscaler against a scripted load step on the local cluster.

A simulated pool (one replica, mode Auto, InFlight target 2 per replica, 2-second interval)
gets a closed-loop load of 4x one replica's capacity (8 senders, each keeping about one
request in flight), holds it, then drops to zero. The senders are keep-alive clients at their
libraries' defaults going through the pool's Service ClusterIP, as a trainer's are (`spread.py`:
3 threads on one httpx.Client, 2 requests.Sessions, 2 aiohttp tasks on one session, one openai
client), so a replica the autoscaler adds gets traffic only if connections are handed back to
kube-proxy. Measured from the operator's own writes and status, polled every 0.2 s, and from the
replicas' own ``/metrics``:

* reaction: load step -> first scale-up written to ``spec.replicas`` (target <= 2 intervals);
* settle: load step -> enough serving replicas (4);
* flaps: direction changes of ``spec.replicas`` while the load holds (target 0);
* overshoot: most replicas asked for while the load holds, minus the 4 needed (target <= 1);
* new share: the share of the requests the replicas added by the scale-out served over the rest
  of the hold once settled (an even share is 0.75 with 4 replicas), and the smallest single share;
* failed: requests that did not succeed over the whole run, scale-in included (target 0).

It lives beside the end-to-end suite and uses its cluster, operator process, pool manifest and
load client (``harness.py``, ``loadclient.py``), so "failed" means exactly what it means there.
Run from the repository root: ``python -m bench.autoscaler``.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from genrm_cluster.cluster import LocalCluster
from kubernetes import client

from e2e.harness import REPO, Cluster, OperatorProcess, pool_manifest, served_model
from e2e.spread import KeepAliveClients, ShareMeter

INTERVAL_S = 2
TARGET = 2
PEAK = 4
"""The load step in replica capacities."""
HOLD_S = 60.0
NAMESPACE, POOL = "bench", "bench"
AUTOSCALING = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 8, "intervalSeconds": INTERVAL_S,
    "metrics": [{"type": "InFlight", "target": {"averageValue": str(TARGET)}}],
    # A short scale-down window so the run ends in minutes; scale-up keeps the GPU defaults.
    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 15,
                               "policies": [{"type": "Pods", "value": 8, "periodSeconds": 15}]}},
}
ENGINE = {"extraArgs": ["--sim-startup-seconds", "2", "--sim-ttft-ms", "5", "--sim-itl-ms", "20"]}
MIX = {"httpx": 3, "requests": 2, "aiohttp": 2, "openai": 1}
"""PEAK x TARGET senders of every kind of keep-alive client."""
MAX_TOKENS = 64


@dataclass
class Trace:
    """(seconds since the load step, spec.replicas, servingReplicas) samples."""

    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def reaction(self, before: int) -> float | None:
        return next((t for t, spec, _ in self.samples if spec > before), None)

    def settle(self, need: int) -> float | None:
        return next((t for t, _, serving in self.samples if serving >= need), None)

    def flaps(self, until: float) -> int:
        """Direction changes of spec.replicas among the samples before ``until``."""
        specs = [spec for t, spec, _ in self.samples if t < until]
        changes = [b - a for a, b in itertools.pairwise(specs) if b != a]
        return sum(1 for x, y in itertools.pairwise(changes) if (x > 0) != (y > 0))

    def overshoot(self, need: int, until: float) -> int:
        return max((spec for t, spec, _ in self.samples if t < until), default=need) - need


def poll(api: client.CustomObjectsApi, start: float, trace: Trace, until: float, settled_at: int = 0) -> None:
    """Record the pool's spec and serving count every 0.2 s until ``until`` seconds after ``start``
    (or, with ``settled_at``, until the pool has that many replicas, all serving)."""
    while (now := time.monotonic() - start) < until:
        if settled_at and trace.samples[-1][1:] == (settled_at, settled_at):
            return
        pool = cast(dict[str, Any], api.get_namespaced_custom_object("genrm.io", "v1alpha1", NAMESPACE,
                                                                     "genrmpools", POOL))
        status = pool.get("status") or {}
        trace.samples.append((now, int(pool["spec"]["replicas"]), int(status.get("servingReplicas", 0))))
        time.sleep(0.2)


def main() -> int:
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    need = math.ceil(PEAK)
    with LocalCluster(nodes=2, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"]) as local, \
            tempfile.TemporaryDirectory() as work:
        cluster = Cluster(local)
        operator = OperatorProcess(cluster.kubeconfig, Path(work))
        operator.start()
        try:
            cluster.kubectl("create", "namespace", NAMESPACE)
            cluster.kubectl("apply", "-f", "-", input=pool_manifest(POOL, NAMESPACE, replicas=1, engine=ENGINE,
                                                                    autoscaling=AUTOSCALING))
            cluster.wait_serving(NAMESPACE, POOL, 1)
            (first,) = cluster.published(NAMESPACE, POOL)
            url = cluster.service_answering(NAMESPACE, POOL)
            model = served_model(cluster.pool(NAMESPACE, POOL))
            api = client.CustomObjectsApi(cluster.api)
            trace = Trace()
            with ShareMeter(lambda: cluster.pod_addresses(NAMESPACE, POOL)) as meter, \
                    KeepAliveClients(url, model, MAX_TOKENS, mix=MIX) as load:
                start = time.monotonic()
                poll(api, start, trace, HOLD_S)
            poll(api, start, trace, HOLD_S + 120, settled_at=1)  # the drop to zero: scale-in, victims drain
            scaled_in = trace.samples[-1][1]
            settled = trace.settle(need)
            shares = meter.shares(start + (HOLD_S if settled is None else settled), start + HOLD_S)
        finally:
            operator.stop()
    new_share = sum(share for pod, share in shares.items() if pod != first)
    least = min(shares.values(), default=0.0)
    failed, sent = len(load.stats.failures), load.stats.sent
    reaction, settle = trace.reaction(1), trace.settle(need)
    reaction, settle = (None if x is None else round(x, 1) for x in (reaction, settle))
    flaps, overshoot = trace.flaps(HOLD_S), trace.overshoot(need, HOLD_S)
    rows = [("reaction (load step -> first scale-up written)", f"{reaction} s", f"<= {2 * INTERVAL_S} s"),
            ("settle (load step -> enough serving replicas)", f"{settle} s", f"{need} serving"),
            ("flaps during the hold", f"{flaps}", "0"),
            ("overshoot replicas", f"{overshoot}", "<= 1"),
            ("share of the added replicas once settled", f"{new_share:.2f}", f"{1 - 1 / need:.2f} (even)"),
            ("smallest replica share once settled", f"{least:.2f}", f">= {0.6 / need:.2f}"),
            ("failed requests", f"{failed} of {sent}", "0"),
            ("replicas after the drop", f"{scaled_in}", "1")]
    for name, value, target in rows:
        print(f"{name:<50} {value:>12}   target {target}")
    print(f"autoscaler-bench: reaction_s={-1.0 if reaction is None else reaction:.1f} "
          f"settle_s={-1.0 if settle is None else settle:.1f} flaps={flaps} overshoot_replicas={overshoot} "
          f"new_share={new_share:.3f} min_share={least:.3f} failed={failed} openai_retries={load.openai_retries}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``make bench-scale-to-zero``: a judge phase on a pool that idled to zero, cold and with a demand hint.

A simulated pool (``scaleToZero`` with ``idleSeconds`` 30, an engine that takes 20 s to start, as a
model load would) on the local cluster with the chart's activator, driven through its Service
ClusterIP by 8 keep-alive ``httpx`` senders (one judge phase = 30 s of back-to-back requests):

1. steady: the pool serves one replica; the phase's median latency is ``steady_p50_s``;
2. the senders stop; ``idle_to_zero_s`` is from the last answer to the last pod gone;
3. cold: a phase starts on the pool at zero; ``cold_first_answer_s`` is from its first request to
   its first answer, ``held`` the most requests the activators held at once;
4. the pool idles to zero again; a hint (``POST /v1/genrm/demand`` through the Service, answered by
   the activator) announces the phase 60 s ahead; ``hinted_first_answer_s`` is the same figure for
   the phase that then starts. It should be a steady latency: at most max(1 s, 2x steady p50).

``failed`` counts requests that did not end in a 2xx over all phases. Run from the repository root:
``python -m bench.scale_to_zero``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from genrm_cluster.cluster import LocalCluster
from genrm_contract.activator import ActivatorState, pool_key
from genrm_contract.demand import send

from e2e.harness import REPO, Cluster, OperatorProcess, Sampler, deploy_activator, pool_manifest, wait_for

SENDERS = 8
PHASE_SECONDS = 30.0
HINT_AHEAD_SECONDS = 60
ENGINE = {"extraArgs": ["--sim-startup-seconds", "20", "--sim-ttft-ms", "20", "--sim-itl-ms", "10"],
          "startupTimeoutSeconds": 120}
AUTOSCALING = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "8"}}],
    "scaleToZero": {"idleSeconds": 30}, "demand": {"replicaRequestsPerSecond": "20"},
}


@dataclass
class Phase:
    """One judge phase: every request's start and end (monotonic) and whether it got a 2xx."""

    requests: list[tuple[float, float, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_answer_s(self) -> float:
        start = min(r[0] for r in self.requests)
        return min(r[1] for r in self.requests if r[2]) - start

    def p50_s(self) -> float:
        return statistics.median(r[1] - r[0] for r in self.requests if r[2])

    @property
    def failed(self) -> int:
        return sum(1 for r in self.requests if not r[2])


def run_phase(url: str, seconds: float) -> Phase:
    """``SENDERS`` threads on one keep-alive ``httpx.Client`` sending back to back for ``seconds``."""
    phase, stop = Phase(), threading.Event()

    def sender(client: httpx.Client, n: int) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                ok = client.post(f"{url}/generate", json={"text": f"judge {n}: 2+2=4?",
                                                          "sampling_params": {"max_new_tokens": 16}}).is_success
            except httpx.HTTPError:
                ok = False
            with phase.lock:
                phase.requests.append((started, time.monotonic(), ok))

    with httpx.Client(timeout=180) as client:
        threads = [threading.Thread(target=sender, args=(client, n), daemon=True) for n in range(SENDERS)]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(200)
    return phase


class HeldMeter(Sampler):
    """The most requests the activators held for one pool at once, read from their state twice a second."""

    def __init__(self, cluster: Cluster, activator: tuple[str, str], key: str) -> None:
        super().__init__(0.5)
        self.cluster, self.key, self.most = cluster, key, 0
        self._namespace, self._service = activator[0].split("/", 1)
        self._headers = {"authorization": f"Bearer {activator[1]}"}
        self._ips: list[str] | None = None

    def sample(self) -> None:
        if self._ips is None:
            self._ips = self.cluster.kubectl("get", "pods", "-n", self._namespace, "-l",
                                             "app.kubernetes.io/component=activator", "-o",
                                             "jsonpath={.items[*].status.podIP}").split()
        total = 0
        for ip in self._ips:
            try:
                answer = httpx.get(f"http://{ip}:8001/v1/state", headers=self._headers, timeout=2)
                total += ActivatorState.model_validate_json(answer.content).held.get(self.key, 0)
            except httpx.HTTPError:
                pass
        self.most = max(self.most, total)


def to_zero(cluster: Cluster, namespace: str, name: str) -> float:
    """Seconds from now until the idle pool's last pod is gone."""
    started = time.monotonic()
    wait_for("the idle pool at zero", lambda: int(cluster.pool(namespace, name)["spec"]["replicas"]) == 0
             and not cluster.pods(namespace, name), timeout=180, interval=0.5)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--log-dir", type=Path, help="keep the operator's log here (default: a temporary directory)")
    args = parser.parse_args()
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    with LocalCluster(nodes=2, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"]) as local, \
            tempfile.TemporaryDirectory() as work:
        cluster = Cluster(local)
        activator = deploy_activator(cluster)
        operator = OperatorProcess(cluster.kubeconfig, args.log_dir or Path(work), activator)
        operator.start()
        try:
            namespace = name = "zero-bench"
            cluster.kubectl("create", "namespace", namespace)
            cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1, engine=ENGINE,
                                                                    autoscaling=AUTOSCALING))
            cluster.wait_serving(namespace, name, 1, timeout=180)
            url = cluster.service_url(namespace, name)
            steady = run_phase(url, PHASE_SECONDS)
            idle_to_zero = to_zero(cluster, namespace, name)
            with HeldMeter(cluster, activator, pool_key(namespace, name)) as meter:
                cold = run_phase(url, PHASE_SECONDS)
            to_zero(cluster, namespace, name)
            send(url, requests=int(SENDERS * PHASE_SECONDS * 4), within=HINT_AHEAD_SECONDS,
                 duration=int(PHASE_SECONDS), hint_id="bench-phase")
            time.sleep(HINT_AHEAD_SECONDS)
            hinted = run_phase(url, PHASE_SECONDS)
        finally:
            operator.stop()
    print(f"scale-to-zero: cold_first_answer_s={cold.first_answer_s():.2f} "
          f"hinted_first_answer_s={hinted.first_answer_s():.2f} steady_p50_s={steady.p50_s():.3f} "
          f"held={meter.most} failed={steady.failed + cold.failed + hinted.failed} "
          f"idle_to_zero_s={idle_to_zero:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

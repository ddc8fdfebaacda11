"""The gateway's readiness probe on a sole replica (issue 40; docs/gateway.md#readiness).

Aspects: a gateway that answers its readiness probe late (its processes stopped for 2 s, as a busy
node stalls them) keeps a sole replica a ready endpoint of the pool's Service throughout, where the
former `timeoutSeconds: 1` took it out; a SIGKILLed engine still takes the replica out of the
Service within the time it did before (the engine container's exit, or the gateway's 503, at once).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from .harness import Cluster, pool_manifest, wait_for
from .test_soak import engine_pid

POOL = "sole"
STALL_SECONDS = 2.0
"""How long the gateway answers nothing: over the former 1 s timeout, within the 3 s one."""
LEAVES_WITHIN_SECONDS = 2.5
"""A killed engine's replica is an unready endpoint within this: the kubelet's (here the node agent's
0.25 s tick) noticing of the container's exit, or the gateway's 503 at the next probe (1 s period),
then the status update and the EndpointSlice controller; the same with the former probe settings."""


def container_pid(pod: dict[str, Any], name: str) -> int | None:
    """The process of a running container of the local node agent (``genrm://<pid>``)."""
    if name == "engine":
        return engine_pid(pod)
    for c in pod.get("status", {}).get("containerStatuses") or []:
        if c["name"] == name and c.get("containerID", "").startswith("genrm://") and "running" in c["state"]:
            return int(c["containerID"].removeprefix("genrm://"))
    return None


class EndpointWatch:
    """Reads the pool Service's EndpointSlices every 0.05 s: when the pod was a ready endpoint."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str) -> None:
        self.api = cluster.local.api  # plain JSON over one kept-alive connection: a reading every 0.05 s
        self.namespace, self.pod = namespace, pod
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="endpoint-watch", daemon=True)

    def __enter__(self) -> EndpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def ready(self) -> bool:
        slices = self.api.get(f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                              {"labelSelector": f"kubernetes.io/service-name={POOL}"})["items"]
        return any((e.get("conditions") or {}).get("ready") and (e.get("targetRef") or {}).get("name") == self.pod
                   for s in slices for e in s.get("endpoints") or [])

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append((time.monotonic(), self.ready()))

    def unready_between(self, start: float, end: float) -> list[float]:
        return [t - start for t, ready in self.samples if start <= t <= end and not ready]

    def first_unready_after(self, start: float) -> float | None:
        return next((t - start for t, ready in self.samples if t >= start and not ready), None)


def test_a_slow_readiness_answer_keeps_a_sole_replica_serving_and_a_killed_engine_still_leaves(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(POOL, namespace, replicas=1))
    cluster.wait_serving(namespace, POOL, 1)
    [pod] = cluster.pods(namespace, POOL)
    name = pod["metadata"]["name"]
    gateway, engine = container_pid(pod, "gateway"), container_pid(pod, "engine")
    assert gateway is not None and engine is not None, pod["status"]
    with EndpointWatch(cluster, namespace, name) as watch:
        wait_for("the replica a ready endpoint", watch.ready, timeout=30, interval=0.1)
        stalled = time.monotonic()
        os.killpg(gateway, signal.SIGSTOP)
        try:
            time.sleep(STALL_SECONDS)
        finally:
            os.killpg(gateway, signal.SIGCONT)
        time.sleep(3.0)  # the probe that waited for the stall, and the next ones
        unready = watch.unready_between(stalled, time.monotonic())
        assert not unready, f"{name} left the Service {unready[0]:.2f}s into a {STALL_SECONDS:g}s slow answer"

        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(f"{name} to leave the Service", lambda: watch.first_unready_after(killed) is not None,
                 timeout=30, interval=0.05)
        left = watch.first_unready_after(killed)
    assert left is not None
    print(f"readiness: {name} stayed a ready endpoint through a {STALL_SECONDS:g}s stall of its gateway; "
          f"its killed engine took it out of the Service after {left:.2f}s", flush=True)
    assert left <= LEAVES_WITHIN_SECONDS, f"a killed engine took {left:.2f}s to leave the Service"

"""A scale-in whose survivor's engine dies right after the victim was chosen (issue 40).

Aspects: a pool of 2 under load from unmodified clients (openai, httpx, requests) through the
Service's ClusterIP is scaled to 1; as soon as ``status.operation.victims`` names the victim, the
other replica's engine is SIGKILLed. The operator keeps the victim in the Service, or puts it back
(event ``VictimKeptPublished`` or ``VictimRescued``), and the pool ends serving one replica. A monitor
reads the Service's EndpointSlices and the pods every 0.1 s: the Service is without a ready endpoint
while the victim is healthy at most for the rescue itself (the kill can land after the victim's
unpublish, and the kubelet takes the dead engine's replica out at once), and only requests in flight
on the killed engine may fail.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from genrm_operator.core.names import TOKEN_KEY, secret_name

from .harness import Cluster, account_plain, plain_report, pool_manifest, wait_for
from .test_soak import CONTROL_PORT, ENGINE_DIED, engine_pid

POOL = "rescue"
RESCUE_SECONDS = 5.0
"""The longest the Service may be without a ready endpoint while the victim is healthy: the operator
hearing of the crash, the victim's undrain and next readiness probe (1 s period), the EndpointSlice
controller's update. A victim still published at the kill is held and leaves no such moment at all."""
RESCUE_EVENTS = ("VictimKeptPublished", "VictimRescued")


@dataclass(frozen=True)
class Sample:
    """One reading of the Service's EndpointSlices and the pool's pods."""

    at: float
    ready: frozenset[str]
    """Pods listed as ready endpoints."""
    healthy: frozenset[str]
    """Pods that could serve (`healthy`)."""
    published: frozenset[str]


@dataclass
class EndpointMonitor:
    """Reads the Service's EndpointSlices and the pool's pods every 0.1 s."""

    cluster: Cluster
    namespace: str
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> EndpointMonitor:
        self._thread = threading.Thread(target=self._run, name="endpoint-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        api = self.cluster.local.api  # plain JSON over one kept-alive connection: a reading every 0.1 s
        slices_path = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        pods_path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.wait(0.1):
            slices = api.get(slices_path, {"labelSelector": f"kubernetes.io/service-name={POOL}"})["items"]
            pods = api.get(pods_path, {"labelSelector": f"genrm.io/pool={POOL}"})["items"]
            self.samples.append(Sample(
                time.monotonic(),
                frozenset(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []
                          if (e.get("conditions") or {}).get("ready") and e.get("targetRef")),
                frozenset(p["metadata"]["name"] for p in pods if healthy(p)),
                frozenset(p["metadata"]["name"] for p in pods
                          if p["metadata"].get("labels", {}).get("genrm.io/published") == "true"),
            ))

    def empty_while_healthy(self, victim: str) -> list[tuple[float, float]]:
        """Each stretch (start, seconds) with no ready endpoint while ``victim`` could serve."""
        stretches: list[tuple[float, float]] = []
        start: float | None = None
        for sample in self.samples:
            empty = not sample.ready and victim in sample.healthy
            if empty and start is None:
                start = sample.at
            elif not empty and start is not None:
                stretches.append((start, sample.at - start))
                start = None
        if start is not None:
            stretches.append((start, self.samples[-1].at - start))
        return stretches

    def published_at(self, pod: str, at: float) -> bool | None:
        """Whether ``pod`` was published at the last reading before ``at``."""
        return next((pod in s.published for s in reversed(self.samples) if s.at <= at), None)


def healthy(pod: dict[str, Any]) -> bool:
    """A pod that could serve: not being deleted, every container running, none restarted."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in c["state"] and c.get("restartCount", 0) == 0 for c in statuses)


def sidecar_state(ip: str, token: str) -> dict[str, Any]:
    """The gateway's own report (GET /v1/state on the control port); empty when it cannot be read."""
    try:
        response = httpx.get(f"http://{ip}:{CONTROL_PORT}/v1/state", headers={"Authorization": f"Bearer {token}"},
                             timeout=1.0)
    except httpx.HTTPError:
        return {}
    return dict(response.json()) if response.status_code == 200 else {}


def test_a_survivor_crash_right_after_the_victim_is_chosen_keeps_the_service_serving(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        POOL, namespace, replicas=2, drain={"propagationSeconds": 2, "quietSeconds": 1, "timeoutSeconds": 60}))
    cluster.wait_serving(namespace, POOL, 2)
    secret = json.loads(cluster.kubectl("get", "secret", secret_name(POOL), "-n", namespace, "-o", "json"))
    token = base64.b64decode(secret["data"][TOKEN_KEY]).decode()
    with cluster.plain_clients(namespace, POOL) as plain, EndpointMonitor(cluster, namespace) as monitor:
        wait_for("every plain client served", lambda: plain.ok_everywhere(5))
        cluster.scale(namespace, POOL, 1)

        def chosen() -> str | None:
            victims = ((cluster.pool(namespace, POOL).get("status") or {}).get("operation") or {}).get("victims")
            return str(victims[0]["name"]) if victims else None
        victim = wait_for("the victim chosen", chosen, timeout=30, interval=0.05)
        [survivor] = [p for p in cluster.pods(namespace, POOL) if p["metadata"]["name"] != victim]
        pid, ip = engine_pid(survivor), survivor["status"]["podIP"]
        assert pid is not None, survivor["status"]
        before = sidecar_state(ip, token)
        os.kill(pid, signal.SIGKILL)  # the local node agent restarts the container, as a kubelet does
        killed_at = time.monotonic()
        after = sidecar_state(ip, token)
        wait_for("the rescue event", lambda: any(
            reason in cluster.kubectl("get", "events", "-n", namespace, "-o", "jsonpath={.items[*].reason}")
            for reason in RESCUE_EVENTS), timeout=60)
        cluster.wait_serving(namespace, POOL, 1, timeout=180)
        time.sleep(1)
    account_plain(plain)

    # At most in flight at the kill: admitted by just after it, less completed by just before it.
    held = max(int(before.get("inflight", 0)),
               int(after.get("admittedTotal", 0)) - int(before.get("completedTotal", 0)))
    published_at_kill = monitor.published_at(victim, killed_at)
    empty = monitor.empty_while_healthy(victim)
    longest = max((seconds for _, seconds in empty), default=0.0)
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "jsonpath={.items[*].reason}").split()
    print(f"rescue: victim {victim} published at the kill: {published_at_kill}; "
          f"{[r for r in events if r in RESCUE_EVENTS]}; empty-Service moments while it could serve "
          f"(s after the kill, length): {[(round(t - killed_at, 2), round(n, 2)) for t, n in empty]}; "
          f"in flight on the killed engine at most {held}; plain-client failures {plain.stats.failed} of "
          f"{plain.stats.total_sent}", flush=True)
    assert longest <= RESCUE_SECONDS, f"the Service had no ready endpoint for {longest:.1f}s while {victim} could serve"
    if published_at_kill:
        assert not empty, "a victim still published at the kill must stay in the Service"
    died = [f for f in plain.stats.failures if ENGINE_DIED in f.text]
    other = [f for f in plain.stats.failures if ENGINE_DIED not in f.text]
    assert not other, "only requests in flight on the killed engine may fail; " + plain_report(plain)
    assert len(died) <= held, f"{len(died)} requests died with the engine, which held at most {held}"
    assert plain.stats.total_sent > 50


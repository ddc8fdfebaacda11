"""Scale to zero and back through the activator, with unmodified clients on the pool's ClusterIP.

Aspects: the chart's activator (two pods) holds what arrives while a ``scaleToZero`` pool has no
serving replica, wakes the pool at once and forwards the held requests to its first replica; the
keep-alive mix a trainer runs (``httpx``, ``requests``, ``aiohttp``, ``openai`` at their defaults)
loses nothing when it starts sending just as the idle pool's last replica drains (1 -> 0 meeting
0 -> 1) nor when it starts on a pool fully at zero; the ``openai`` client's retries are counted and
must be 0, so no retry is what saved a request; once a replica serves, the activator's slice leaves
the Service (no extra hop).
"""

from __future__ import annotations

import time
from typing import Any

from .harness import TALLY, Cluster, pool_manifest, served_model, wait_for
from .spread import KeepAliveClients

MIX = {"httpx": 2, "requests": 2, "aiohttp": 2, "openai": 2}
AUTOSCALING: dict[str, Any] = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 2, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "50"}}],
    "scaleToZero": {"idleSeconds": 30},
}


def _replicas(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.pool(namespace, name)["spec"]["replicas"])


def _activator_slice(cluster: Cluster, namespace: str, name: str) -> bool:
    found = cluster.kubectl("get", "endpointslices", "-n", namespace, "-o", "name", check=False)
    return f"endpointslice.discovery.k8s.io/{name}-activator" in found.split()


def _send_until_each_kind_answered(clients: KeepAliveClients, at_least: int, timeout: float) -> float:
    started = time.monotonic()
    wait_for(f"every client kind answered {at_least} times", lambda: clients.ok_everywhere(at_least), timeout)
    return time.monotonic() - started


def _check(clients: KeepAliveClients) -> None:
    TALLY.plain_requests += clients.stats.sent
    TALLY.plain_failed += len(clients.stats.failures)
    assert not clients.stats.failures, [str(f) for f in clients.stats.failures[:10]]
    assert clients.openai_retries == 0, "an openai retry, not the pool, saved a request"


def test_clients_lose_nothing_across_one_to_zero_and_zero_to_one(cluster: Cluster, namespace: str) -> None:
    name = "zero"
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1, autoscaling=AUTOSCALING))
    pool = cluster.wait_serving(namespace, name, 1)
    url = cluster.service_url(namespace, name)
    model = served_model(pool)
    with KeepAliveClients(url, model, mix=MIX) as warm:
        _send_until_each_kind_answered(warm, 3, 60)
    _check(warm)
    assert not _activator_slice(cluster, namespace, name), "a serving pool's Service has no extra hop"

    # 1 -> 0 meets 0 -> 1: the clients start as soon as the idle pool is told to go to zero.
    wait_for("the idle pool to be told to go to zero", lambda: _replicas(cluster, namespace, name) == 0, 90)
    with KeepAliveClients(url, model, mix=MIX) as draining:
        during = _send_until_each_kind_answered(draining, 3, 90)
    _check(draining)
    assert _replicas(cluster, namespace, name) >= 1, "held requests woke the pool"

    # From zero, cold: every replica gone, the Service pointing at the activator alone.
    wait_for("the pool to be told to go to zero again", lambda: _replicas(cluster, namespace, name) == 0, 120)
    wait_for("its last pod to go", lambda: not cluster.pods(namespace, name), 90)
    assert _activator_slice(cluster, namespace, name), "at zero the Service points at the activator"
    woke = time.monotonic()
    with KeepAliveClients(url, model, mix=MIX) as cold:
        first = _send_until_each_kind_answered(cold, 1, 90)
        _send_until_each_kind_answered(cold, 3, 60)
    _check(cold)
    cluster.wait_serving(namespace, name, 1, timeout=60)
    wait_for("the activator to leave the Service", lambda: not _activator_slice(cluster, namespace, name), 30)
    held = cluster.pool(namespace, name)["status"]["autoscaler"]["decisions"]
    assert any(d.get("limitedBy") == "HeldRequests" for d in held), held
    sent = warm.stats.sent + draining.stats.sent + cold.stats.sent
    print(f"\nscale-to-zero-e2e: during_drain_s={during:.1f} cold_every_kind_first_s={first:.1f} "
          f"wake_to_serving_s={time.monotonic() - woke:.1f} requests={sent} failed=0 openai_retries=0")

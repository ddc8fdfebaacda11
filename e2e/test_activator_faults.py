"""The chart's activator under faults: one of its two pods stops while it holds requests for a pool
at zero, with unmodified clients (`httpx`, `requests`) on the pool's ClusterIP.

Aspects: a pod deleted (`kubectl delete pod`: SIGTERM) while it holds requests loses nothing, nor
do the requests sent while the pool's Service may still route to it; a pod killed (SIGKILL) loses
only what it held, each of those clients gets a connection error within `KILLED_FAIL_SECONDS`
(never a hang), and the requests the other pod held are answered. The woken replica starts slowly
(`STARTUP_SECONDS`), so the requests stay held while the fault happens. Both tests wait for the
activators to be back (two ready pods, known to the operator) before they end: the suite shares them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import requests

from .harness import Cluster, pool_manifest, wait_for
from .plainclients import httpx_generate, requests_generate

STARTUP_SECONDS = 15
"""The simulator's start-up in these pools: longer than the fault and the checks that follow it."""
AUTOSCALING: dict[str, Any] = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 1, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "50"}}],
    "scaleToZero": {"idleSeconds": 300, "holdTimeoutSeconds": 120},
}
KILLED_FAIL_SECONDS = 3.0
"""A killed activator's held clients learn it within this long: the kernel closes their connections."""
ACTIVATOR_NAMESPACE = "genrm-system"
ACTIVATOR_LABEL = "app.kubernetes.io/component=activator"
ACTIVATOR_CONTROL_PORT = 8001


@dataclass
class Outcome:
    """One client's request: when it was sent and ended, and its failure (None: answered 2xx)."""

    started: float
    ended: float
    failure: str | None


class HeldClients:
    """One request per thread, alternating `httpx` and `requests` (each its own connection), sent at
    once to the pool's Service; `join` returns the outcomes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: list[Outcome] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, count: int) -> None:
        for _ in range(count):
            kind = ("httpx", "requests")[len(self._threads) % 2]
            self._threads.append(threading.Thread(target=self._one, args=(kind,), daemon=True))
            self._threads[-1].start()

    def join(self) -> list[Outcome]:
        for thread in self._threads:
            thread.join(timeout=180)
        return self.outcomes

    def _one(self, kind: str) -> None:
        body: dict[str, object] = {"text": f"held {kind}", "sampling_params": {"max_new_tokens": 4}}
        started = time.monotonic()
        if kind == "httpx":
            with httpx.Client(timeout=150.0) as client:
                failure = httpx_generate(client, self.url, body)[0]
        else:
            with requests.Session() as session:
                failure = requests_generate(session, self.url, body, timeout=150.0)[0]
        with self._lock:
            self.outcomes.append(Outcome(started, time.monotonic(), failure))


def _activator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ACTIVATOR_NAMESPACE, "-l", ACTIVATOR_LABEL, "-o", "json")
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def _held(pod: dict[str, Any], token: str) -> int:
    """What one activator pod holds, all pools together (its state on the control port)."""
    answer = httpx.get(f"http://{pod['status']['podIP']}:{ACTIVATOR_CONTROL_PORT}/v1/state",
                       headers={"Authorization": f"Bearer {token}"}, timeout=2.0)
    return sum(answer.json()["held"].values())


def _holding(cluster: Cluster, token: str, total: int) -> dict[str, tuple[dict[str, Any], int]] | None:
    """Activator pod name -> (pod, held), once they hold ``total`` requests together."""
    found = {p["metadata"]["name"]: (p, _held(p, token)) for p in _activator_pods(cluster)}
    return found if sum(n for _, n in found.values()) == total else None


def _at_zero(cluster: Cluster, namespace: str, name: str) -> str:
    """A pool created at zero, its Service pointing at the activators (connections accepted); its URL."""
    engine = {"extraArgs": ["--sim-startup-seconds", str(STARTUP_SECONDS), "--sim-ttft-ms", "5", "--sim-itl-ms", "1"]}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=0, autoscaling=AUTOSCALING,
                                                          engine=engine))
    wait_for("the pool's Service", lambda: f"service/{name}" in cluster.kubectl(
        "get", "services", "-n", namespace, "-o", "name").split(), 60, interval=0.3)
    url = cluster.service_url(namespace, name)
    address, port = url.removeprefix("http://").split(":")
    # A connection without a request: kube-proxy sends it to an activator, and nothing wakes the pool.
    wait_for("the Service to take connections at zero",
             lambda: socket.create_connection((address, int(port)), timeout=2).close() is None, 60, interval=0.3)
    assert int(cluster.pool(namespace, name)["spec"]["replicas"]) == 0
    return url


def _activators_back(cluster: Cluster, token: str) -> None:
    """Two ready activator pods again, each answering its control port (the suite shares them)."""
    def ready() -> bool:
        pods = _activator_pods(cluster)
        return len(pods) == 2 and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            and _held(p, token) == 0 for p in pods)
    wait_for("two ready activators", ready, 120, interval=0.5)


def test_a_deleted_activator_loses_nothing_it_holds_nor_what_is_sent_meanwhile(
        cluster: Cluster, namespace: str, activator: tuple[str, str]) -> None:
    token = activator[1]
    url = _at_zero(cluster, namespace, "stop")
    clients = HeldClients(url)
    clients.send(6)
    holding = wait_for("the activators to hold 6 requests", lambda: _holding(cluster, token, 6), 60, interval=0.2)
    victim, held = max(holding.items(), key=lambda item: item[1][1])
    assert held[1] >= 1
    cluster.kubectl("delete", "pod", victim, "-n", ACTIVATOR_NAMESPACE, "--wait=false")
    deleted = time.monotonic()
    while time.monotonic() < deleted + 4:  # while the Service may still route to the deleted pod
        clients.send(1)
        time.sleep(0.5)
    outcomes = clients.join()
    failed = [o.failure for o in outcomes if o.failure is not None]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed (the deleted pod held {held[1]}): {failed}"
    assert len(outcomes) >= 12
    _activators_back(cluster, token)
    print(f"\nactivator-sigterm-e2e: held_by_deleted={held[1]} requests={len(outcomes)} failed=0")


def test_a_killed_activator_loses_only_what_it_held_and_its_clients_learn_it_at_once(
        cluster: Cluster, namespace: str, activator: tuple[str, str]) -> None:
    token = activator[1]
    url = _at_zero(cluster, namespace, "kill")
    clients = HeldClients(url)
    clients.send(8)
    holding = wait_for("the activators to hold 8 requests", lambda: _holding(cluster, token, 8), 60, interval=0.2)
    victim, (pod, held) = max(holding.items(), key=lambda item: item[1][1])
    container = pod["status"]["containerStatuses"][0]
    killed = time.monotonic()
    os.kill(int(container["containerID"].removeprefix("genrm://")), signal.SIGKILL)
    outcomes = clients.join()
    failed = [o for o in outcomes if o.failure is not None]
    assert len(failed) == held, (f"{victim} held {held} of 8; failed: {[o.failure for o in failed]}")
    slow = [(round(o.ended - killed, 1), o.failure) for o in failed if o.ended - killed > KILLED_FAIL_SECONDS]
    assert not slow, f"clients of the killed activator waited past {KILLED_FAIL_SECONDS}s: {slow}"
    assert all(o.started < killed for o in failed)
    _activators_back(cluster, token)
    print(f"\nactivator-sigkill-e2e: held_by_killed={held} of=8 failed={len(failed)} "
          f"slowest_fail_s={max((o.ended - killed for o in failed), default=0.0):.2f}")

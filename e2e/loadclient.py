"""A load client that behaves like a pool's clients in an RL training loop.

It follows the pool's published endpoints as kube-proxy would (the
EndpointSlices of the pool's Service, refreshed about every second), sends
continuous judge requests from a few concurrent workers, and retries a
``503 draining`` refusal once on another replica: the client half of the drain
contract. Every request that does not end in a 2xx counts as failed.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
from kubernetes import client

from .plainclients import Failure

REFRESH_SECONDS = 1.0


@dataclass
class LoadStats:
    """Outcome counters, safe to read while the client runs."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    retried: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)


class LoadClient:
    """Background load against one pool, started and stopped by the tests."""

    def __init__(self, api: client.ApiClient, namespace: str, service: str, workers: int = 4,
                 max_new_tokens: int = 16) -> None:
        self.discovery = client.DiscoveryV1Api(api)
        self.namespace, self.service = namespace, service
        self.workers, self.max_new_tokens = workers, max_new_tokens
        self.stats = LoadStats()
        self._endpoints: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count()

    def __enter__(self) -> LoadClient:
        self.refresh()
        self._threads = [threading.Thread(target=self._refresher, daemon=True)]
        self._threads += [threading.Thread(target=self._worker, daemon=True) for _ in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._endpoints)

    def refresh(self) -> None:
        """Ready addresses of the Service's EndpointSlices (what kube-proxy would program)."""
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}")
        found: list[str] = []
        for s in slices.items:
            port = next((p.port for p in s.ports or [] if p.port), None)
            for ep in s.endpoints or []:
                if port and (ep.conditions is None or ep.conditions.ready is not False):
                    found += [f"http://{addr}:{port}" for addr in ep.addresses]
        with self._lock:
            self._endpoints = sorted(found)

    def _refresher(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            try:
                self.refresh()
            except Exception:  # a failed refresh keeps the last view, as kube-proxy does
                pass

    def _worker(self) -> None:
        with httpx.Client(timeout=30.0) as http:
            while not self._stop.is_set():
                targets = self.endpoints()
                if not targets:
                    time.sleep(0.1)
                    continue
                self._one(http, targets)

    def _one(self, http: httpx.Client, targets: list[str]) -> None:
        rid = f"load-{next(self._ids)}"
        first = random.choice(targets)
        payload = {"text": f"Judge answer {rid}: is 2+2=4?",
                   "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0}}
        with self._lock:
            self.stats.sent += 1
        started, target = time.monotonic(), first
        outcome = self._send(http, target, payload, rid)
        if outcome == "draining":
            target = random.choice([t for t in targets if t != first] or targets)
            with self._lock:
                self.stats.retried += 1
            outcome = self._send(http, target, payload, rid)
        with self._lock:
            if outcome == "ok":
                self.stats.ok += 1
            else:
                self.stats.failed += 1
                self.stats.failures.append(Failure(started, time.monotonic(), "load", f"{rid}: {outcome}",
                                                   target.removeprefix("http://")))

    def _send(self, http: httpx.Client, base: str, payload: dict[str, object], rid: str) -> str:
        try:
            response = http.post(f"{base}/generate", json=payload, headers={"X-Request-Id": rid})
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status_code == 503 and response.headers.get("X-GenRM-Reason") == "draining":
            return "draining"
        if 200 <= response.status_code < 300:
            with self._lock:
                self.stats.by_endpoint[base] = self.stats.by_endpoint.get(base, 0) + 1
            return "ok"
        return f"HTTP {response.status_code}: {response.text[:200]}"

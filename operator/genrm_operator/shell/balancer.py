"""The load-spread loop of one pool: sample the published replicas, decide (pure core), ask for sheds.

Why a loop of its own beside the reconciler: balancing writes nothing to the API server and acts
only on sidecars, at its own cadence; it must not make reconcile steps (and status writes) more
frequent. It is idle, costing nothing, while fewer than two replicas are published or no published
replica reports a client (the long polls say so: the contract counts "has clients" as significant);
otherwise it reads every published replica's state once per round. A round with any replica
unanswered decides nothing: a fair share computed without one replica's connections would shed
from the others wrongly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping

from genrm_contract.sidecar import DrainState, ShedRequest, StateDocument

from ..core.balance import Memory, Sample, Traffic, decide
from . import metrics
from .sidecar import Endpoint, SidecarClient

log = logging.getLogger(__name__)
FAST_SECONDS = 1.0
"""Between rounds for a while after the published set changed: a scale-out should reach clients within seconds."""
STEADY_SECONDS = 2.0
"""Between rounds otherwise (the load rule holds skew for 10 s before acting)."""
FAST_FOR_SECONDS = 30.0


def traffic(document: StateDocument) -> Traffic | None:
    """What the load-spread rules read of a report, or None when the replica cannot take part: not
    serving, its engine down or unhealthy (the replica is then unready, so kube-proxy places no new
    connection on it, and counting it in the fair share would make the others shed for ever), or a
    gateway that does not count connections."""
    if (document.state is not DrainState.SERVING or not document.engine.healthy
            or document.client_connections is None):
        return None
    return Traffic(document.client_connections, document.admitted_total, document.boot_id, document.handing_back)


class PoolBalancer:
    """Keeps one pool's client connections (and so its requests) spread over its published replicas."""

    def __init__(self, sidecars: SidecarClient, namespace: str, name: str) -> None:
        self.sidecars, self.namespace, self.name = sidecars, namespace, name
        self._published: dict[str, Endpoint] = {}
        self._has_clients = False
        self._changed_at = -FAST_FOR_SECONDS
        self._memory = Memory()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def follow(self, published: Mapping[str, Endpoint], reports: Mapping[str, StateDocument]) -> None:
        """The pool's published replicas and their latest long-poll reports (each reconcile step)."""
        if dict(published) != self._published:
            self._published = dict(published)
            self._changed_at = time.monotonic()
            self._memory = Memory()  # rates across a changed set compare different pools
            self._wake.set()
        has_clients = any(bool(reports[n].client_connections) for n in published if n in reports)
        if has_clients != self._has_clients:
            self._has_clients = has_clients
            self._wake.set()
        if self._task is None and self.active:
            self._task = asyncio.create_task(self._run(), name=f"balance {self.namespace}/{self.name}")

    @property
    def active(self) -> bool:
        return len(self._published) > 1 and self._has_clients

    async def _run(self) -> None:
        while True:
            if not self.active:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self.round()
            except Exception:  # a bug here must not stop balancing for good; the next round retries
                log.exception("balancing %s/%s failed", self.namespace, self.name)
            fast = time.monotonic() - self._changed_at < FAST_FOR_SECONDS
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FAST_SECONDS if fast else STEADY_SECONDS)

    async def round(self) -> None:
        """Sample every published replica, decide, and send the sheds decided."""
        published = dict(self._published)
        documents = await asyncio.gather(*(self.sidecars.state(ep) for ep in published.values()))
        if published != self._published or any(d is None for d in documents):
            return
        replicas = {name: t for name, d in zip(published, documents, strict=True)
                    if d is not None and (t := traffic(d)) is not None}
        if len(replicas) < 2:
            return
        sheds, self._memory = decide(Sample(time.monotonic(), replicas), self._memory)
        if sheds:
            log.info("balancing %s/%s: connections %s; shedding %s", self.namespace, self.name,
                     {n: t.connections for n, t in sorted(replicas.items())},
                     ", ".join(f"{s.connections} from {s.name} ({s.reason.value})" for s in sheds))
        for shed in sheds:
            request = ShedRequest(shed_id=uuid.uuid4().hex, connections=shed.connections, reason=shed.reason)
            answer = await self.sidecars.shed(published[shed.name], request)
            if answer is not None:
                metrics.CONNECTIONS_SHED.labels(self.namespace, self.name, shed.reason.value).inc(answer.marked)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

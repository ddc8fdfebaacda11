"""Each replica's sidecar state, kept current by one long poll per replica.

Why not ask every sidecar at every step: a step's cost then grew with the pool's replicas, and a
replica that drained waited for the next resync to be noticed. Here one ``GET /v1/state`` per
replica stays open until the sidecar's state version changes (see the contract's
``VERSION_PARAM``), the answer wakes the pool's reconciler, and a step only reads the latest
reports. What the core is told stays as strict as before: a replica never answered, or whose poll
failed, is unknown (``None``), never drained; a new replica's first report is awaited by the step
that first sees it; the drain calls' own answers count as reports too (so a step after an undrain
cannot act on the drain it undid), and a report never replaces a newer one of the same gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from genrm_contract.sidecar import StateDocument

from ..core.model import SidecarView
from .sidecar import STATE_SECONDS, Endpoint, SidecarClient, view_of

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0
"""How long one poll waits for a change (the gateway allows up to the contract's MAX_WAIT_SECONDS)."""
RETRY_SECONDS = (0.25, 5.0)
"""Backoff after a failed poll: first delay, and the most."""
POLL_SECONDS = 1.0
"""Between polls of a gateway that answers without versions (older than the long poll)."""


@dataclass
class _Followed:
    endpoint: Endpoint
    task: asyncio.Task[None] | None = None
    document: StateDocument | None = None
    received_at: float = 0.0
    """When ``document`` arrived (seconds since the epoch): its idle time counts from then."""
    view: SidecarView | None = None
    """The core's view of ``document``, made once per report rather than at every step of the pool."""
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the first poll finished (with a report or a failure)."""


class SidecarWatch:
    """The latest report of each replica of one pool."""

    def __init__(self, client: SidecarClient, on_change: Callable[[], None]) -> None:
        self._client, self._on_change = client, on_change
        self._followed: dict[str, _Followed] = {}

    async def views(self, endpoints: Mapping[str, Endpoint]) -> dict[str, SidecarView | None]:
        """Follow exactly ``endpoints`` (replica name -> where its sidecar is) and return their latest
        views; a replica seen for the first time is asked at once and its answer awaited."""
        for name in [n for n, f in self._followed.items() if endpoints.get(n) != f.endpoint]:
            self._stop(name)
        for name, endpoint in endpoints.items():
            if name not in self._followed:
                followed = self._followed[name] = _Followed(endpoint)
                followed.task = asyncio.create_task(self._follow(name, followed), name=f"sidecar-watch {name}")
        fresh = [f.answered.wait() for f in self._followed.values() if not f.answered.is_set()]
        if fresh:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*fresh), STATE_SECONDS + 1.0)
        return {name: f.view for name, f in self._followed.items()}

    def documents(self) -> dict[str, StateDocument]:
        """The latest report of each followed replica that has answered."""
        return {name: f.document for name, f in self._followed.items() if f.document is not None}

    def offer(self, name: str, document: StateDocument) -> None:
        """A report from elsewhere (a drain call's answer) about a followed replica."""
        if (followed := self._followed.get(name)) is not None:
            self._take(followed, document)

    def _take(self, followed: _Followed, document: StateDocument | None) -> None:
        """Keep ``document`` unless it is older than the one kept; wake the reconciler when what the core
        decides on changed (not for load figures alone)."""
        old = followed.document
        if document is not None and not document.newer_than(old):
            return
        followed.document, followed.received_at = document, time.time()
        followed.view = view_of(document, followed.received_at) if document is not None else None
        if (old is None) != (document is None) or (
                old is not None and document is not None and old.significant() != document.significant()):
            self._on_change()

    async def _follow(self, name: str, followed: _Followed) -> None:
        failures = 0
        while True:
            known = followed.document
            version = known.version if known is not None else None
            document = await self._client.state(followed.endpoint, version, WAIT_SECONDS)
            self._take(followed, document)
            followed.answered.set()
            if document is None:
                failures += 1
                await asyncio.sleep(min(RETRY_SECONDS[1], RETRY_SECONDS[0] * 2 ** (failures - 1)))
                continue
            failures = 0
            if document.version is None:
                await asyncio.sleep(POLL_SECONDS)

    def _stop(self, name: str) -> None:
        followed = self._followed.pop(name)
        if followed.task is not None:
            followed.task.cancel()

    async def close(self) -> None:
        tasks = [f.task for f in self._followed.values() if f.task is not None]
        self._followed.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

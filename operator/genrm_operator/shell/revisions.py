"""Telling each gateway of one pool the pool's judge revisions (`core.judgeswitch.told_revisions`
decides, `genrm_contract.revisions` says how).

Why: a client reads which revision is active and which is preview from any replica (``GET
/v1/genrm/revision``), and a gateway names the active one in its refusals; only the operator knows
them. A gateway is told again when the revisions change and when it restarts (a new ``bootId``: a
restarted gateway knows none). A push that fails is tried again at the pool's next step; one at a
time per gateway. Each push replaces the last, and the pool's one writer pushes in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from genrm_contract.revisions import RevisionsDocument
from genrm_contract.sidecar import StateDocument

from .peers import cancel_all
from .sidecar import Endpoint, SidecarClient


class RevisionTeller:
    """What every gateway of one pool was told of its revisions, and the pushes under way."""

    def __init__(self, sidecars: SidecarClient) -> None:
        self.sidecars = sidecars
        self._told: dict[str, tuple[str | None, RevisionsDocument]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def follow(self, revisions: tuple[str, str | None] | None, endpoints: Mapping[str, Endpoint],
               reports: Mapping[str, StateDocument]) -> None:
        """Each step: the pool's (active, preview) revisions, where each sidecar is, and its latest report."""
        for name in set(self._told) - set(endpoints):
            del self._told[name]
        if revisions is None:
            return
        document = RevisionsDocument(active=revisions[0], preview=revisions[1])
        for name, endpoint in endpoints.items():
            want = (reports[name].boot_id if name in reports else None, document)
            if self._told.get(name) != want and name not in self._tasks:
                self._tasks[name] = asyncio.create_task(self._tell(name, endpoint, want), name=f"revisions {name}")

    async def _tell(self, name: str, endpoint: Endpoint, want: tuple[str | None, RevisionsDocument]) -> None:
        try:
            if await self.sidecars.revisions(endpoint, want[1]):
                self._told[name] = want
        finally:
            self._tasks.pop(name, None)

    async def close(self) -> None:
        await cancel_all(self._tasks.values())

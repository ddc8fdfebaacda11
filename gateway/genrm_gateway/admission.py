"""Exact in-flight accounting: the proof a drained replica can be deleted.

Why synchronous: the state check and the increment happen in one call with no ``await`` between
them, so on a single event loop no request can slip in after the fence and go uncounted.
"""

from __future__ import annotations

import asyncio
import time


class Admission:
    """Counts requests from admission until their last response byte has been sent."""

    __slots__ = ("_idle", "admitted_total", "completed_total", "idle_since", "inflight", "open",
                 "refused_total")

    def __init__(self) -> None:
        self.open = True
        self.inflight = 0
        self.admitted_total = 0
        self.completed_total = 0
        self.refused_total = 0
        self.idle_since: float | None = time.monotonic()
        self._idle = asyncio.Event()
        self._idle.set()

    def try_admit(self) -> bool:
        """Admit unless fenced; a refusal is counted and must be answered without engine work."""
        if not self.open:
            self.refused_total += 1
            return False
        self.inflight += 1
        self.admitted_total += 1
        self.idle_since = None
        self._idle.clear()
        return True

    def admit_handover(self) -> None:
        """Count a request this fenced replica hands to the pool's new judge (a judge switch): it is
        in flight here until its answer is written, so the replica is not Drained under it."""
        self.inflight += 1
        self.admitted_total += 1
        self.idle_since = None
        self._idle.clear()

    def release(self) -> None:
        """Called once per admitted request, after its last byte (or its abort) is done."""
        self.inflight -= 1
        self.completed_total += 1
        if self.inflight == 0:
            self.idle_since = time.monotonic()
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

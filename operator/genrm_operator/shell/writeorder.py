"""Decisions first: the operator's pool status writes, in the order the slowest pool needs.

In a scale storm every pool waits for the API server: its scale request, then its decision write,
then its create (docs/performance.md, the tenth round). A pool that has acted goes on writing status
(a create seen, the move to Verifying, the end), and every one of those writes, as costly to the API
server as a decision, is served beside the decisions of the pools still waiting for theirs. So a write
that only records waits while any write that gates actions (a decision the pod creates, deletes and
unpublishes wait for: `core.model.deliver`) is in flight or was in the last `QUIET_SECONDS`, and never
longer than `HOLD_SECONDS`: the record is late by at most that, never lost, and no write waits for a
storm that does not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

QUIET_SECONDS = 0.25
"""How long after the last gating write the storm counts as over: decisions arrive staggered (each pool's
scale reaches the operator when the watch delivers it), and a gap this short is not the end of them."""
HOLD_SECONDS = 1.5
"""The longest a recording write waits: about a storm's decision path on this machine's API server."""


class WriteOrder:
    """One per operator: `gating` wraps a write that actions wait for, `recording` comes before any other."""

    def __init__(self, quiet_seconds: float = QUIET_SECONDS, hold_seconds: float = HOLD_SECONDS) -> None:
        self.quiet_seconds, self.hold_seconds = quiet_seconds, hold_seconds
        self._in_flight = 0
        self._last_done = -float("inf")
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def gating(self) -> AsyncIterator[None]:
        """Around a write that actions wait for: it goes at once, and holds recording writes back."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._last_done = time.monotonic()
            async with self._changed:
                self._changed.notify_all()

    def _quiet_in(self) -> float:
        """Seconds until no gating write holds recording writes back (0: none does now)."""
        if self._in_flight:
            return self.quiet_seconds
        return max(0.0, self._last_done + self.quiet_seconds - time.monotonic())

    async def recording(self) -> None:
        """Wait until no gating write is in flight or recent, at most `hold_seconds`."""
        deadline = time.monotonic() + self.hold_seconds
        while (wait := min(self._quiet_in(), deadline - time.monotonic())) > 0:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)

"""Telling each gateway of one pool its peers (`core.peers` decides, `genrm_contract.peers` says how).

Why a task per replica beside the reconciler: a push is a call to one sidecar that decides nothing
and writes nothing to the API server; a step only says what each gateway should hold. A gateway is
told again when its list changes and when it restarts (a new ``bootId`` in its reports: a restarted
gateway holds no peers), and retried while it does not answer (a gateway without the route, older
than peers, is not asked again until one of those changes); the document's version grows with
every push (the wall clock in microseconds, strictly increasing within this process), so of two
pushes that cross, or a push of an operator before a restart and one after, the gateway keeps the
newer. Versions stop at the contract's ``MAX_VERSION``, which a gateway holding it still takes (a
push as new as the one held replaces it), so a version told by anyone can always be outranked.

Why a backoff, both after a failed push and after finding a newer push held: a gateway that does
not answer is asked less and less often rather than every second for ever, and two operators that
each outrank the other's push (one of them about to stop) do not bid as fast as round trips allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from genrm_contract.peers import MAX_VERSION, PeersDocument
from genrm_contract.sidecar import StateDocument

from .sidecar import Endpoint, PeersUnknown, SidecarClient

log = logging.getLogger(__name__)
RETRY_SECONDS = (0.25, 5.0)
"""Backoff between pushes to one gateway that failed or found a newer push: first delay, and the most."""
SETTLE_SECONDS = 1.0
"""How long a gateway's changed list waits before it is pushed (a first list, one for a restarted
gateway, and one replaced whole, as a judge switch replaces the previous revision's, go at once).
One publish or unpublish changes the list of every replica of the pool, and a scale-out changes it
twice within a second or two (the new replica starting, then published): the pushes of a scale storm
took as much of the operator's CPU as its reconcile steps, at the moment the steps were deciding
(figures: docs/performance.md#measurements-behind-the-code). Waiting pushes the list as it stands a
second later, once. A gateway holds its previous list meanwhile: a peer gone since refuses at once
or does not connect, and is passed over for the next (`FORWARD_TRIES`), and a new peer is offered a
second later."""


@dataclass(frozen=True)
class _Want:
    endpoint: Endpoint
    boot_id: str | None
    peers: tuple[str, ...]


class PeerPusher:
    """What every gateway of one pool should hold, and the pushes that get it there."""

    def __init__(self, sidecars: SidecarClient) -> None:
        self.sidecars = sidecars
        self._wanted: dict[str, _Want] = {}
        self._told: dict[str, _Want] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._version = 0

    def follow(self, lists: Mapping[str, tuple[str, ...]], endpoints: Mapping[str, Endpoint],
               reports: Mapping[str, StateDocument]) -> None:
        """Each step: the peers each replica should hold (`core.peers.peer_lists`), where its sidecar
        is, and its latest report (for its boot id)."""
        self._wanted = {name: _Want(endpoints[name], reports[name].boot_id if name in reports else None, peers)
                        for name, peers in lists.items() if name in endpoints}
        for name in set(self._told) - set(self._wanted):
            del self._told[name]
        for name, want in self._wanted.items():
            if self._told.get(name) != want and name not in self._tasks:
                self._tasks[name] = asyncio.create_task(self._tell(name), name=f"peers {name}")

    def _next_version(self) -> int:
        self._version = min(MAX_VERSION, max(self._version + 1, time.time_ns() // 1000))
        return self._version

    async def _tell(self, name: str) -> None:
        """Push until the replica holds what it should (or is no longer followed)."""
        setbacks = 0
        try:
            told, want = self._told.get(name), self._wanted.get(name)
            if told is not None and want is not None and told.boot_id == want.boot_id \
                    and set(told.peers) & set(want.peers):
                await asyncio.sleep(SETTLE_SECONDS)
            while (want := self._wanted.get(name)) is not None and self._told.get(name) != want:
                if setbacks:
                    await asyncio.sleep(min(RETRY_SECONDS[1], RETRY_SECONDS[0] * 2 ** (setbacks - 1)))
                # Unvalidated: the core wrote every address in canonical form (`core.peers`), at most
                # MAX_PEERS of them, and `_next_version` stays within MAX_VERSION; validating them again
                # at every push was a sizeable part of a push's cost in a scale storm.
                document = PeersDocument.model_construct(version=self._next_version(), peers=want.peers)
                try:
                    held = await self.sidecars.peers(want.endpoint, document)
                except PeersUnknown:
                    log.info("gateway %s takes no peers (older than peers): not told again until its "
                             "list changes or it restarts", name)
                    self._told[name] = want
                    break
                if held is not None and held.peers == want.peers:
                    self._told[name], setbacks = want, 0
                    continue
                setbacks += 1
                if held is None and setbacks == 1:  # once per streak: the backoff keeps trying
                    log.info("gateway %s did not take its peers; retrying with backoff", name)
                elif held is not None:  # a newer push (another operator's clock ahead): the next one outranks it
                    self._version = max(self._version, held.version)
        finally:
            self._tasks.pop(name, None)

    async def close(self) -> None:
        await cancel_all(self._tasks.values())


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel per-gateway push tasks and wait for them to end (a pusher's close)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task

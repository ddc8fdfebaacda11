"""The pool's other serving replicas, as the operator last told them (`genrm_contract.peers`).

Why the gateway keeps them: a request that reaches this replica while its engine is down is
answered through one of them instead of being refused (`proxy.Proxy`); the operator pushes the
list, since the gateway has no Kubernetes credentials. Each peer is reached with the gateway's own
engine client (`upstream.EnginePool`): the same checked request writer, response parser, flow
control and timeouts as for the engine, and a connection that fails fast; never with a
key-protected pool's key (the pool's loop tag stands in for it at the peer), so a stale address
taken over by another pod never gets the key.

Why the list expires: it is only as current as the operator who sent it. The operator is in touch
through its control calls (a state poll is always open); when none came for
``PEERS_VALID_SECONDS``, the peers are as none.
"""

from __future__ import annotations

import hmac
import itertools
import time
from typing import Any

from genrm_contract.drained import control_token
from genrm_contract.peers import (
    FORWARD_TRIES,
    LOOP_HEADER,
    LOOPBACK_PEERS,
    PEER_CONNECT_SECONDS,
    PeersDocument,
    forward_tag,
)

from genrm_gateway.config import EngineAddress
from genrm_gateway.upstream import EnginePool

LOOP = LOOP_HEADER.encode()


def _address(peer: str) -> EngineAddress:
    """A validated ``ip:port`` or ``[v6]:port`` as the client's address."""
    host, _, port = peer.rpartition(":")
    return EngineAddress(host.strip("[]"), int(port))


class Peers:
    """The peers document held, a client per peer, and when the operator was last in touch."""

    def __init__(self, valid_seconds: float, loopback: bool = False) -> None:
        self._valid_seconds = valid_seconds
        self.context: dict[str, Any] = {LOOPBACK_PEERS: loopback}
        """The validation context of a pushed document (loopback peers for tests only)."""
        self.document: PeersDocument | None = None
        self._clients: dict[str, EnginePool] = {}
        self._turn = itertools.count()
        self._contact = -float("inf")

    def contact(self) -> None:
        """The operator made an authenticated control call: the peers it told are current again."""
        self._contact = time.monotonic()

    def update(self, document: PeersDocument) -> PeersDocument:
        """Take ``document`` unless the one held is newer; returns the one held after the call."""
        if self.document is not None and document.version < self.document.version:
            return self.document
        self.document = document
        for gone in set(self._clients) - set(document.peers):
            self._clients.pop(gone).close()
        for peer in document.peers:
            if peer not in self._clients:
                self._clients[peer] = EnginePool(_address(peer), None, PEER_CONNECT_SECONDS)
        return document

    @property
    def known(self) -> bool:
        """Whether there are peers to offer a request to: some were told, and the operator that told
        them is still in touch."""
        return bool(self._clients) and time.monotonic() - self._contact < self._valid_seconds

    def offers(self) -> list[tuple[str, EnginePool]]:
        """The peers one request is offered to, in order: at most ``FORWARD_TRIES``, each request
        starting one further along the list, so forwards spread over the peers."""
        peers = self.document.peers if self.document is not None else ()
        if not peers:
            return []
        first = next(self._turn)
        chosen = (peers[(first + i) % len(peers)] for i in range(min(FORWARD_TRIES, len(peers))))
        return [(peer, self._clients[peer]) for peer in chosen]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def pool_token(tag: bytes) -> str | None:
    """The control token, when ``tag`` (a request's ``LOOP_HEADER``) is the pool's tag under it: the
    request then comes from one of the pool's gateways. None otherwise (a client's copy, or a gateway
    holding another token)."""
    token = control_token()
    return token if token is not None and hmac.compare_digest(tag, forward_tag(token).encode()) else None

"""The pool's other serving replicas, as the operator last told them (`genrm_contract.peers`).

Why the gateway keeps them: a request that reaches this replica while its engine is down is
answered through one of them instead of being refused (`proxy.Proxy`); the operator pushes the
list, since the gateway has no Kubernetes credentials. Each peer is reached with the gateway's own
engine client (`upstream.EnginePool`): the same checked request writer, response parser, flow
control and timeouts as for the engine, a connection that fails fast, and for a key-protected pool
the pool's key, which every replica's traffic port demands.
"""

from __future__ import annotations

import itertools

from genrm_contract.peers import FORWARD_TRIES, PEER_CONNECT_SECONDS, PeersDocument

from genrm_gateway.config import EngineAddress
from genrm_gateway.upstream import EnginePool


def _address(peer: str) -> EngineAddress:
    """A validated ``ip:port`` or ``[v6]:port`` as the client's address."""
    host, _, port = peer.rpartition(":")
    return EngineAddress(host.strip("[]"), int(port))


class Peers:
    """The peers document held, and a client per peer."""

    def __init__(self, api_key: str | None) -> None:
        self._api_key = api_key
        self.document: PeersDocument | None = None
        self._clients: dict[str, EnginePool] = {}
        self._turn = itertools.count()

    def update(self, document: PeersDocument) -> PeersDocument:
        """Take ``document`` unless the one held is newer; returns the one held after the call."""
        if self.document is not None and document.version < self.document.version:
            return self.document
        self.document = document
        for gone in set(self._clients) - set(document.peers):
            self._clients.pop(gone).close()
        for peer in document.peers:
            if peer not in self._clients:
                self._clients[peer] = EnginePool(_address(peer), self._api_key, PEER_CONNECT_SECONDS)
        return document

    @property
    def known(self) -> bool:
        return bool(self._clients)

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

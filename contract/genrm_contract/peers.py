"""The operator -> gateway peers contract: which other replicas a gateway may hand a request to.

Why: an engine crash must lose only what was in flight on it. A request that reaches a replica
whose engine is down (crashed, restarting) before kube-proxy has stopped sending it there is not
in flight anywhere yet; the gateway answers it through another serving replica of the pool
instead of refusing it, since unmodified clients (``requests``, ``httpx``) do not retry a 503.
The gateway has no Kubernetes credentials, so the operator, which already follows every gateway
on its control port, tells each one its peers (``POST`` :data:`PEERS_PATH`, a
:class:`PeersDocument`), when they change and when the gateway restarts (a new ``bootId``).

What the gateway does with them (``genrm_gateway.proxy``): forward within its own admission (the
request stays in its in-flight count), mark the answer (:data:`FORWARDED_TO_HEADER`), never send
a request twice unless the peer certainly did not take it (its connection was refused, or it
answered one of :data:`PASS_OVER` before any engine work), and never forward a forwarded request
again (:data:`LOOP_HEADER`). Standard library and pydantic only, like the rest of the contract.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from genrm_contract.sidecar import RefusalReason

PEERS_PATH = "/v1/peers"
"""``POST`` on the control port, with the pool's control token: replace the gateway's peers."""
MAX_PEERS = 16
"""Peers one gateway is told about: a few are enough to find one that serves, and the bound keeps
what a push costs (and what a hostile document could make the gateway hold) small in any pool."""
FORWARD_TRIES = 3
"""Peers one request is offered to at most, each refusing at once or answering."""
PEER_CONNECT_SECONDS = 0.5
"""A peer that does not accept the connection this long is passed over (one hop away, a connection
takes far less; a vanished pod's address may never answer at all)."""

FORWARDED_TO_HEADER = "x-genrm-forwarded-to"
"""On an answer the gateway got from a peer: the peer's address (clients and tests count forwards
by it). Only the gateway sets it; a copy from anywhere upstream is dropped."""
LOOP_HEADER = "x-genrm-forwarded"
"""On a request one gateway forwards to another: the pool's :func:`forward_tag`. A gateway that
receives a request with it never forwards that request again (with its engine down it refuses at
once, so the sender offers it to the next peer). A client's copy, without the tag, means nothing."""

PASS_OVER = frozenset({RefusalReason.DRAINING, RefusalReason.ENGINE_UNAVAILABLE,
                       RefusalReason.TOO_MANY_CONNECTIONS})
"""A peer's ``503`` with one of these reasons came before any engine work (its admission was
closed, its engine unreachable, or its connection limit reached): the request may go to the next
peer. Any other answer is the request's answer."""


class ForwardOutcome(enum.StrEnum):
    """The ``outcome`` label of ``genrm_gateway_forwarded_total``: one count per request that found
    its engine down and had peers."""

    SERVED = "served"
    """A peer answered it (whatever its status: that is the request's answer)."""
    FAILED = "failed"
    """The peer took it and broke before answering: never sent elsewhere (502, 504)."""
    EXHAUSTED = "exhausted"
    """No peer took it (connection refused or timed out, or a refusal in :data:`PASS_OVER`): 503."""


def forward_tag(token: str) -> str:
    """The :data:`LOOP_HEADER` value of a pool: derived from its control token, so a client cannot
    make a gateway take its request for a forwarded one, and the token itself never goes out on the
    traffic port."""
    return hmac.new(token.encode(), b"genrm-forwarded", hashlib.sha256).hexdigest()[:32]


def _address(value: str) -> str:
    """``ip:port`` (``[v6]:port``) in canonical form, or a ValueError.

    Only an IP literal of a unicast host and a port: no names (nothing to resolve), no zone ids,
    no leading zeros or other spellings, no unspecified, multicast, broadcast or reserved address,
    so whoever holds the token cannot make a gateway dial anything odd."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or len(port) > 5 or not 0 < int(port) < 65536 \
            or port != str(int(port)):
        raise ValueError("a peer is ip:port with a port from 1 to 65535")
    bracketed = host.startswith("[") and host.endswith("]")
    literal = host[1:-1] if bracketed else host
    try:
        ip = ipaddress.ip_address(literal)
    except ValueError:
        raise ValueError("a peer's host is an IPv4 or IPv6 literal") from None
    if bracketed != (ip.version == 6) or str(ip) != literal:
        raise ValueError("a peer is written a.b.c.d:port or [v6]:port, in canonical form")
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved or ip.is_link_local:  # 255.255.255.255 is reserved
        raise ValueError("a peer is a unicast host address")
    return value


PeerAddress = Annotated[str, Field(min_length=3, max_length=47), AfterValidator(_address)]
"""A replica's traffic address (``10.1.2.3:8000``, ``[fd00::3]:8000``)."""


def peer_address(ip: str, port: int) -> str:
    """How the operator writes a pod IP and port as a :data:`PeerAddress`."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class PeersDocument(BaseModel):
    """``POST /v1/peers``: the traffic addresses of the pool's other serving replicas.

    Idempotent; versioned so that of two pushes that cross, the older never replaces the newer: the
    gateway keeps a document whose ``version`` is lower than the one it holds, and answers with the
    one it holds (a restarted gateway holds none, and takes any)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    version: int = Field(ge=0, le=2**63 - 1)
    peers: tuple[PeerAddress, ...] = Field((), max_length=MAX_PEERS)
    """In the order the gateway offers them (it starts each request at the next one)."""

    @field_validator("peers")
    @classmethod
    def _distinct(cls, peers: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(peers)) != len(peers):
            raise ValueError("a peer is listed once")
        return peers

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")

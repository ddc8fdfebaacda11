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
answered one of :data:`PASS_OVER` before any engine work), never forward a forwarded request
again (:data:`LOOP_HEADER`), never forward a verification probe (it must be this replica's own
answer), use its peers only while the operator is in touch (:data:`PEERS_VALID_SECONDS`), and pass
on a peer's answer only when the peer proved itself one of the pool's gateways
(:data:`PROOF_HEADER`). Standard library and pydantic only, like the rest of the contract.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from genrm_contract.sidecar import MAX_WAIT_SECONDS, RefusalReason

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

PEERS_VALID_SECONDS = 2 * MAX_WAIT_SECONDS
"""How long a gateway uses its peers after the operator's last authenticated control call (a state
poll, a drain, a peers push, a probe). Why they expire: the list is only as current as the operator
who sent it; with the operator away, a listed peer may be deleted and its IP given to another pod,
which would then get the pool's prompts. The operator keeps a state poll open to every gateway, one
at a time, each asking to wait at most ``MAX_WAIT_SECONDS``: twice that is never reached while the
operator is in touch, and soon after it is not. Expired peers are as none: a request that finds
the engine down is refused at once with the retryable 503."""
MAX_VERSION = 2**63 - 1
"""The highest :class:`PeersDocument` version (a signed 64-bit integer, for any client)."""

FORWARDED_TO_HEADER = "x-genrm-forwarded-to"
"""On an answer the gateway got from a peer: the peer's address (clients and tests count forwards
by it). Only the gateway sets it; a copy from anywhere upstream is dropped."""
LOOP_HEADER = "x-genrm-forwarded"
"""On a request one gateway forwards to another: the pool's :func:`forward_tag`. A gateway never
forwards a request that carries this header, whatever its value, nor lets it wait for its engine
(with its engine down it refuses at once, so the sender offers it to the next peer): two gateways
holding different control tokens (a Secret rotated or re-created while the pods run) cannot tell
each other's tags apart from a client's, and checking the tag would let a request go round between
them for ever. A client that sends it only gives up its own forward. With the right tag, the
header stands in for a key-protected pool's API key (the sending gateway checked its client's), so
a forward never carries the key."""
NONCE_HEADER = "x-genrm-forward-nonce"
"""On a forwarded request: a fresh random value per forward, which the peer's answer must prove."""
PROOF_HEADER = "x-genrm-forward-proof"
"""On a peer gateway's answer to a forward with the pool's tag: :func:`forward_proof` of its nonce.
Why: a peer list can be stale (an IP taken over by another pod); an answer without the proof comes
from no gateway of the pool and never reaches the client (502)."""

PASS_OVER = frozenset({RefusalReason.DRAINING, RefusalReason.JUDGE_SWITCHED, RefusalReason.ENGINE_UNAVAILABLE,
                       RefusalReason.TOO_MANY_CONNECTIONS})
"""A peer's ``503`` with one of these reasons came before any engine work (its admission was
closed, its engine unreachable, or its connection limit reached): the request may go to the next
peer. Any other answer is the request's answer, but for one that names another judge revision than
the forwarding gateway's (`genrm_contract.sidecar.REVISION_HEADER`), which is passed over too."""


class ForwardOutcome(enum.StrEnum):
    """The ``outcome`` label of ``genrm_gateway_forwarded_total``: one count per request that found
    its engine down and had peers."""

    SERVED = "served"
    """A peer answered it (whatever its status: that is the request's answer)."""
    FAILED = "failed"
    """The peer took it and broke before answering: never sent elsewhere (502, 504)."""
    EXHAUSTED = "exhausted"
    """No peer took it (connection refused or timed out, or a refusal in :data:`PASS_OVER`): 503."""
    UNPROVEN = "unproven"
    """A peer answered without the pool's :data:`PROOF_HEADER` (not a gateway of the pool, or one
    holding another control token): its answer was dropped, the client got a 502."""
    CLIENT_GONE = "clientGone"
    """The client left before a peer's answer began: the forward was given up (and any peer's
    connection closed, so it aborts its engine's work)."""


def forward_tag(token: str) -> str:
    """The :data:`LOOP_HEADER` value of a pool: derived from its control token, so a client cannot
    make a gateway take its request for a forwarded one, and the token itself never goes out on the
    traffic port."""
    return hmac.new(token.encode(), b"genrm-forwarded", hashlib.sha256).hexdigest()[:32]


def forward_proof(token: str, nonce: bytes) -> str:
    """The :data:`PROOF_HEADER` value of a peer's answer to a forward with ``nonce``
    (:data:`NONCE_HEADER`): only a holder of the pool's control token can compute it, and a fresh
    nonce per forward keeps an old answer's proof from serving again."""
    return hmac.new(token.encode(), b"genrm-forward-proof\0" + nonce, hashlib.sha256).hexdigest()[:32]


LOOPBACK_PEERS = "loopbackPeers"
"""The validation context key (``PeersDocument.model_validate(..., context={LOOPBACK_PEERS: True})``)
that admits loopback peers: for tests, which run every replica on one host; never in a pod, where a
loopback address is the pod itself."""


def _address(value: str, info: ValidationInfo) -> str:
    return _checked(value, loopback=bool(info.context and info.context.get(LOOPBACK_PEERS)))


def _checked(value: str, loopback: bool) -> str:
    """``ip:port`` (``[v6]:port``) in canonical form, or a ValueError.

    Only an IP literal of a unicast host and a port: no names (nothing to resolve), no zone ids,
    no leading zeros or other spellings, no unspecified, multicast, broadcast, reserved, link-local
    or (unless ``loopback``) loopback address, so whoever holds the token cannot make a gateway
    dial anything odd, nor itself."""
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
    if ip.is_loopback and not loopback:
        raise ValueError("a peer is another pod's address, never a loopback one")
    return value


PeerAddress = Annotated[str, Field(min_length=3, max_length=47), AfterValidator(_address)]
"""A replica's traffic address (``10.1.2.3:8000``, ``[fd00::3]:8000``)."""


def peer_address(ip: str, port: int) -> str:
    """How the operator writes a pod IP and port as a :data:`PeerAddress`: canonical (``FD00:0::1``
    is ``[fd00::1]``), so that one pod has one spelling; a ValueError when it is no valid peer."""
    parsed = ipaddress.ip_address(ip)
    return _checked(f"[{parsed}]:{port}" if parsed.version == 6 else f"{parsed}:{port}", loopback=False)


class PeersDocument(BaseModel):
    """``POST /v1/peers``: the traffic addresses of the pool's other serving replicas.

    Idempotent; versioned so that of two pushes that cross, the older never replaces the newer: the
    gateway keeps a document whose ``version`` is lower than the one it holds, and answers with the
    one it holds (a restarted gateway holds none, and takes any)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    version: int = Field(ge=0, le=MAX_VERSION)
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

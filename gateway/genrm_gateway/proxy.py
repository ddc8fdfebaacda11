"""The proxied hot path: a raw ASGI handler from admission to the last byte.

Why raw ASGI rather than FastAPI routes: on a 2-core pod the gateway's per-request CPU is its
whole overhead, and the routing, dependency and response machinery of a framework costs more
than the proxying itself.

What reaches the engine is the gateway's own request, never the client's bytes: the route's
canonical path (no client target or query), an allowlist of RFC 9110-checked headers (an API key
is the gateway's own, never the client's ``Authorization``), and the JSON body re-serialised with a
request id (``rid``) the gateway minted. The client's id is only a
correlation value, validated and echoed in ``X-Request-Id``; so a client can neither inject a
header or a second request, nor collide with (or abort) another client's request on the engine.

A request that finds the engine down (crashed, restarting) is not in flight anywhere yet: it goes
to a peer replica (`peers`), still counted in this replica's in-flight, unless it carries the loop
header (forwarded here already) or is the operator's verification probe (which must be this
replica's own answer); with no peer to take it, it is refused at once with a retryable 503. What a
peer gets is again the gateway's own request: the route's path, the checked client headers, the
client's validated JSON body (the peer mints its own ``rid``, and aborts it when this gateway
closes the connection because its client left), the pool's loop tag and a fresh nonce, never the
pool's API key; what the client gets back is the peer's answer only when it carries the proof of
that nonce (`genrm_contract.peers.forward_proof`) and names this replica's judge revision.

A request pinned to a judge revision (``x-genrm-revision``, `revisions`) is checked before admission:
another revision's pin is refused there, and a replica fenced by a judge switch refuses a pin to its
own. The pin goes to a peer, which checks it again, and never to the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time

from genrm_contract.drained import control_token
from genrm_contract.peers import (
    FORWARDED_TO_HEADER,
    NONCE_HEADER,
    PASS_OVER,
    PROOF_HEADER,
    ForwardOutcome,
    forward_proof,
    forward_tag,
)
from genrm_contract.sidecar import DRAINING_HEADER as DRAINING
from genrm_contract.sidecar import DrainReason, DrainState, RefusalReason
from starlette.types import Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.body import RequestIds, correlation_id, engine_body
from genrm_gateway.config import Limits
from genrm_gateway.connection import ANSWER_REVISION
from genrm_gateway.drain import DrainController
from genrm_gateway.engine import EngineMonitor
from genrm_gateway.errors import CLOSE_HEADER, REASON_HEADER, Refusal, send_error
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.peers import LOOP, Peers, pool_token
from genrm_gateway.revisions import REVISION, Revisions
from genrm_gateway.routes import ProxiedRoute
from genrm_gateway.upstream import (
    ClientGone,
    EngineError,
    EnginePool,
    EngineTimeout,
    EngineUnavailable,
    Exchange,
    InvalidField,
)

REQUEST_ID_HEADER = b"x-request-id"
DRAINING_HEADER = (DRAINING.encode(), b"1")
FORWARDED_TO = FORWARDED_TO_HEADER.encode()
NONCE = NONCE_HEADER.encode()
PROOF = PROOF_HEADER.encode()
# Each forward is a connection of its own: an answer that never came on it then certainly belongs
# to that peer alone, and nothing is ever resent on a kept-alive connection that may have taken it.
_ONE_REQUEST = (b"connection", b"close")
_PASS_OVER = frozenset(reason.encode() for reason in PASS_OVER)
# Status recorded for requests whose client went away before the answer (nginx's convention).
CLIENT_CLOSED = 499
# The only client headers the engine gets: what SGLang reads of a request. Never the client's
# Authorization: a key-protected engine gets the gateway's own key (``EnginePool``), and the client's
# is the gateway's to check (``apikey.ClientAuth``), not the engine's.
FORWARDED_HEADERS = frozenset({b"content-type", b"accept"})
# Engine (or peer) response headers that are connection-scoped or recomputed for the client: the
# request id, the drain and forward marks and the judge revision are this gateway's to set.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
                         b"proxy-connection", b"content-length", b"trailer", b"date", b"server",
                         REQUEST_ID_HEADER, DRAINING_HEADER[0], FORWARDED_TO, PROOF, REVISION})


class _DisconnectWatcher:
    """Fails the exchange with ClientGone when the client disconnects, and remembers that it did
    (``gone``): a forward moves on to new exchanges, which a client already gone must never start.

    Why deferred: a task per request awaiting ``receive()`` costs a measurable share of the
    proxying itself (figures: docs/performance.md#measurements-behind-the-code), and a request that
    finishes within ``_WATCH_AFTER_SECONDS`` has no engine work worth aborting; longer ones (real
    judge calls) get the watcher after that delay.
    """

    __slots__ = ("_receive", "_task", "_timer", "exchange", "gone")

    def __init__(self, receive: Receive, exchange: Exchange) -> None:
        self._receive = receive
        self.exchange = exchange
        """The exchange a disconnect ends: the engine's, or the current peer's."""
        self.gone = False
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(_WATCH_AFTER_SECONDS, self._start)

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.exchange.fail(ClientGone())

    def offer(self, exchange: Exchange) -> None:
        """Make ``exchange`` the one a disconnect ends; ClientGone at once if the client already left."""
        if self.gone:
            raise ClientGone()
        self.exchange = exchange

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


# Requests answered faster than this never pay for a disconnect watcher task.
_WATCH_AFTER_SECONDS = 0.05


class Proxy:
    def __init__(self, admission: Admission, drain: DrainController, engine: EngineMonitor, pool: EnginePool,
                 metrics: GatewayMetrics, limits: Limits, peers: Peers, revisions: Revisions) -> None:
        self._admission = admission
        self._peers = peers
        self._revisions = revisions
        # What a peer's answer must say of its revision: this replica's own (whose pin it checked).
        self._own = None if revisions.own is None else revisions.own.encode()
        self._revision_values = [] if self._own is None else [self._own]
        self._drain = drain
        self._engine = engine
        self._pool = pool
        self._metrics = metrics
        self._limits = limits
        self._ids = RequestIds()

    async def handle(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send,
                     probe: bool = False) -> None:
        """Answer one request of ``route``; a ``probe`` (the operator's verification) is answered by
        this replica's own engine or refused, never by a peer: its answer must be this replica's."""
        started = time.perf_counter()
        if scope["method"] != route.method:
            await self._refuse(send, route, scope, Refusal(405, RefusalReason.METHOD_NOT_ALLOWED,
                                                           f"{route.name} accepts {route.method} only"))
            return
        try:
            pin = self._revisions.pinned(scope["headers"], lambda: self._successor(scope, probe))
        except Refusal as refusal:
            await self._refuse(send, route, scope, refusal)
            return
        # Pinned to the revision that took this one's place: answered by it, whether fenced yet or not.
        handover = [pin] if pin is not None and pin != self._own else []
        if not self._admission.try_admit():
            handover = handover or self._handover(scope, pin, probe)
            if not handover:
                await self._refuse(send, route, scope, self._fenced(pin is not None))
                return
            self._admission.admit_handover()
        code = 500
        proof: tuple[tuple[bytes, bytes], ...] = ()
        try:
            forwarded, given, relayed, proof = self._forwarded(scope)
            pinned = () if pin is None else ((REVISION, pin),)
            code = await self._exchange(route, scope, receive, send, forwarded, given, relayed, proof, probe, pinned,
                                        handover)
        except Refusal as refusal:
            code = refusal.code
            self._metrics.refused(refusal.reason)
            await send_error(send, refusal.code, refusal.reason, str(refusal), (*refusal.headers, *proof))
        finally:
            self._admission.release()
            self._metrics.observe(route.name, code, time.perf_counter() - started)

    def _successor(self, scope: Scope, probe: bool) -> str | None:
        """The judge revision that took this replica's place, when this replica can hand it requests
        (told the new revision's replicas as peers, the request neither a probe nor forwarded here):
        the fence's active revision, else the pool's as the operator told it. None otherwise."""
        fenced = self._drain.reason is DrainReason.JUDGE_SWITCHED
        active = self._drain.active_revision if fenced else self._revisions.told.active
        if active is None or active == self._revisions.own or probe or not self._peers.known \
                or control_token() is None or any(name == LOOP for name, _ in scope["headers"]):
            return None
        return active

    def _handover(self, scope: Scope, pin: bytes | None, probe: bool) -> list[bytes]:
        """The revision whose replicas answer a request this fenced replica hands over, as its peers'
        answers must name it, or [] to refuse the request instead.

        Why hand over: after a judge switch the operator fences the old revision's gateways and tells
        them the new revision's replicas as peers. A client still on a kept-alive connection here (or
        sent here by a kube-proxy that has not caught up with the Service's move) is then answered by
        the new judge at once, never by the old one, and never refused: plain clients (``requests``)
        do not retry a 503. The answer closes the connection, so the client's next request reaches the
        new revision directly. Not for a pinned request (it is this revision's, now retired: 409), a
        probe (this replica's own answer or none), a request another gateway forwarded (its sender
        offers it on), or before the operator told the active revision and the peers."""
        active = self._drain.active_revision
        relayed = any(name == LOOP for name, _ in scope["headers"])
        if self._drain.reason is not DrainReason.JUDGE_SWITCHED or active is None or pin is not None or probe \
                or relayed or not self._peers.known or control_token() is None:
            return []
        return [active.encode()]

    def _fenced(self, pinned: bool) -> Refusal:
        """Why a fenced replica refuses a request: the judge switch its fence names, else the drain."""
        if self._drain.reason is DrainReason.JUDGE_SWITCHED:
            return self._revisions.switched(self._drain.active_revision, pinned)
        return Refusal(503, RefusalReason.DRAINING, "the replica is draining; retry on another replica", close=True)

    async def _to_peers(self, relayed: bool, probe: bool) -> bool:
        """Where a request that finds the engine unreachable goes: True to the peers, False to the
        engine once it is back within ``engine_wait_seconds`` (none by default), else a retryable
        503 at once that closes the connection (the client's retry reaches another replica).

        A request that carries the loop header (``relayed``: forwarded here, with this pool's tag or
        not) neither goes on nor waits: its sender offers it to its next peer at once. A probe never
        goes to a peer."""
        if not relayed and not probe and self._peers.known and control_token() is not None:
            return True
        wait = 0.0 if relayed else self._limits.engine_wait_seconds
        if wait > 0 and await self._engine.wait_up(wait):
            return False
        raise Refusal(503, RefusalReason.ENGINE_UNAVAILABLE, "the engine is not reachable; retry on another replica",
                      close=True)

    async def _refuse(self, send: Send, route: ProxiedRoute, scope: Scope, refusal: Refusal) -> None:
        """A refusal before admission. It carries the proof when one of the pool's gateways forwarded
        the request: the sender passes on what a peer proves (a pin's ``409``), or passes it over."""
        self._metrics.refused(refusal.reason)
        self._metrics.observe(route.name, refusal.code, 0.0)
        headers = scope["headers"]
        proof = _proof(next((value for name, value in headers if name == LOOP), None),
                       next((value for name, value in headers if name == NONCE), None))
        await send_error(send, refusal.code, refusal.reason, str(refusal), (*refusal.headers, *proof))

    def _forwarded(self, scope: Scope) -> tuple[list[tuple[bytes, bytes]], bytes | None, bool,
                                                 tuple[tuple[bytes, bytes], ...]]:
        """The client headers the engine gets, the client's request id, whether the request carries
        the loop header (it is then never forwarded again), and the proof header its answers carry
        when one of the pool's gateways forwarded it (the pool's tag, and a nonce to prove); a
        declared body over the limit is refused before it is read."""
        forwarded: list[tuple[bytes, bytes]] = []
        given: bytes | None = None
        declared = 0
        tag: bytes | None = None
        nonce: bytes | None = None
        for name, value in scope["headers"]:
            if name in FORWARDED_HEADERS:
                forwarded.append((name, value))
            elif name == REQUEST_ID_HEADER:
                given = correlation_id(value)
            elif name == b"content-length":
                declared = int(value)  # llhttp accepted it: digits only, one header
            elif name == LOOP:
                tag = value
            elif name == NONCE:
                nonce = value
        if declared > self._limits.max_body_bytes:
            raise Refusal(413, RefusalReason.BODY_TOO_LARGE,
                          f"the body exceeds {self._limits.max_body_bytes} bytes", close=True)
        return forwarded, given, tag is not None, _proof(tag, nonce)

    async def _exchange(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send,
                        forwarded: list[tuple[bytes, bytes]], given: bytes | None, relayed: bool,
                        proof: tuple[tuple[bytes, bytes], ...], probe: bool,
                        pinned: tuple[tuple[bytes, bytes], ...], handover: list[bytes]) -> int:
        """Forward one admitted request; returns the status code for the metrics. ``pinned`` is the
        client's checked pin: never the engine's to see, but a peer's, which checks it again.
        ``handover``: the request goes to the peers of that revision (`_handover`), not to the engine."""
        to_peers = bool(handover) or (not self._engine.up and await self._to_peers(relayed, probe))
        abort_rid: str | None = None
        raw = b""
        if route.has_body:
            raw = await self._read_body(receive)
            body, abort_rid, request_id = engine_body(raw, self._limits, self._ids)
            request_id = given or request_id
        else:
            body, request_id = b"", given or self._ids.mint().encode()
        try:
            data = self._pool.serialize(route.method, route.name, body, forwarded)
        except InvalidField:
            raise Refusal(400, RefusalReason.INVALID_HEADER, "a header value is not allowed by RFC 9110") from None
        exchange = Exchange(self._limits)
        watcher = _DisconnectWatcher(receive, exchange)
        peer: str | None = None
        try:
            if not to_peers:
                try:
                    await self._pool.send(exchange, data)
                except EngineUnavailable:  # nothing was sent: a peer, or the engine once it is back
                    self._engine.mark_down()
                    to_peers = await self._to_peers(relayed, probe)
                    if not to_peers:
                        exchange.rearm()
                        await self._pool.send(exchange, data)
            if to_peers:
                abort_rid = None  # the request never reached this engine; a peer aborts its own
                peer = await self._forward(watcher, route, raw,
                                           [*forwarded, (REQUEST_ID_HEADER, request_id), *pinned],
                                           handover or self._revision_values)
                exchange = watcher.exchange
                if handover:
                    scope["extensions"][ANSWER_REVISION](handover[0])
            await self._respond(exchange, scope, send, request_id, peer, proof, bool(handover))
            return exchange.status
        except ClientGone:
            watcher.exchange.discard()
            await self._abort(abort_rid)
            return CLIENT_CLOSED
        except EngineUnavailable as exc:  # this engine's only: a peer's is passed over (`_forward`)
            self._engine.mark_down()
            raise Refusal(503, exc.reason, f"{exc}; retry on another replica", close=True) from exc
        except EngineError as exc:
            code = 504 if isinstance(exc, EngineTimeout) else 502
            reason, message = exc.reason, str(exc)
            if to_peers:  # the peer broke, not this replica's engine: nothing to recheck or abort here
                reason, message = RefusalReason.PEER_FAILED, f"a peer replica: {exc}"
            else:
                self._engine.recheck()
                if code == 504:
                    await self._abort(abort_rid)  # the engine may still be working on it
            if watcher.exchange.answered:
                # Headers already went out: cutting the stream is the only honest signal left.
                self._metrics.refused(reason)
                return code
            raise Refusal(code, reason, message) from exc
        finally:
            watcher.stop()
            watcher.exchange.discard()  # a response not read to its end leaves its connection unusable

    async def _forward(self, watcher: _DisconnectWatcher, route: ProxiedRoute, body: bytes,
                       headers: list[tuple[bytes, bytes]], revision: list[bytes]) -> str:
        """Offer the request to the peers in turn until one takes it; returns that peer, with its
        answer's head in ``watcher.exchange``.

        A peer is passed over only when it certainly did not take the request: its connection
        failed, or it refused before any engine work (`PASS_OVER`). A peer that took it and broke
        ends the request (``EngineError``): it may have been judged, so it is never sent twice.
        An answer without the proof of its nonce comes from no gateway of the pool (a stale address
        now another pod's): it is dropped and the client gets a 502. A proven answer that names
        another judge revision than ``revision`` (this replica's, or the new judge's for a request it
        hands over after a switch; a peer list from across a judge switch) is dropped as a refusal
        would be, whatever its status: the client, whose pin this replica checked, must never get
        another judge's verdict; the next peer is offered the request. A
        client that left ends the forward (ClientGone) before any further peer is offered it."""
        token = control_token()
        try:
            if token is not None:
                headers = [*headers, (LOOP, forward_tag(token).encode()), _ONE_REQUEST]
                for peer, client in self._peers.offers():
                    exchange = Exchange(self._limits)
                    watcher.offer(exchange)
                    nonce = secrets.token_hex(16).encode()
                    try:
                        await client.send(exchange, client.serialize(route.method, route.name, body,
                                                                     [*headers, (NONCE, nonce)]))
                    except EngineUnavailable:
                        exchange.discard()
                        continue
                    if exchange.status == 503 and _reason(exchange) in _PASS_OVER:
                        exchange.discard()
                        continue
                    if not _proven(exchange, token, nonce):
                        self._metrics.forwarded(ForwardOutcome.UNPROVEN)
                        raise Refusal(502, RefusalReason.PEER_UNPROVEN,
                                      f"the replica at {peer} did not prove it one of this pool's; its answer "
                                      "was dropped")
                    if _revisions(exchange) != revision:
                        exchange.discard()
                        continue
                    self._metrics.forwarded(ForwardOutcome.SERVED)
                    return peer
            if watcher.gone:
                raise ClientGone()
        except ClientGone:
            self._metrics.forwarded(ForwardOutcome.CLIENT_GONE)
            raise
        except EngineError:
            self._metrics.forwarded(ForwardOutcome.FAILED)
            raise
        self._metrics.forwarded(ForwardOutcome.EXHAUSTED)
        raise Refusal(503, RefusalReason.ENGINE_UNAVAILABLE,
                      "the engine is not reachable and no other replica took the request; retry",
                      close=True)

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole body within the body timeout, refused as soon as it passes the size limit."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._limits.body_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise Refusal(CLIENT_CLOSED, RefusalReason.CLIENT_GONE, "the client disconnected")
                    chunk: bytes = message.get("body", b"")
                    size += len(chunk)
                    if size > self._limits.max_body_bytes:
                        raise Refusal(413, RefusalReason.BODY_TOO_LARGE,
                                      f"the body exceeds {self._limits.max_body_bytes} bytes",
                                      close=True)
                    chunks.append(chunk)
                    if not message.get("more_body"):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except TimeoutError:
            raise Refusal(408, RefusalReason.BODY_TIMEOUT,
                          f"the body did not arrive within {self._limits.body_timeout_seconds}s",
                          close=True) from None

    async def _respond(self, exchange: Exchange, scope: Scope, send: Send, request_id: bytes,
                       peer: str | None, proof: tuple[tuple[bytes, bytes], ...], handed_over: bool = False) -> None:
        """The answer, from the engine or from ``peer``; ``proof`` proves it to the peer gateway that
        forwarded the request here. A peer's answer keeps the client's connection: its next request
        is answered through a peer again, or by the engine once it is back, while a new connection
        could find the Service without a ready endpoint (this replica was its last). An answer handed
        over to a judge switch's new revision closes it: the client's next request goes there."""
        headers = [(name, value) for name, value in exchange.headers if name not in _HOP_BY_HOP]
        headers.append((REQUEST_ID_HEADER, request_id))
        headers += proof
        draining = self._drain.state is not DrainState.SERVING
        if peer is not None:
            headers.append((FORWARDED_TO, peer.encode()))
        if draining:
            headers.append(DRAINING_HEADER)
        if draining or handed_over:
            headers.append(CLOSE_HEADER)
        if exchange.streamed and scope["http_version"] == "1.0":
            body = await self._whole_stream(exchange)
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": exchange.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        chunks = exchange.chunks()
        first = b""
        if not exchange.streamed:
            headers.append((b"content-length", str(exchange.length).encode()))
            first = await anext(chunks, b"")  # the head goes out with these: a small answer is one write
        await send({"type": "http.response.start", "status": exchange.status, "headers": headers})
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        # This last send waits while the client's socket is full: the request stays in flight, and
        # under the write timeout, until its answer is written, not only handed to the transport.
        await send({"type": "http.response.body", "body": b""})

    async def _whole_stream(self, exchange: Exchange) -> bytes:
        """A streamed answer in one piece, for an HTTP/1.0 client (no chunked encoding there),
        bounded by the stream buffer."""
        parts: list[bytes] = []
        size = 0
        async for chunk in exchange.chunks():
            size += len(chunk)
            if size > self._limits.stream_buffer_bytes:
                raise Refusal(502, RefusalReason.STREAM_TOO_LARGE,
                              "the streamed answer is too large for an HTTP/1.0 client; "
                                                     "use HTTP/1.1")
            parts.append(chunk)
        return b"".join(parts)

    async def _abort(self, rid: str | None) -> None:
        """Stop the engine's work for a client that left; the count drops only after this.

        Why not leave it to SGLang, which aborts a disconnected client's request too: it notices
        only when it next looks, up to ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT`` (4 s) later for a
        non-streamed request and 2 s after a stream ends (``create_abort_task``), all of it decoding
        for nobody. SGLang aborts every rid that starts with this one, which is why minted ids
        are fixed-width (``RequestIds``). A batch (no single rid; SGLang's ``/abort_request`` only
        takes a rid in flight, one member at a time) is left to that engine-side abort: the
        closed engine connection is its disconnect."""
        if rid is None:
            return
        try:
            await self._pool.request("POST", "/abort_request", {"rid": rid}, limit_seconds=2.0)
        except (EngineError, TimeoutError):
            pass


def _reason(exchange: Exchange) -> bytes | None:
    """The ``x-genrm-reason`` of a peer's answer, if it has one."""
    return next((value for name, value in exchange.headers if name == REASON_HEADER), None)


def _proof(tag: bytes | None, nonce: bytes | None) -> tuple[tuple[bytes, bytes], ...]:
    """The proof header of an answer to a request with the loop header ``tag`` and ``nonce``: one when
    the tag is the pool's (a gateway of the pool forwarded it), else none."""
    token = None if tag is None or nonce is None else pool_token(tag)
    return () if token is None or nonce is None else ((PROOF, forward_proof(token, nonce).encode()),)


def _revisions(exchange: Exchange) -> list[bytes]:
    """The ``x-genrm-revision`` values of a peer's answer (one from a gateway that names its revision)."""
    return [value for name, value in exchange.headers if name == REVISION]


def _proven(exchange: Exchange, token: str, nonce: bytes) -> bool:
    """Whether a peer's answer carries the proof of ``nonce`` under the pool's token."""
    expected = forward_proof(token, nonce).encode()
    return any(name == PROOF and hmac.compare_digest(value, expected) for name, value in exchange.headers)

"""One client connection: uvicorn's httptools protocol with the gateway's limits and drain hooks.

Why a protocol subclass: uvicorn bounds neither the size of a request head nor the time a client
may take to send one, so a slowloris connection or a never-ending header would hold memory and a
socket for ever; these checks must act while bytes arrive, before any request exists. The parser
itself (llhttp, through httptools) is kept: it already refuses the smuggling shapes (CL+TE,
duplicate or signed Content-Length, obfuscated Transfer-Encoding, obs-fold, bare CR or LF).

It also carries three things the gateway needs from the connection layer:

- a registry of open traffic connections, so a drain can retire keep-alive connections: behind a
  Kubernetes Service a client keeps using a connection to the pod it first reached, so an
  unpublished replica must close connections, not only refuse requests;
- hand-back, the same gentle close while serving: kube-proxy places connections, not requests, so
  a busy keep-alive client never reaches a replica added after it connected unless a replica that
  holds too many connections gives some back (the operator's balancer asks for it, and a maximum
  connection age does it without the operator; docs/load-spread.md);
- its transport: coalesced writes (a response costs one socket write, not two: on a 2-core pod
  each write is a measurable share of the gateway's CPU) and a lingering close.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import random
import time
from collections.abc import Callable
from typing import Any

import httptools
from genrm_contract.sidecar import REVISION_HEADER, DrainState, HandBack, RefusalReason
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from genrm_gateway.config import Limits
from genrm_gateway.errors import refusal_response

# How long a closing connection keeps reading (and discarding) what the client still sends.
LINGER_SECONDS = 2.0


class _Transport:
    """The socket transport with coalesced writes and a lingering close.

    Coalescing: the response head is held back for the next write (or the end of the current
    event-loop iteration), so a response costs one socket write.

    Lingering close: closing a socket that still has unread request bytes makes the kernel answer
    with a reset, which can destroy the response just written (a 413 to a client still uploading,
    a 431 to a client still sending headers). So a close sends FIN after the buffered response and
    keeps reading, discarding, until the client closes or ``LINGER_SECONDS`` pass, as nginx does.
    """

    __slots__ = ("_held", "_loop", "_transport", "lingering")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()
        self.lingering = False

    def write(self, data: bytes) -> None:
        if self.is_closing():  # a pipelined response still being written after a refusal or a cut
            return
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.is_closing():
            return
        self.flush()
        self.lingering = True
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._loop.call_later(LINGER_SECONDS, self._transport.close)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadRefused(Exception):
    """Raised inside a parser callback; the refusal itself waits on the protocol."""


Refusal = tuple[int, RefusalReason, str]
"""A refusal's status code, reason and message."""


# How long a keep-alive connection must have been idle before a soft drain closes it. A client
# that is busy reuses its connection within milliseconds and is better served by the
# ``Connection: close`` on its next response than by a close racing its next request.
ANSWER_REVISION = "genrm.answer_revision"
"""The ASGI scope extension through which the app names another judge revision for the answer's
``x-genrm-revision`` than this replica's (every answer carries the replica's as a server header): the
new judge's, for a request a replica fenced by a judge switch hands over (`proxy.Proxy._handover`)."""
SOFT_DRAIN_IDLE_SECONDS = 1.0
# Requests a client may send ahead of their answers, besides the one being answered. uvicorn parses
# every request of a read at once and queues each one (its scope, headers and body) until the one
# before it is answered, so without a bound a client that pipelines and never reads makes the
# gateway hold about a hundred bytes for each byte it sends.
MAX_PIPELINED = 4
AGE_JITTER = 0.1
"""The maximum connection age varies by this fraction either way, per connection, so connections
opened together (a client pool's start) are not handed back together (as gRPC's MAX_CONNECTION_AGE)."""
SHED_IDS_KEPT = 64
"""Shed calls remembered by id, so a retried call marks nothing more."""


class Connections:
    """The open client connections of the traffic port, for the limit and for drains."""

    def __init__(self, port: int, limits: Limits, refused: Callable[[RefusalReason], None],
                 handed_back: Callable[[HandBack], None] = lambda reason: None) -> None:
        self.port = port
        self.limits = limits
        self.refused = refused
        self.handed_back = handed_back
        self._open: set[GatewayProtocol] = set()
        self.marked: set[GatewayProtocol] = set()
        """Open connections being handed back (they close after their next response, or at the keep-alive timeout)."""
        self._sheds: dict[str, int] = {}
        self.opened_total = 0
        """Traffic connections admitted since start: with the hand-back counter, how often clients reconnect."""

    def __len__(self) -> int:
        return len(self._open)

    @property
    def kept(self) -> int:
        """Open connections neither being handed back nor closing: the count the operator balances."""
        return sum(1 for c in self._open if c.handback is None and not c.transport.is_closing())

    def shed(self, shed_id: str, count: int, reason: HandBack) -> int:
        """Hand back ``count`` connections, busiest (most requests per second of life) first; returns
        how many were marked. The same ``shed_id`` again returns the first answer and marks nothing."""
        if shed_id in self._sheds:
            return self._sheds[shed_id]
        now = time.monotonic()
        chosen = heapq.nlargest(count, (c for c in self._open if c.handback is None and not c.transport.is_closing()),
                                key=lambda c: c.request_rate(now))
        for connection in chosen:
            connection.hand_back(reason)
        self._sheds[shed_id] = len(chosen)
        if len(self._sheds) > SHED_IDS_KEPT:
            del self._sheds[next(iter(self._sheds))]
        return len(chosen)

    def admit(self, connection: GatewayProtocol) -> bool:
        if len(self._open) >= self.limits.max_connections:
            return False
        self._open.add(connection)
        self.opened_total += 1
        return True

    def discard(self, connection: GatewayProtocol) -> None:
        self._open.discard(connection)
        self.marked.discard(connection)

    def retire(self, state: DrainState) -> None:
        """Close what a drain in ``state`` must not keep open.

        Every busy connection closes after its current response. Idle ones close now when the
        replica is fenced (a request on them could only be refused), and in soft drain once they
        have been idle a while (see ``SOFT_DRAIN_IDLE_SECONDS``).
        """
        if state is DrainState.SERVING:
            return
        idle_for = 0.0 if state is not DrainState.SOFT_DRAIN else SOFT_DRAIN_IDLE_SECONDS
        now = time.monotonic()
        for connection in list(self._open):
            connection.retire(now, idle_for)


class _Timer:
    """One of a connection's timers (head or body, write, age): armed at most once at a time,
    disarmed when it fires or is cancelled."""

    __slots__ = ("_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, seconds: float, callback: Callable[..., None], *args: Any) -> None:
        """Call ``callback(*args)`` in ``seconds``, unless already armed."""
        if self._handle is None:
            self._handle = self._loop.call_later(seconds, self._fire, callback, args)

    def _fire(self, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._handle = None
        callback(*args)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _HeadChecks:
    """The checks of one request head as llhttp parses it: its size and field count (while the
    fields arrive, before the head is whole) and the framing rules llhttp leaves to its caller
    (once it is whole). Each answers the refusal the head earns, or None."""

    __slots__ = ("_codings", "_count", "_hosts", "_limits", "_size")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self.reset()

    def reset(self) -> None:
        """A new request begins."""
        self._count = self._hosts = 0
        self._size = 0  # request line and fields as parsed (complete heads)
        self._codings: list[bytes] = []

    def url(self, url: bytes) -> None:
        self._size += len(url)

    def field(self, name: bytes, value: bytes, in_head: bool) -> Refusal | None:
        """A header field, or (``in_head`` false) a field of a chunked body's trailer."""
        self._count += 1
        self._size += len(name) + len(value) + 4
        if self._count > self._limits.max_headers:
            return 431, RefusalReason.TOO_MANY_HEADERS, f"more than {self._limits.max_headers} header fields"
        if self._size > self._limits.max_head_bytes:
            return 431, RefusalReason.HEAD_TOO_LARGE, f"the request head exceeds {self._limits.max_head_bytes} bytes"
        if in_head:
            lowered = name.lower()
            if lowered == b"host":
                self._hosts += 1
            elif lowered == b"transfer-encoding":
                self._codings.append(value)
        return None

    def complete(self, parser: httptools.HttpRequestParser, pipelined: int) -> Refusal | None:
        """The whole head, with ``pipelined`` requests parsed before it still waiting for their answers."""
        if parser.should_upgrade():  # refused before the app ever sees the request
            return 400, RefusalReason.BAD_REQUEST, "protocol upgrades are not supported"
        if self._hosts > 1 or (self._hosts == 0 and parser.get_http_version() != "1.0"):
            # RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host (llhttp does not check;
            # h11, which the gateway's parsing is held to, refuses it).
            return 400, RefusalReason.BAD_HOST, "an HTTP/1.1 request needs exactly one Host header"
        if self._codings and b",".join(self._codings).strip().lower() != b"chunked":
            # RFC 9112 §6.3: with any other coding the body's end is unknown; llhttp lets some
            # through (a GET with "gzip" alone), h11 refuses them all, and so does the gateway.
            return 400, RefusalReason.BAD_TRANSFER_ENCODING, "the only transfer coding accepted is chunked, alone"
        if pipelined >= MAX_PIPELINED:
            # Refused after the earlier answers, and parsing stops here: httptools has no way to
            # stop between two requests of one read and go on later, and a client must retry
            # the pipelined requests a close leaves unanswered (RFC 9112 §9.3.2).
            return (503, RefusalReason.TOO_MANY_PIPELINED,
                    f"more than {MAX_PIPELINED} requests sent ahead of their answers")
        return None


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's protocol plus head limits, a head timeout, the connection limit and retirement."""

    registry: Connections  # set by ``protocol_class``

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = self.registry.limits
        self._traffic = False
        self._reading_head = True
        self._head_bytes = 0  # bytes received while a head (or a trailer) is incomplete (bounds memory)
        self._trailing = False  # after a chunk's size line, before its data: a trailer when the size was 0
        self._trailer_dropped = False
        self._checks = _HeadChecks(self._limits)
        self._head_timer = _Timer(self.loop)  # the head timeout
        self._refusal: Refusal | None = None
        self._deferred: bytes | None = None  # a refusal waiting for earlier pipelined answers
        self._running: RequestResponseCycle | None = None  # the request the app is answering
        self._write_timer = _Timer(self.loop)
        self._opened = time.monotonic()
        self._requests = 0
        self._age_timer = _Timer(self.loop)
        self.handback: HandBack | None = None
        # A new connection counts as busy: its client opened it to send a request right away,
        # which a close would race. It turns idle only after a response (else the head timeout).
        self._idle_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _Transport(transport)  # type: ignore[assignment]
        self._traffic = self.server is not None and self.server[1] == self.registry.port
        if self._traffic and not self.registry.admit(self):
            self._traffic = False
            self._refuse(503, RefusalReason.TOO_MANY_CONNECTIONS, "the gateway has too many open connections")
            return
        self._arm_head_timer()
        if self._traffic and (age := self._limits.max_connection_age_seconds) > 0:
            jittered = age * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self._age_timer.arm(jittered, self.hand_back, HandBack.MAX_AGE)

    def pause_writing(self) -> None:
        """The client stopped reading (the socket's buffer is full): it has the write timeout to resume.

        Why here and not around each ``send``: every answer on the connection is covered, refusals
        and pipelined ones included, and a request that does not fill the buffer pays nothing.
        """
        super().pause_writing()
        self._write_timer.arm(self._limits.write_timeout_seconds, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_timer.cancel()

    def _write_timed_out(self) -> None:
        """Cut the client: an abort drops what is buffered for it (a close would wait to flush it),
        and the request learns its client is gone, so its engine work is aborted too."""
        self.registry.refused(RefusalReason.WRITE_TIMEOUT)
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._write_timer.cancel()
        self._age_timer.cancel()
        self._head_timer.cancel()
        self.registry.discard(self)
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True  # uvicorn only tells the last parsed request; a pipelined
            running.message_event.set()  # one still being answered must learn it too
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._running = cycle
        extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
        extensions[ANSWER_REVISION] = functools.partial(_answer_revision, cycle)
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing() or self._deferred is not None:  # lingering or refused: discarded
            return
        if self._reading_head or self._trailing:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            code, reason, message = self._refusal or (400, RefusalReason.BAD_REQUEST, f"invalid HTTP request: {exc}")
            self._refuse(code, reason, message)
        else:
            if (self._reading_head or self._trailing) and self._head_bytes > self._limits.max_head_bytes:
                self._refuse(431, RefusalReason.HEAD_TOO_LARGE,
                             f"the request head exceeds {self._limits.max_head_bytes} bytes")
            elif self.timeout_keep_alive_task is None and not self._head_timer.armed and (
                    self.cycle is None or self.cycle.response_complete):
                # Bytes that begin no request (a bare CRLF) cancelled the keep-alive timer, and no
                # request's timeouts apply: without this the connection would have no timer at all.
                # (The rest of a body nobody reads never gets here: its answer closed the connection.)
                self._arm_head_timer()

    # Parser callbacks (uvicorn's, extended)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._idle_since = None
        self._checks.reset()
        self._trailer_dropped = False
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._checks.url(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if (refusal := self._checks.field(name, value, self._reading_head)) is not None:
            self._refusal = refusal
            raise _HeadRefused
        if self._reading_head:
            super().on_header(name, value)
        elif not self._trailer_dropped:
            # A field of a chunked body's trailer: uvicorn would add it to the request's headers,
            # where it could stand in for a checked header (authorization, the request id).
            self._trailer_dropped = True
            self.registry.refused(RefusalReason.TRAILER_DROPPED)

    def on_chunk_header(self) -> None:
        """A chunk's size line: what follows is its data, or the trailer after the last (empty)
        chunk, whose bytes llhttp hands over only per complete field, so they count as head bytes."""
        self._trailing = True

    def on_body(self, body: bytes) -> None:
        if self._trailing:
            self._trailing = False
            self._head_bytes = 0
        super().on_body(body)

    def on_chunk_complete(self) -> None:
        self._trailing = False
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._head_timer.cancel()
        if (refusal := self._checks.complete(self.parser, len(self.pipeline))) is not None:
            self._refusal = refusal
            raise _HeadRefused
        super().on_headers_complete()
        self._requests += 1
        if self.cycle is not None:
            _close_if_answered_unread(self.cycle)
            if self.handback is not None:
                self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        if self.cycle is not None:
            # The body is whole: an answer keeps the connection. Usually this comes in the read that
            # brought the head, before the application runs, which then never sees the wrapper.
            vars(self.cycle).pop("send", None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:
            self._idle_since = time.monotonic()
            if self._deferred is not None and not self.transport.is_closing():
                self.transport.write(self._deferred)
                self.transport.close()

    def request_rate(self, now: float) -> float:
        """Requests per second over the connection's life (a second at least): which to shed first."""
        return self._requests / max(1.0, now - self._opened)

    def hand_back(self, reason: HandBack) -> None:
        """Close this connection gently so its client reconnects (and the Service places it anew):
        the response being answered carries ``Connection: close`` if its head is not written yet,
        else the next one does.

        An idle connection is left to its next request rather than closed: however long it has
        been idle, its client may be sending on it at the moment of the close, and a request that
        crosses a close is lost (httpx, requests and aiohttp all report the server disconnected,
        without retrying a POST). One that is never used again closes at the keep-alive timeout
        and no longer counts toward the replica's share meanwhile."""
        if self.handback is not None or self.transport.is_closing():
            return
        self.handback = reason
        self._age_timer.cancel()
        self.registry.marked.add(self)
        self.registry.handed_back(reason)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.response_started:
            cycle.keep_alive = False

    def retire(self, now: float, idle_for: float) -> None:
        """Close after the current response, or now if idle for ``idle_for`` seconds or more."""
        if self._idle_since is None or self._head_bytes:
            if self.cycle is not None:
                self.cycle.keep_alive = False
        elif now - self._idle_since >= idle_for and not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, code: int, reason: RefusalReason, message: str) -> None:
        """Answer the request being parsed, then close: the stream cannot be trusted after it.

        When the app already holds this request (a body that turned out malformed), it is told
        the client is gone, so it sends nothing and releases its admission. When the bad bytes
        come after whole requests that are still being answered (pipelining), those answers go
        out first, and the refusal after them.
        """
        self._head_timer.cancel()
        self.registry.refused(reason)
        if self.transport.is_closing() or self._deferred is not None:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            self._deferred = refusal_response(code, reason, message, self.server_state.default_headers)
            self.flow.pause_reading()
            return
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(refusal_response(code, reason, message, self.server_state.default_headers))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _arm_head_timer(self) -> None:
        if not self._head_timer.armed:
            self._head_timer.arm(self._limits.head_timeout_seconds, self._head_timed_out)

    def _head_timed_out(self) -> None:
        if self.transport.is_closing():
            return
        if self._head_bytes:
            self._refuse(408, RefusalReason.HEAD_TIMEOUT, "the request head did not arrive in time")
        else:  # nothing sent: close quietly, as for an idle keep-alive connection
            self.transport.close()


def _answer_revision(cycle: RequestResponseCycle, revision: bytes) -> None:
    """Name ``revision`` in this answer's ``x-genrm-revision`` instead of the replica's own."""
    cycle.default_headers = [(name, value) for name, value in cycle.default_headers
                             if name.lower() != REVISION_HEADER.encode()] + [(REVISION_HEADER.encode(), revision)]


def _close_if_answered_unread(cycle: RequestResponseCycle) -> None:
    """Make an answer that starts before its request's body has ended close the connection.

    Why: such an answer is a refusal that never reads the body (a 404, a 405, a 401), and what is
    left of that body would otherwise keep the connection open with only the body timeout on it,
    much longer than a connection with nothing to say may stay. Closing is what RFC 9112 (9.6)
    asks of a server that does not read a body; the client learns it from ``Connection: close``,
    and the lingering close reads and drops the rest for ``LINGER_SECONDS`` at most. Installed on
    the cycle (the application calls ``cycle.send``) until the body is whole."""
    send = cycle.send

    async def answer(message: Any) -> None:
        if message["type"] == "http.response.start" and cycle.more_body:
            cycle.keep_alive = False
        await send(message)

    setattr(cycle, "send", answer)  # noqa: B010 (mypy refuses assigning to a method)


def protocol_class(registry: Connections) -> type[GatewayProtocol]:
    """The protocol uvicorn instantiates per connection, bound to this gateway's registry."""
    return type("BoundGatewayProtocol", (GatewayProtocol,), {"registry": registry})

"""A pooled keep-alive HTTP/1.1 client for the one engine behind the gateway.

Why not a general-purpose client (httpx, aiohttp): the proxied path's CPU cost is the gateway's
whole overhead, and on a 2-core pod such a client costs more per request than the engine's own
HTTP stack. The response is parsed by httptools (llhttp, the parser uvicorn uses) straight
into the waiting exchange; the request head is written from constants and RFC 9110-checked
fields (held to h11's judgement by a differential test); what is ours is the pooling, one
``write`` per request on a kept-alive connection, flow control and the engine timeouts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import cast

import httptools
from genrm_contract.sidecar import RefusalReason

from genrm_gateway.config import EngineAddress, Limits

# uvicorn (and so SGLang) closes idle keep-alive connections after 5 s; reusing one just before
# that would race the close, so older idle connections are dropped instead.
_MAX_IDLE_SECONDS = 4.0


class EngineError(Exception):
    """The engine could not produce a complete response; ``reason`` goes into the JSON error."""

    reason: RefusalReason = RefusalReason.ENGINE_ERROR


class EngineUnavailable(EngineError):
    reason = RefusalReason.ENGINE_UNAVAILABLE


class EngineDisconnected(EngineError):
    reason = RefusalReason.ENGINE_DISCONNECTED


class EngineTimeout(EngineError):
    """The engine sent no answer head, or nothing more of its answer, within the engine timeouts."""

    reason = RefusalReason.ENGINE_TIMEOUT


# RFC 9110 §5.6.2 token and §5.5 field-value (visible ASCII and obs-text, inner spaces and tabs).
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")


class InvalidField(ValueError):
    """A header the gateway will not write to the engine."""


class _Unsolicited(Exception):
    """The engine sent a response that matches no request (raised inside the parser)."""


class ClientGone(Exception):
    """The downstream client disconnected; the engine request should be aborted."""


_DEFAULT_LIMITS = Limits()


class Exchange:
    """One request/response on an engine connection, filled in by the connection's parser."""

    __slots__ = ("_body", "_buffer_limit", "_buffered", "_complete", "_connection", "_error", "_head", "_waiter",
                 "head_timeout", "headers", "length", "read_timeout", "status")

    def __init__(self, limits: Limits = _DEFAULT_LIMITS) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.length: int | None = None  # the answer's Content-Length; None for a chunked (streamed) one
        self._body: list[bytes] = []
        self._buffered = 0
        self._buffer_limit = limits.stream_buffer_bytes
        self.head_timeout = limits.engine_head_timeout_seconds
        self.read_timeout = limits.engine_read_timeout_seconds
        self._head = False
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._connection: _Connection | None = None

    @property
    def streamed(self) -> bool:
        return self.length is None

    @property
    def answered(self) -> bool:
        """Whether any part of the response arrived (a retry would then repeat engine work)."""
        return self._head

    def fail(self, error: BaseException) -> None:
        """End the exchange with ``error`` unless it already completed."""
        if not self._complete and self._error is None:
            self._error = error
            self._wake()

    def rearm(self) -> None:
        """Forget a connection failure that happened before any answer, to retry elsewhere."""
        self._error = None
        self._connection = None

    def discard(self) -> None:
        """Give up on the response: its connection cannot be reused, so close it."""
        connection, self._connection = self._connection, None
        if connection is not None and not self._complete:
            connection.close()

    async def wait_head(self) -> None:
        while not self._head:
            await self._wait()

    async def read(self) -> bytes:
        """The whole body (the engine's own small answers to the gateway: probes, aborts)."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, streamed (SSE) or not.

        Why the buffer limit: a client that stops reading must not make the gateway hold the
        engine's whole answer; past ``buffer_limit`` bytes the engine connection stops being
        read (TCP pushes back on the engine) until this consumer has taken what is buffered.
        """
        while True:
            if self._body:
                chunk = b"".join(self._body)
                self._body.clear()
                self._buffered = 0
                if self._connection is not None:
                    self._connection.resume()
                yield chunk
            elif self._complete:
                return
            else:
                await self._wait()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = headers
        for name, value in headers:
            if name == b"content-length":  # llhttp took it as the body's length: one, digits only
                self.length = int(value)
        self._head = True
        self._wake()

    def _on_body(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered > self._buffer_limit and self._connection is not None:
            self._connection.pause()
        self._wake()

    def _on_complete(self) -> None:
        self._complete = True
        self._connection = None
        self._wake()


class _Connection(asyncio.Protocol):
    """A keep-alive engine connection serving one exchange at a time.

    Why engine timeouts here: an engine that stops answering (hung, or a connection lost without
    a reset) would otherwise hold the client, its in-flight slot and so a drain for ever. One timer
    per exchange, re-armed lazily: a read only records its time, and the timer, when it fires,
    either ends the exchange or moves itself to the new deadline. While reading is paused the
    gateway waits on its client, whose write timeout applies instead.
    """

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._fd = -1
        self._timer: asyncio.TimerHandle | None = None
        self._started = 0.0  # when the current request was sent (the head timeout counts from it)
        self._heard = 0.0  # the last read, or resume (the idle-read timeout counts from it)
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: Exchange | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self.closed = False
        self._paused = False
        self._interim = False
        self.idle_since = 0.0

    def start(self, exchange: Exchange, data: bytes) -> None:
        assert self._transport is not None
        self._exchange = exchange
        exchange._connection = self
        self._started = self._heard = now = self._loop.time()
        self._timer = self._loop.call_at(now + min(exchange.head_timeout, exchange.read_timeout), self._check_time)
        self._transport.write(data)

    def close(self) -> None:
        self.closed = True
        self._disarm()
        if self._transport is not None:
            self._transport.close()

    def pause(self) -> None:
        if self._transport is not None and not self.closed and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self.closed and self._paused:
            self._paused = False
            self._heard = self._loop.time()
            self._transport.resume_reading()

    def quiet(self) -> bool:
        """Whether the engine has neither closed this idle connection nor sent anything on it.

        Why look before reuse: a busy loop learns of an engine's close (a crash, its keep-alive
        timeout) only some callbacks later. A request written meanwhile fails as if the engine died
        under it, when the engine was gone before a byte was sent; read now, the close is seen first
        and the request goes to a fresh connection, or is refused as never sent. One non-blocking
        read: nothing waiting means alive, and any byte on an idle connection is unsolicited, so
        consuming it costs nothing that was wanted.
        """
        try:
            os.read(self._fd, 1)
        except BlockingIOError:
            return True
        except OSError:  # reset
            return False
        return False

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_time(self) -> None:
        """End the exchange if the engine is past a deadline, else look again at the next one."""
        self._timer = None
        exchange = self._exchange
        if exchange is None or self.closed:
            return
        now = self._loop.time()
        if self._paused:
            due, late = now + exchange.read_timeout, ""
        elif exchange.answered:
            due, late = self._heard + exchange.read_timeout, f"the engine sent nothing for {exchange.read_timeout:g}s"
        else:
            due, late = self._started + exchange.head_timeout, f"no engine answer in {exchange.head_timeout:g}s"
        if late and due <= now:
            self._fail(EngineTimeout(late))
        else:
            self._timer = self._loop.call_at(due, self._check_time)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._fd = transport.get_extra_info("socket").fileno()

    def data_received(self, data: bytes) -> None:
        if self._exchange is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        self._heard = self._loop.time()
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, _Unsolicited) as exc:
            self._fail(EngineDisconnected(f"malformed engine response: {exc}"))

    def _fail(self, error: EngineError) -> None:
        """End the current exchange (if any) with ``error`` and never reuse this connection."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.fail(error)
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.fail(EngineDisconnected("the engine closed the connection mid-request"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._exchange is None or self._exchange.answered:
            # A second response to one request (or more body than announced): a desynchronised
            # engine. Nothing after this can be matched to a request.
            raise _Unsolicited("a response nobody asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        headers, self._headers = self._headers, []
        status = self._parser.get_status_code()
        self._interim = 100 <= status < 200
        if self._interim:  # 100 Continue and the like: the final response follows
            return
        if not 200 <= status <= 599:
            raise _Unsolicited(f"status {status}")
        if self._exchange is not None:
            self._exchange._on_head(status, headers)

    def on_body(self, body: bytes) -> None:
        if self._exchange is not None:
            self._exchange._on_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        exchange, self._exchange = self._exchange, None
        self._disarm()
        keep_alive = self._parser.should_keep_alive()
        if exchange is not None:
            exchange._on_complete()
        if keep_alive and not self.closed:
            # The read that completed the answer may also have paused reading (a consumer behind
            # on a large body); the answer is whole, so the pause has nothing left to hold back,
            # and a connection pooled paused would never read its next request's answer.
            self.resume()
            self._pool._release(self)
        else:
            self.close()


class EnginePool:
    """Idle keep-alive connections to the engine, most recently used first.

    With an API key every request carries it (``Authorization: Bearer``): proxied ones, aborts,
    load reads and readiness polls alike, since SGLang demands it on all but ``/health*``,
    ``/ready*`` and ``/metrics*``, and one rule for all cannot forget a call.
    """

    def __init__(self, address: EngineAddress, api_key: str | None = None,
                 connect_seconds: float | None = None) -> None:
        self._address = address
        self._connect_seconds = connect_seconds
        self._idle: list[_Connection] = []
        self.host_header = address.authority.encode()
        self._fixed_fields = b"" if api_key is None else b"authorization: Bearer " + api_key.encode() + b"\r\n"

    async def send(self, exchange: Exchange, data: bytes) -> None:
        """Send a request and wait for the response head.

        A reused connection that dies before any response byte is retried once on a fresh
        connection: that is the keep-alive close race, and judge requests are pure functions.
        When that fresh connection cannot even be opened, the engine died under the request, and
        the original disconnection is what the client is told.
        """
        connection = self._take_idle()
        if connection is None:
            connection = await self._connect()
        else:
            connection.start(exchange, data)
            try:
                await exchange.wait_head()
                return
            except EngineDisconnected as lost:
                if exchange.answered:
                    raise
                exchange.rearm()
                try:
                    connection = await self._connect()
                except EngineUnavailable:
                    raise lost from None
        if exchange._error is not None:  # ended while connecting (its client left): send nothing
            connection.close()
            raise exchange._error
        connection.start(exchange, data)
        await exchange.wait_head()

    async def request(self, method: str, path: str, payload: object = None,
                      limit_seconds: float = 5.0) -> tuple[int, bytes]:
        """A small complete request (probes, aborts); raises EngineError or TimeoutError."""
        body = b"" if payload is None else json.dumps(payload).encode()
        data = self.serialize(method, path, body, ((b"content-type", b"application/json"),))
        exchange = Exchange()
        try:
            async with asyncio.timeout(limit_seconds):
                await self.send(exchange, data)
                return exchange.status, await exchange.read()
        finally:
            exchange.discard()

    def serialize(self, method: str, target: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
        """A whole request to the engine: the head built from constants, a length and checked fields.

        Every header name must be an RFC 9110 token and every value a field-value (no CR, LF, NUL
        or other control character), so no byte a client sent can end a header line or start a
        request; raises ``InvalidField`` otherwise. Why not h11 here: it is a sizeable share of
        the gateway's whole per-request CPU (figures: docs/performance.md#measurements-behind-the-code);
        ``tests/gateway/test_serialize.py`` holds this writer to h11's own judgement.
        """
        parts = [method.encode(), b" ", target.encode(), b" HTTP/1.1\r\nhost: ", self.host_header, b"\r\n",
                 self._fixed_fields, b"content-length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            if _TOKEN.fullmatch(name) is None or _FIELD_VALUE.fullmatch(value) is None:
                raise InvalidField(f"header {name!r} is not allowed by RFC 9110")
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts) + body

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < _MAX_IDLE_SECONDS and connection.quiet():
                return connection
            connection.close()
        return None

    def _release(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_seconds):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self), self._address.host, self._address.port)
        except OSError as exc:  # refused, unreachable, or no answer within connect_seconds
            raise EngineUnavailable(f"cannot connect to {self._address.authority}: "
                                    f"{exc.strerror or 'timed out'}") from exc
        return connection

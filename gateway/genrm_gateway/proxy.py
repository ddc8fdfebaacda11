"""The proxied hot path: a raw ASGI handler from admission to the last byte.

Why raw ASGI rather than FastAPI routes: on a 2-core pod the gateway's per-request CPU is its
whole overhead, and the routing, dependency and response machinery of a framework costs more
than the proxying itself.

What reaches the engine is the gateway's own request, never the client's bytes: the route's
canonical path (no client target or query), an allowlist of headers re-serialised by h11, and the
JSON body re-serialised with a request id (``rid``) the gateway minted. The client's id is only a
correlation value, validated and echoed in ``X-Request-Id``; so a client can neither inject a
header or a second request, nor collide with (or abort) another client's request on the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from collections.abc import Callable

import h11
from genrm_contract.sidecar import DRAINING_HEADER as DRAINING
from genrm_contract.sidecar import DrainState, Reason
from starlette.types import Message, Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.config import Limits
from genrm_gateway.connection import ABORT_EXTENSION
from genrm_gateway.drain import DrainController
from genrm_gateway.engine import EngineMonitor
from genrm_gateway.errors import CLOSE_HEADER, REASON_HEADER, Refusal, error_body
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.routes import ProxiedRoute
from genrm_gateway.upstream import ClientGone, EngineError, EnginePool, EngineUnavailable, Exchange

REQUEST_ID_HEADER = b"x-request-id"
DRAINING_HEADER = (DRAINING.encode(), b"1")
RETRY_AFTER = (b"retry-after", b"1")
_JSON_CONTENT = (b"content-type", b"application/json")
# Status recorded for requests whose client went away before the answer (nginx's convention).
CLIENT_CLOSED = 499
# The only client headers the engine gets: what SGLang reads (content type, accept, an API key).
FORWARDED_HEADERS = frozenset({b"content-type", b"accept", b"authorization"})
# Engine response headers that are connection-scoped or recomputed for the client.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
                         b"proxy-connection", b"content-length", b"trailer", b"date", b"server",
                         REQUEST_ID_HEADER})
# A client's request id: printable, header-safe and short (UUIDs, ULIDs, hex, "job-7/step-3").
CORRELATION_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")


async def send_error(send: Send, code: int, reason: str, message: str,
                     extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = error_body(code, reason, message)
    headers = [_JSON_CONTENT, (b"content-length", str(len(body)).encode()),
               (REASON_HEADER, reason.encode()), *extra]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestIds:
    """Engine request ids: unique per gateway process and never chosen by a client.

    A random prefix per process and a counter: cheap, and unique across restarts of the sidecar
    while the engine (which rejects a duplicate rid) keeps running.
    """

    def __init__(self) -> None:
        self._prefix = "gw" + os.urandom(6).hex() + "-"
        self._counter = itertools.count(1)

    def mint(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"


def correlation_id(value: object) -> bytes:
    """A client-supplied id as a header-safe value, or a 400."""
    raw = value.encode("utf-8", "replace") if isinstance(value, str) else value
    if not isinstance(raw, bytes) or CORRELATION_ID.fullmatch(raw) is None:
        raise Refusal(400, "invalidRequestId", "a request id must be 1-128 characters of A-Z a-z 0-9 . _ : / + = @ -")
    return raw


def exceeds_depth(value: object, limit: int) -> bool:
    """Whether JSON containers nest deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def engine_body(body: bytes, limits: Limits, mint: Callable[[], str]) -> tuple[bytes, list[str], bytes | None]:
    """The body the engine gets: the client's JSON object with the gateway's ``rid``.

    Returns the new body, the engine rids to abort if the client leaves, and the client's own
    ``rid`` (a correlation value) when it sent a single one.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise Refusal(400, "invalidJson", "the body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise Refusal(400, "invalidJson", "the body must be a JSON object")
    if exceeds_depth(payload, limits.max_json_depth):
        raise Refusal(400, "jsonTooDeep", f"the JSON nests deeper than {limits.max_json_depth} levels")
    client_rid = payload.get("rid")
    engine_rid = mint()
    given: bytes | None = None
    if client_rid is None or isinstance(client_rid, str):
        given = None if client_rid is None else correlation_id(client_rid)
        payload["rid"] = engine_rid
        rids = [engine_rid]
    elif isinstance(client_rid, list) and client_rid:  # a batch: one id per element, as SGLang requires
        for item in client_rid:
            correlation_id(item)
        rids = payload["rid"] = [f"{engine_rid}.{i}" for i in range(len(client_rid))]
    else:
        raise Refusal(400, "invalidRequestId", "rid must be a string or a non-empty list of strings")
    return json.dumps(payload, separators=(",", ":")).encode(), rids, given


class _DisconnectWatcher:
    """Fails the exchange with ClientGone when the client disconnects.

    Why deferred: a task per request awaiting ``receive()`` costs as much as a tenth of the
    proxying itself, and a request that finishes within ``_WATCH_AFTER_SECONDS`` has no engine
    work worth aborting; longer ones (real judge calls) get the watcher after that delay.
    """

    __slots__ = ("_exchange", "_receive", "_task", "_timer")

    def __init__(self, receive: Receive, exchange: Exchange) -> None:
        self._receive = receive
        self._exchange = exchange
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(_WATCH_AFTER_SECONDS, self._start)

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._exchange.fail(ClientGone())

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


# Requests answered faster than this never pay for a disconnect watcher task.
_WATCH_AFTER_SECONDS = 0.05


class Proxy:
    def __init__(self, admission: Admission, drain: DrainController, engine: EngineMonitor, pool: EnginePool,
                 metrics: GatewayMetrics, limits: Limits) -> None:
        self._admission = admission
        self._drain = drain
        self._engine = engine
        self._pool = pool
        self._metrics = metrics
        self._limits = limits
        self._ids = RequestIds()

    async def handle(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if scope["method"] != route.method:
            await self._refuse(send, route, Refusal(405, "methodNotAllowed",
                                                    f"{route.name} accepts {route.method} only"))
            return
        if not self._admission.try_admit():
            await self._refuse(send, route, Refusal(503, Reason.DRAINING,
                                                    "the replica is draining; retry on another replica",
                                                    (RETRY_AFTER,), close=True))
            return
        code = 500
        try:
            if not self._engine.up:
                raise Refusal(503, Reason.ENGINE_UNAVAILABLE, "the engine is not reachable; retry on another replica",
                              (RETRY_AFTER,), close=True)
            code = await self._exchange(route, scope, receive, send)
        except Refusal as refusal:
            code = refusal.code
            self._metrics.refused(refusal.reason)
            await send_error(send, refusal.code, refusal.reason, str(refusal), refusal.headers)
        finally:
            self._admission.release()
            self._metrics.observe(route.name, code, time.perf_counter() - started)

    async def _refuse(self, send: Send, route: ProxiedRoute, refusal: Refusal) -> None:
        self._metrics.refused(refusal.reason)
        self._metrics.observe(route.name, refusal.code, 0.0)
        await send_error(send, refusal.code, refusal.reason, str(refusal), refusal.headers)

    def _forwarded(self, scope: Scope) -> tuple[list[tuple[bytes, bytes]], bytes | None, int]:
        """The client headers the engine gets, the client's request id and the declared length."""
        forwarded: list[tuple[bytes, bytes]] = []
        given: bytes | None = None
        declared = 0
        for name, value in scope["headers"]:
            if name in FORWARDED_HEADERS:
                forwarded.append((name, value))
            elif name == REQUEST_ID_HEADER:
                given = correlation_id(value)
            elif name == b"content-length":
                declared = int(value)  # llhttp accepted it: digits only, one header
        if declared > self._limits.max_body_bytes:
            raise Refusal(413, "bodyTooLarge", f"the body exceeds {self._limits.max_body_bytes} bytes", close=True)
        return forwarded, given, declared

    async def _exchange(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send) -> int:
        """Forward one admitted request; returns the status code for the metrics."""
        forwarded, given, _ = self._forwarded(scope)
        rids: list[str] = []
        if route.has_body:
            body, rids, body_rid = engine_body(await self._read_body(receive), self._limits, self._ids.mint)
            given = given or body_rid
        else:
            body = b""
        try:
            data = self._pool.serialize(route.method, route.name, body, forwarded)
        except h11.LocalProtocolError:
            raise Refusal(400, "invalidHeader", "a header value is not allowed by RFC 9110") from None
        request_id = given or (rids[0].encode() if rids else self._ids.mint().encode())
        exchange = Exchange(self._limits.stream_buffer_bytes)
        watcher = _DisconnectWatcher(receive, exchange)
        try:
            await self._pool.send(exchange, data)
            await self._respond(exchange, scope, send, request_id)
            return exchange.status
        except (ClientGone, TimeoutError):
            exchange.discard()
            await self._abort(rids)
            return CLIENT_CLOSED
        except EngineUnavailable as exc:
            exchange.discard()
            self._engine.mark_down()
            raise Refusal(503, exc.reason, f"{exc}; retry on another replica", (RETRY_AFTER,), close=True) from exc
        except EngineError as exc:
            exchange.discard()
            self._engine.recheck()
            if exchange.answered:
                # Headers already went out: cutting the stream is the only honest signal left.
                return 502
            raise Refusal(502, exc.reason, str(exc)) from exc
        finally:
            watcher.stop()

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole body within the body timeout, refused as soon as it passes the size limit."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._limits.body_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise Refusal(CLIENT_CLOSED, "clientGone", "the client disconnected")
                    chunk: bytes = message.get("body", b"")
                    size += len(chunk)
                    if size > self._limits.max_body_bytes:
                        raise Refusal(413, "bodyTooLarge", f"the body exceeds {self._limits.max_body_bytes} bytes",
                                      close=True)
                    chunks.append(chunk)
                    if not message.get("more_body"):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except TimeoutError:
            raise Refusal(408, "bodyTimeout", f"the body did not arrive within {self._limits.body_timeout_seconds}s",
                          close=True) from None

    async def _respond(self, exchange: Exchange, scope: Scope, send: Send, request_id: bytes) -> None:
        headers = [(name, value) for name, value in exchange.headers if name not in _HOP_BY_HOP]
        headers.append((REQUEST_ID_HEADER, request_id))
        if self._drain.state is not DrainState.SERVING:
            headers += (DRAINING_HEADER, CLOSE_HEADER)
        if not exchange.streamed:
            body = await exchange.read()
            headers.append((b"content-length", str(len(body)).encode()))
            await self._send(scope, send, {"type": "http.response.start", "status": exchange.status,
                                           "headers": headers})
            await self._send(scope, send, {"type": "http.response.body", "body": body})
            return
        await self._send(scope, send, {"type": "http.response.start", "status": exchange.status, "headers": headers})
        async for chunk in exchange.chunks():
            await self._send(scope, send, {"type": "http.response.body", "body": chunk, "more_body": True})
        await self._send(scope, send, {"type": "http.response.body", "body": b""})

    async def _send(self, scope: Scope, send: Send, message: Message) -> None:
        """``send`` with the write timeout: a client that stops reading is cut, not waited for.

        uvicorn's ``send`` waits while the socket's buffer is full; past the timeout the
        connection is aborted (dropping what is buffered for it) and TimeoutError propagates
        so the engine request is aborted too.
        """
        try:
            async with asyncio.timeout(self._limits.write_timeout_seconds):
                await send(message)
        except TimeoutError:
            self._metrics.refused("writeTimeout")
            scope["extensions"][ABORT_EXTENSION]()
            raise

    async def _abort(self, rids: list[str]) -> None:
        """Stop the engine's work for a client that left; the count drops only after this."""
        for rid in rids:
            try:
                await self._pool.request("POST", "/abort_request", {"rid": rid}, limit_seconds=2.0)
            except (EngineError, TimeoutError):
                pass

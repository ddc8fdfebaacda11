"""The proxied hot path: a raw ASGI handler from admission to the last byte.

Why raw ASGI rather than FastAPI routes: on a 2-core pod the gateway's per-request CPU is its
whole overhead, and the routing, dependency and response machinery of a framework costs more
than the proxying itself. Each request is admitted (or refused) before any other work, its body
is read once with a size limit, and the engine's response is passed through unchanged: buffered
when it has a length, chunk by chunk when it is a stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.drain import DrainController, DrainState
from genrm_gateway.errors import REASON_HEADER, Refusal, error_body
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.routes import ProxiedRoute
from genrm_gateway.upstream import ClientGone, EngineError, EnginePool, Exchange

REQUEST_ID_HEADER = b"x-request-id"
DRAINING_HEADER = (b"x-genrm-draining", b"1")
_JSON_CONTENT = (b"content-type", b"application/json")
# Status recorded for requests whose client went away before the answer (nginx's convention).
CLIENT_CLOSED = 499
# Connection-scoped or recomputed headers that must not be copied between the two hops.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
                         b"proxy-connection", b"proxy-authorization", b"host", b"content-length",
                         b"trailer", REQUEST_ID_HEADER, b"date", b"server", b"expect"})


async def send_error(send: Send, code: int, reason: str, message: str,
                     extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = error_body(code, reason, message)
    headers = [_JSON_CONTENT, (b"content-length", str(len(body)).encode()),
               (REASON_HEADER, reason.encode()), *extra]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _new_request_id() -> bytes:
    """24 hex digits, for requests that arrive without an ``x-request-id`` or a ``rid``."""
    return os.urandom(12).hex().encode()


def with_request_id(payload: dict[str, Any], body: bytes, request_id: str) -> bytes:
    """Add ``rid`` so the engine knows the request by the id the gateway can abort.

    The client's bytes are kept as they are (only the key is spliced in), so number formatting
    and key order reach the engine unchanged.
    """
    rid = json.dumps(request_id).encode()
    if not payload:
        return b'{"rid":' + rid + b"}"
    start = body.index(b"{") + 1
    return body[:start] + b'"rid":' + rid + b"," + body[start:]


# Requests answered faster than this never pay for a disconnect watcher task.
_WATCH_AFTER_SECONDS = 0.05


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


class Proxy:
    def __init__(self, admission: Admission, drain: DrainController, pool: EnginePool,
                 metrics: GatewayMetrics, max_body_bytes: int) -> None:
        self._admission = admission
        self._drain = drain
        self._pool = pool
        self._metrics = metrics
        self._max_body_bytes = max_body_bytes

    async def handle(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if scope["method"] != route.method:
            await self._refuse(send, route, Refusal(405, "methodNotAllowed",
                                                    f"{route.name} accepts {route.method} only"))
            return
        if not self._admission.try_admit():
            await self._refuse(send, route, Refusal(503, "draining", "the replica is draining; retry on "
                                                    "another replica"), ((b"retry-after", b"1"),))
            return
        code = 500
        try:
            code = await self._exchange(route, scope, receive, send)
        except Refusal as refusal:
            code = refusal.code
            self._metrics.refused(refusal.reason)
            await send_error(send, refusal.code, refusal.reason, str(refusal))
        finally:
            self._admission.release()
            self._metrics.observe(route.name, code, time.perf_counter() - started)

    async def _refuse(self, send: Send, route: ProxiedRoute, refusal: Refusal,
                      extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        self._metrics.refused(refusal.reason)
        self._metrics.observe(route.name, refusal.code, 0.0)
        await send_error(send, refusal.code, refusal.reason, str(refusal), extra)

    async def _exchange(self, route: ProxiedRoute, scope: Scope, receive: Receive, send: Send) -> int:
        """Forward one admitted request; returns the status code for the metrics."""
        request_id = b""
        forwarded: list[bytes] = []
        declared = 0
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                request_id = value
            elif name == b"content-length":
                declared = int(value) if value.isdigit() else 0
            elif name not in _HOP_BY_HOP:
                forwarded += (name, b": ", value, b"\r\n")
        if declared > self._max_body_bytes:
            raise Refusal(413, "bodyTooLarge", f"the body exceeds {self._max_body_bytes} bytes")
        body = await self._read_body(receive) if route.has_body else b""
        abort_rid: str | None = None
        if route.has_body:
            body, abort_rid, request_id = self._prepare(body, request_id)
        if not request_id:
            request_id = _new_request_id()
        path = scope["raw_path"] or scope["path"].encode()
        if scope["query_string"]:
            path += b"?" + scope["query_string"]
        head = b"".join((route.method.encode(), b" ", path, b" HTTP/1.1\r\nhost: ", self._pool.host_header,
                         b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\nx-request-id: ",
                         request_id, b"\r\n", *forwarded, b"\r\n"))
        exchange = Exchange()
        watcher = _DisconnectWatcher(receive, exchange)
        try:
            await self._pool.send(exchange, head + body)
            await self._respond(exchange, send, request_id)
            return exchange.status
        except ClientGone:
            exchange.discard()
            if abort_rid is not None:
                await self._abort(abort_rid)
            return CLIENT_CLOSED
        except EngineError as exc:
            exchange.discard()
            if exchange.answered:
                # Headers already went out: cutting the stream is the only honest signal left.
                return 502
            raise Refusal(502, exc.reason, str(exc)) from exc
        finally:
            watcher.stop()

    def _prepare(self, body: bytes, request_id: bytes) -> tuple[bytes, str | None, bytes]:
        """Check the JSON body; returns the body to send, the engine rid and the request id."""
        try:
            payload = json.loads(body)
        except ValueError:
            raise Refusal(400, "invalidJson", "the body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise Refusal(400, "invalidJson", "the body must be a JSON object")
        rid = payload.get("rid")
        if isinstance(rid, str):
            return body, rid, request_id or rid.encode()
        if rid is not None:  # a batch: the engine has the client's rids, abort cannot name one
            return body, None, request_id
        request_id = request_id or _new_request_id()
        rid = request_id.decode("latin-1")
        return with_request_id(payload, body, rid), rid, request_id

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole body, refused as soon as it passes the limit (also without a content-length)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refusal(CLIENT_CLOSED, "clientGone", "the client disconnected")
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                raise Refusal(413, "bodyTooLarge", f"the body exceeds {self._max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _respond(self, exchange: Exchange, send: Send, request_id: bytes) -> None:
        headers = [(name, value) for name, value in exchange.headers if name not in _HOP_BY_HOP]
        headers.append((REQUEST_ID_HEADER, request_id))
        if self._drain.state is not DrainState.SERVING:
            headers.append(DRAINING_HEADER)
        if not exchange.streamed:
            body = await exchange.read()
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": exchange.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": exchange.status, "headers": headers})
        async for chunk in exchange.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _abort(self, rid: str) -> None:
        """Stop the engine's work for a client that left; the count drops only after this."""
        try:
            await self._pool.request("POST", "/abort_request", {"rid": rid}, limit_seconds=2.0)
        except (EngineError, TimeoutError):
            pass

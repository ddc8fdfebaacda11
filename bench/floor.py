"""A reference row for ``make bench-gateway``: the least a Python proxy pays per judge request.

Why: the gateway's unloaded added latency is held against nginx's. This process shows how much of
that gap any data path written in Python pays, whatever its design. It is the leanest shape there
is: callbacks only (no task, no future, no ASGI), llhttp (httptools) parsing both ways on uvloop,
one engine connection per request in flight, plus the work no judge gateway can skip (the minted
``rid`` spliced into the body, the engine's head filtered, one counter and one histogram).
It has none of the gateway's limits, admission, timeouts, flow control or error handling, so
it trusts its one client and its engine: a measuring stick, never a product part. Loopback only.

``python -m bench.floor PORT ENGINE_PORT``
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import cast

import httptools
import uvloop
from genrm_gateway.body import RequestIds, engine_body
from genrm_gateway.config import Limits
from prometheus_client import Counter, Histogram

_LIMITS = Limits()
_IDS = RequestIds()
_REQUESTS = Counter("floor_requests", "Requests answered", ["route", "code"])
_DURATION = Histogram("floor_request_duration_seconds", "Request duration", ["route"])
_DROPPED = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server",
                      b"x-request-id"})
_FORWARDED = frozenset({b"content-type", b"accept"})


class _Engine(asyncio.Protocol):
    """One keep-alive engine connection; its answer goes straight to the waiting client."""

    def __init__(self, idle: list[_Engine]) -> None:
        self._idle = idle
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self.client: _Client | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self._idle:
            self._idle.remove(self)

    def send(self, client: _Client, data: bytes) -> None:
        assert self._transport is not None
        self.client = client
        self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        headers, self._headers = self._headers, []
        body = b"".join(self._body)
        self._body.clear()
        self._idle.append(self)
        if client is not None:
            client.answer(self._parser.get_status_code(), headers, body)


class _Client(asyncio.Protocol):
    """One client connection: a request parsed, rewritten and sent on, its answer written back."""

    def __init__(self, idle: list[_Engine], engine_port: int) -> None:
        self._idle = idle
        self._engine_port = engine_port
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._echo = b""
        self._started = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._started = time.perf_counter()
        body, _, self._echo = engine_body(b"".join(self._body), _LIMITS, _IDS)
        self._body.clear()
        head = [b"POST ", self._url, b" HTTP/1.1\r\nhost: engine\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self._headers if name in _FORWARDED]
        self._headers.clear()
        data = b"".join(head) + b"\r\n" + body
        if self._idle:
            self._idle.pop().send(self, data)
        else:
            asyncio.get_running_loop().create_task(self._connect_and_send(data))

    async def _connect_and_send(self, data: bytes) -> None:
        idle = self._idle
        _, engine = await asyncio.get_running_loop().create_connection(
            lambda: _Engine(idle), "127.0.0.1", self._engine_port)
        engine.send(self, data)

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        assert self._transport is not None
        out = [b"HTTP/1.1 ", str(status).encode(), b" \r\n"]
        for name, value in headers:
            if name not in _DROPPED:
                out += (name, b": ", value, b"\r\n")
        out += (b"x-request-id: ", self._echo, b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n\r\n", body)
        self._transport.write(b"".join(out))
        _REQUESTS.labels("/generate", str(status)).inc()
        _DURATION.labels("/generate").observe(time.perf_counter() - self._started)


async def _serve(port: int, engine_port: int) -> None:
    idle: list[_Engine] = []
    server = await asyncio.get_running_loop().create_server(lambda: _Client(idle, engine_port), "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    uvloop.run(_serve(int(sys.argv[1]), int(sys.argv[2])))


if __name__ == "__main__":
    main()

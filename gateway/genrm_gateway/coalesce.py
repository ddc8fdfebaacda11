"""uvicorn's httptools protocol, with a response's head and first body part sent in one write.

Why: uvicorn writes the status line and headers as soon as ``http.response.start`` is sent, and
the body separately, so every proxied response costs two socket writes and often two TCP
segments (two wake-ups at the client). On a 2-core pod each write is a measurable share of the
gateway's per-request CPU. Here the head is held until the next write, or until the current
event-loop iteration ends, so streams still get their headers without waiting for a chunk.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _CoalescingTransport:
    """Delegates to the socket transport; holds one response head back for the next write."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
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

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _CoalescingTransport(transport)  # type: ignore[assignment]

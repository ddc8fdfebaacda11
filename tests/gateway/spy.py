"""A spy engine for attack tests: records every request the gateway sends it, parsed strictly.

Why a spy and not the simulator: the attack oracle is about what reaches the engine (which
routes, how many requests, which headers and ids), so the engine side must see the gateway's
bytes through a strict parser (h11) and keep them. Its admin routes answer 200 like an engine
that would obey, so a smuggled admin call would be recorded, not refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import h11
from genrm_testing import free_port
from genrm_testing.balancer import serving

METRICS = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage 0\n"
STREAM_CHUNK = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"
_ANSWER = b'{"text": "spy verdict: 7"}'
MISBEHAVIOURS = {
    "desync": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(_ANSWER), _ANSWER)
              + b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nstray",
    "status999": b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}",
    "interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s"
               % (len(_ANSWER), _ANSWER),
}
STALLS = frozenset({"silent", "stalled"})


@dataclass(frozen=True)
class Seen:
    """One request as the engine parsed it."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def json(self) -> dict[str, object]:
        document: dict[str, object] = json.loads(self.body)
        return document


@dataclass
class SpyEngine:
    port: int = field(default_factory=free_port)
    seen: list[Seen] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    streamed_bytes: int = 0
    stalled: int = 0
    metrics: bytes = METRICS
    """The ``/metrics`` answer; empty is a 404, so the gateway reads the load from ``/v1/loads``."""
    misbehave: str = ""
    """How the spy breaks HTTP on judge routes: "" (never), "desync" (a stray second response),
    "status999" (an impossible status), "interim" (a 100 Continue before the answer), "silent" (no
    answer at all) or "stalled" (a stream that stops after its first event)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def since(self, mark: int) -> list[Seen]:
        return list(self.seen[mark:])

    def judged(self, mark: int) -> list[Seen]:
        """The ``/generate`` requests seen since ``mark``: the gateway's own background calls (its
        ``/ready`` and load polls) may come in between at any time."""
        return [s for s in self.since(mark) if s.target == "/generate"]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    request, body = event, b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    seen = Seen(request.method.decode(), request.target.decode(),
                                tuple((n.decode(), v.decode("latin-1")) for n, v in request.headers), body)
                    self.seen.append(seen)
                    await self._answer(conn, writer, seen)
                    if conn.our_state is not h11.DONE:  # closed, or answered with raw misbehaviour
                        break
                    conn.start_next_cycle()
                else:  # ConnectionClosed or PAUSED
                    break
        except h11.RemoteProtocolError as exc:
            self.broken.append(f"unparsable request from the gateway: {exc}")
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _answer(self, conn: h11.Connection, writer: asyncio.StreamWriter, seen: Seen) -> None:
        path = seen.target.split("?", 1)[0]
        if path == "/metrics":
            await self._send(conn, writer, 200 if self.metrics else 404, self.metrics, b"text/plain")
            return
        if seen.method != "POST" or not seen.body:
            await self._send(conn, writer, 200, b'{"object":"list","data":[{"id":"spy"}]}')
            return
        try:
            payload = seen.json()
        except ValueError:
            await self._send(conn, writer, 400, b'{"error":"spy: not json"}')
            return
        if self.misbehave in MISBEHAVIOURS:
            writer.write(MISBEHAVIOURS[self.misbehave])
            await writer.drain()
            return
        if self.misbehave in STALLS and path != "/abort_request":
            await self._stall(conn, writer)
            return
        if "answerBytes" in payload:
            await self._large(conn, writer, int(payload["answerBytes"]))  # type: ignore[call-overload]
            return
        if payload.get("stream"):
            await self._stream(conn, writer, int(payload.get("chunks", 4)),  # type: ignore[call-overload]
                               int(payload.get("eventBytes", len(STREAM_CHUNK))),  # type: ignore[call-overload]
                               bool(payload.get("burst")))
            return
        answer = {"text": "spy verdict: 7", "meta_info": {"id": payload.get("rid"), "finish_reason": "stop"}}
        await self._send(conn, writer, 200, json.dumps(answer).encode())

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes,
                    content_type: bytes = b"application/json") -> None:
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    async def _stream(self, conn: h11.Connection, writer: asyncio.StreamWriter, chunks: int,
                      event_bytes: int = len(STREAM_CHUNK), burst: bool = False) -> None:
        """A server-sent-event stream of ``chunks`` events of ``event_bytes``, written as fast as it is
        read; a ``burst`` is written whole with one write (so the gateway reads its last event and
        its end together)."""
        event = b"data: " + b"x" * (event_bytes - 8) + b"\n\n"
        headers = [(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")]
        parts = [conn.send(h11.Response(status_code=200, headers=headers)) or b""]
        for _ in range(chunks):
            parts.append(conn.send(h11.Data(data=event)) or b"")
            if not burst:
                writer.write(b"".join(parts))
                parts.clear()
                await writer.drain()
                self.streamed_bytes += len(event)
        parts.append(conn.send(h11.EndOfMessage()) or b"")
        writer.write(b"".join(parts))
        await writer.drain()
        if burst:
            self.streamed_bytes += chunks * len(event)

    async def _large(self, conn: h11.Connection, writer: asyncio.StreamWriter, size: int) -> None:
        """A non-streamed answer of ``size`` bytes (with a Content-Length), written 64 KiB at a time
        as fast as it is read; ``streamed_bytes`` counts what the gateway took."""
        headers = [(b"content-type", b"application/json"), (b"content-length", str(size).encode())]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        left = size
        while left:
            piece = b"x" * min(left, len(STREAM_CHUNK))
            writer.write(conn.send(h11.Data(data=piece)) or b"")
            await writer.drain()
            left -= len(piece)
            self.streamed_bytes += len(piece)
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    async def _stall(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        """An engine that stops answering: nothing at all ("silent"), or one event of a stream
        ("stalled"); the connection stays open until the gateway gives up on it (or the spy stops)."""
        if self.misbehave == "stalled":
            headers = [(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")]
            writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
            writer.write(conn.send(h11.Data(data=b"data: {}\n\n")) or b"")
            await writer.drain()
        self.stalled += 1
        await asyncio.sleep(3600)


@contextmanager
def running_spy() -> Iterator[SpyEngine]:
    """The spy on a loopback port."""
    spy = SpyEngine()
    with serving(spy._serve, spy.port):
        yield spy

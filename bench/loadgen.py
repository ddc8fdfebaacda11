"""A closed-loop HTTP/1.1 load generator for the gateway benchmark (its own process).

Why not httpx/aiohttp: on a 2-core machine the load generator competes with the engine and the
gateway for CPU, so it must be cheaper per request than either; here each of ``concurrency``
workers owns one keep-alive connection, sends pre-built bytes and parses the reply with httptools.
Loopback targets only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

import httptools
import uvloop


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float


class _Client(asyncio.Protocol):
    """One keep-alive connection; ``call`` sends a request and waits for a complete response."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._done: asyncio.Future[int] | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError("connection lost"))

    def on_message_complete(self) -> None:
        self.reusable = self._parser.should_keep_alive()
        if self._done is not None and not self._done.done():
            self._done.set_result(self._parser.get_status_code())

    async def call(self, request: bytes) -> int:
        assert self._transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return await self._done


async def _worker(port: int, request: bytes, stop_at: float, record_from: float,
                  latencies: array[float], counts: list[int], budget: list[int]) -> None:
    loop = asyncio.get_running_loop()
    client: _Client | None = None
    while budget[0] > 0:
        if client is None or not client.reusable:
            _, client = await loop.create_connection(_Client, "127.0.0.1", port)
        started = time.perf_counter()
        if started >= stop_at:
            return
        budget[0] -= 1
        try:
            status = await client.call(request)
        except ConnectionError:
            status, client = 0, None
        if started >= record_from:
            latencies.append(time.perf_counter() - started)
            counts[0 if status == 200 else 1] += 1


async def run_load(port: int, path: str, body: bytes, concurrency: int, seconds: float,
                   warmup: float, max_requests: int) -> LoadResult:
    request = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    latencies: array[float] = array("d")
    counts = [0, 0]
    now = time.perf_counter()
    record_from, stop_at = now + warmup, now + warmup + seconds
    await asyncio.gather(*(_worker(port, request, stop_at, record_from, latencies, counts,
                                   [max_requests // concurrency]) for _ in range(concurrency)))
    elapsed = time.perf_counter() - record_from
    ordered = sorted(latencies)
    if not ordered:
        return LoadResult(0, counts[1], 0.0, float("nan"), float("nan"))
    return LoadResult(
        requests=counts[0],
        errors=counts[1],
        rps=len(ordered) / elapsed,
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/generate")
    parser.add_argument("--body", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--max-requests", type=int, default=200_000)
    args = parser.parse_args(argv)
    result = uvloop.run(run_load(args.port, args.path, args.body.encode(), args.concurrency,
                                 args.seconds, args.warmup, args.max_requests))
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()

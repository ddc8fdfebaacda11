"""What the gateway knows about its engine: up, healthy (past warm-up), and its load.

Why a background poll: readiness, the drain's "engine idle" witness and the re-exported load
gauges all need the engine's view, and one poll per interval keeps that cost off the request
path and bounded however often the kubelet, the operator and Prometheus ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from genrm_gateway.upstream import EngineError, EnginePool

_LOAD_SERIES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:token_usage": "token_usage",
}


@dataclass(frozen=True)
class EngineLoad:
    running: int | None = None
    queued: int | None = None
    token_usage: float | None = None

    @property
    def busy(self) -> bool | None:
        """None when unknown: a missing series is never taken for zero."""
        if self.running is None or self.queued is None:
            return None
        return self.running + self.queued > 0


def parse_sglang_metrics(text: str) -> EngineLoad:
    """Sum the load gauges over their label sets (one per DP rank)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = _LOAD_SERIES.get(name)
        if field is not None:
            with contextlib.suppress(ValueError, IndexError):
                sums[field] = sums.get(field, 0.0) + float(line.rsplit(" ", 1)[1])
    running, queued = sums.get("running"), sums.get("queued")
    return EngineLoad(
        running=None if running is None else int(running),
        queued=None if queued is None else int(queued),
        token_usage=sums.get("token_usage"),
    )


def parse_get_load(payload: object) -> EngineLoad:
    """SGLang's ``/get_load``: per-rank ``num_reqs`` (running + waiting) and ``num_waiting_reqs``."""
    ranks = payload if isinstance(payload, list) else [payload]
    total = waiting = 0
    for rank in ranks:
        if not isinstance(rank, dict):
            return EngineLoad()
        total += int(rank.get("num_reqs", 0))
        waiting += int(rank.get("num_waiting_reqs", 0))
    return EngineLoad(running=total - waiting, queued=waiting)


class EngineMonitor:
    """Polls ``/health`` and the load (``/metrics``, else ``/get_load``) every interval."""

    def __init__(self, pool: EnginePool, interval: float) -> None:
        self._pool = pool
        self._interval = interval
        self.up = False
        self.healthy = False
        self.load = EngineLoad()
        self.idle_since: float | None = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def poll(self) -> None:
        try:
            status, _ = await self._pool.request("GET", "/health", limit_seconds=max(self._interval, 5.0))
            self.up, self.healthy = True, status == 200
            self.load = await self._fetch_load()
        except (EngineError, TimeoutError):
            self.up = self.healthy = False
            self.load = EngineLoad()
        busy = self.load.busy
        if busy:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()

    async def _fetch_load(self) -> EngineLoad:
        status, body = await self._pool.request("GET", "/metrics")
        if status == 200:
            load = parse_sglang_metrics(body.decode(errors="replace"))
            if load.busy is not None:
                return load
        status, body = await self._pool.request("GET", "/get_load")
        if status != 200:
            return EngineLoad()
        try:
            return parse_get_load(json.loads(body))
        except (ValueError, TypeError):
            return EngineLoad()

    async def _run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._interval)

"""What the gateway knows about its engine: up, healthy (past warm-up), and its load.

Why a background poll: readiness, the drain's "engine idle" witness and the re-exported load
gauges all need the engine's view, and one poll per interval keeps that cost off the request
path and bounded however often the kubelet, the operator and Prometheus ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass

from genrm_gateway.upstream import EngineError, EnginePool

_LOAD_SERIES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:token_usage": "token_usage",
}


# A Prometheus text sample: name, the label block (escaped quotes allowed in values), the value.
_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})?'
                     r"[ \t]+(\S+)(?:[ \t]+\S+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


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
    """The engine's load from SGLang's scheduler gauges, each request counted once.

    - With ``--enable-priority-scheduling`` SGLang exports each count twice over: the total under
      ``priority=""`` and a breakdown under ``priority="<value>"`` (``_log_gauge_queue_count``, with
      ``"None"`` for requests without one). Only series whose ``priority`` is empty or absent are
      totals, so the breakdowns are skipped.
    - With data parallelism every DP rank is its own scheduler with its own series (``dp_rank``):
      request counts are summed over ranks. Token usage is each rank's share of its own KV pool, so
      adding ranks' ratios means nothing; the replica's is the fullest rank's (the max), because a
      rank whose pool is full queues and retracts its requests whatever the others hold, and the
      autoscaler's KV-cache signal is a saturation guard (it already takes the max over pods).
    """
    sums: dict[str, float] = {}
    usage: float | None = None
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = _LOAD_SERIES.get(name)
        if field is None:
            continue
        sample = _SAMPLE.fullmatch(line.strip())
        if sample is None:
            continue
        labels, raw = sample.group(2) or "", sample.group(3)
        if any(key == "priority" and value for key, value in _LABEL.findall(labels)):
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if field == "token_usage":
            usage = value if usage is None else max(usage, value)
        else:
            sums[field] = sums.get(field, 0.0) + value
    running, queued = sums.get("running"), sums.get("queued")
    return EngineLoad(
        running=None if running is None else int(running),
        queued=None if queued is None else int(queued),
        token_usage=usage,
    )


def parse_v1_loads(payload: object) -> EngineLoad:
    """SGLang's ``/v1/loads``: ``loads`` holds one entry per DP rank with running and waiting counts."""
    ranks = payload.get("loads") if isinstance(payload, dict) else None
    if not isinstance(ranks, list) or not ranks:
        return EngineLoad()
    running = queued = 0
    for rank in ranks:
        if not isinstance(rank, dict):
            return EngineLoad()
        running += int(rank.get("num_running_reqs", 0))
        queued += int(rank.get("num_waiting_reqs", 0))
    return EngineLoad(running=running, queued=queued)


UNHEALTHY_AFTER_TIMEOUTS = 3
"""Readiness polls in a row that may time out before the engine counts as hung (unready)."""

DOWN_POLL_SECONDS = 0.1
"""How often an unreachable engine is polled. Requests that found it down wait for it (up to the
engine wait), and each poll interval is added to their wait once the restarted engine listens:
the usual one-second interval was a sizeable part of a crashed simulator's whole restart
(figures: docs/performance.md#measurements-behind-the-code), and a refused connection costs next
to nothing to ask for ten times a second."""


class EngineMonitor:
    """Polls ``/ready`` and the load (``/metrics``, else ``/v1/loads``) every interval, and an
    engine that does not answer at all every ``DOWN_POLL_SECONDS``.

    Why ``/ready`` and not ``/health``: SGLang's ``/health`` pushes a one-token generation through
    the scheduler and takes a second or more; polled every interval it would add load and, when
    slow, flap readiness. ``/ready`` reads the engine's own readiness flag.
    """

    def __init__(self, pool: EnginePool, interval: float) -> None:
        self._pool = pool
        self._interval = interval
        self.up = False
        self.healthy = False
        self.load = EngineLoad()
        self.idle_since: float | None = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._recheck = asyncio.Event()
        self._timeouts = 0
        self._up = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def poll(self) -> None:
        """Read readiness and load. An engine that answers slowly is busy, not down: one timeout
        keeps the last verdict (marking a loaded engine down would refuse the work it is doing
        and flap readiness); ``UNHEALTHY_AFTER_TIMEOUTS`` in a row make it unready (a hung
        engine), and a refused or broken connection marks it down at once."""
        try:
            status, _ = await self._pool.request("GET", "/ready", limit_seconds=max(self._interval, 2.0))
            self.up, self.healthy, self._timeouts = True, status == 200, 0
            self._up.set()
            self.load = await self._fetch_load()
        except EngineError:
            self.up = self.healthy = False
            self._up.clear()
            self.load = EngineLoad()
        except TimeoutError:
            self._timeouts += 1
            if self._timeouts >= UNHEALTHY_AFTER_TIMEOUTS:
                self.healthy = False
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
        status, body = await self._pool.request("GET", "/v1/loads?include=core")
        if status != 200:
            return EngineLoad()
        try:
            return parse_v1_loads(json.loads(body))
        except (ValueError, TypeError):
            return EngineLoad()

    def mark_down(self) -> None:
        """The engine refused a connection: unready now, not at the next poll (which brings it back)."""
        self.up = self.healthy = False
        self._up.clear()
        self._recheck.set()

    async def wait_up(self, seconds: float) -> bool:
        """Whether the engine answers again within ``seconds`` (a restarted container often does)."""
        try:
            async with asyncio.timeout(seconds):
                await self._up.wait()
        except TimeoutError:
            return False
        return True

    def recheck(self) -> None:
        """An engine connection broke under a request: poll now instead of at the next interval."""
        self._recheck.set()

    async def _run(self) -> None:
        while True:
            await self.poll()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval if self.up else min(self._interval, DOWN_POLL_SECONDS)):
                    await self._recheck.wait()
            self._recheck.clear()

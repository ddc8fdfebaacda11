"""The engine's timing model: warm-up, a bounded running batch with a queue, TTFT and ITL.

Why: the gateway's drain and the autoscaler both read the engine's load (running and queued
requests, KV usage), and tests need requests that are provably in flight. The model is therefore
a real scheduler over asyncio tasks, not a fixed sleep, and it knows each request by its ``rid``
so ``/abort_request`` works like SGLang's and a second request under an id still in flight is refused
(SGLang's "Duplicate request ID").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from genrm_sim.answers import Answer
from genrm_sim.config import SimConfig
from genrm_sim.metrics import SimMetrics


class DuplicateRequest(ValueError):
    """A request id that names a request still in flight."""


@dataclass
class Timeline:
    """When one request reached each stage (``time.time()``, 0.0 until then): SGLang reports them in
    its ``meta_info``."""

    received: float = field(default_factory=time.time)
    scheduled: float = 0.0
    first_token: float = 0.0
    finished: float = 0.0


@dataclass
class Job:
    """One generation request while the scheduler knows it."""

    rid: str
    prompt_tokens: int
    answer: Answer
    stream: bool = False
    log_metrics: bool = True
    """False for SGLang's internal health-check generation, which its request metrics leave out."""
    priority: int | None = None
    generated: int = 0
    running: bool = False
    """Whether it holds a slot of the running batch (else it waits in the queue)."""
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    timeline: Timeline = field(default_factory=Timeline)


class Scheduler:
    """Admits jobs into at most ``max_running`` slots and paces their tokens."""

    def __init__(self, config: SimConfig, metrics: SimMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._slots = asyncio.Semaphore(config.max_running)
        self._jobs: dict[str, Job] = {}
        self._running = 0
        self._started = time.monotonic()
        self._served = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.exiting = False
        self.unhealthy = False
        self.last_output = 0.0
        """``time.monotonic()`` of the last token any request produced (what SGLang's health check waits for)."""

    @property
    def warm(self) -> bool:
        return time.monotonic() - self._started >= self._config.startup_seconds

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return len(self._jobs) - self._running

    @property
    def pending(self) -> int:
        """Requests known to the engine, running or queued."""
        return len(self._jobs)

    def by_priority(self, running: bool) -> dict[int | None, int]:
        """Running (or queued) requests per priority, as SGLang's ``QueueCount.from_reqs``."""
        counts: dict[int | None, int] = {}
        for job in self._jobs.values():
            if job.running is running:
                counts[job.priority] = counts.get(job.priority, 0) + 1
        return counts

    @property
    def used_tokens(self) -> int:
        return sum(job.prompt_tokens + job.generated for job in self._jobs.values())

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def abort(self, rid: str | None, abort_all: bool = False) -> int:
        """Abort as SGLang does; returns how many jobs were aborted.

        SGLang's tokenizer manager drops an abort whose rid is empty or not in flight; the
        scheduler then aborts every request whose rid *starts with* the given one
        (``req.rid.startswith(recv_req.rid)``), so an id that is the start of another aborts both.
        """
        if abort_all:
            victims = list(self._jobs.values())
        elif not rid or rid not in self._jobs:
            victims = []
        else:
            victims = [job for job in self._jobs.values() if job.rid.startswith(rid)]
        for job in victims:
            job.aborted.set()
        return len(victims)

    def submit(self, job: Job) -> None:
        """Register ``job`` under its rid before any of it runs; refuses a rid still in flight."""
        if job.rid in self._jobs:
            raise DuplicateRequest(f"Duplicate request ID detected: {job.rid}")
        self._jobs[job.rid] = job
        self._idle.clear()

    def release(self, job: Job) -> None:
        """Forget a submitted job (idempotent: also for a streamed job whose client left before it ran)."""
        if self._jobs.get(job.rid) is job:
            del self._jobs[job.rid]
            if not self._jobs:
                self._idle.set()

    async def generate(self, job: Job) -> AsyncIterator[str]:
        """Yield a submitted job's tokens at the modelled pace; stops early (no error) when aborted."""
        arrived = time.monotonic()
        try:
            async with self._slots:
                self._running += 1
                job.running = True
                job.timeline.scheduled = time.time()
                try:
                    if job.log_metrics:
                        self._metrics.queue_time.observe(time.monotonic() - arrived)
                    async for token in self._paced(job, arrived):
                        self.last_output = time.monotonic()
                        yield token
                    if not job.aborted.is_set():
                        self.last_output = time.monotonic()
                finally:
                    self._running -= 1
                    job.running = False
        finally:
            job.timeline.finished = time.time()
            self.release(job)
            if job.log_metrics:
                self._metrics.finished(job, time.monotonic() - arrived)

    async def _paced(self, job: Job, arrived: float) -> AsyncIterator[str]:
        self._served += job.log_metrics
        crash_after = self._config.crash_after
        if self._config.hang:
            await job.aborted.wait()
            return
        if not await self._pause(job, self._config.ttft_ms):
            return
        if crash_after is not None and self._served > crash_after:
            print(f"genrm-sim: injected crash after {crash_after} requests", file=sys.stderr, flush=True)
            os._exit(1)
        for index, token in enumerate(job.answer.tokens):
            if index == 0:
                job.timeline.first_token = time.time()
                if job.log_metrics:
                    self._metrics.first_token(job, time.monotonic() - arrived)
            elif not await self._pause(job, self._config.itl_ms):
                return
            job.generated += 1
            yield token

    @staticmethod
    async def _pause(job: Job, milliseconds: float) -> bool:
        """Sleep unless aborted meanwhile; returns whether the job should go on."""
        if milliseconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.aborted.wait(), milliseconds / 1000.0)
        return not job.aborted.is_set()

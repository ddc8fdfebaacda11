"""The asyncio client: for verl's, slime's and Relax's async reward hooks, and for batches.

Every call of one client (single calls from a framework's own concurrency, and batches) goes
through one adaptive in-flight window (`genrm_client.window`): the client, not each caller, keeps
the pool from being overrun, and the window learns from all of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import httpx

from genrm_client import transport, wire
from genrm_client.call import Attempts, Sleep, attempts
from genrm_client.calls import JudgeRequest
from genrm_client.config import PoolConfig
from genrm_client.errors import JudgeError, Unjudged
from genrm_client.judge import HINT_POLICY, Judge, failed, pinned, settle
from genrm_client.retry import Cause, Outcome
from genrm_client.step import Step, entered
from genrm_client.verdict import Verdict
from genrm_client.window import Signal, WindowLaw, WindowState, next_window, signal_of


class Window:
    """The in-flight window of one client: calls wait for a slot; outcomes move the window."""

    def __init__(self, law: WindowLaw) -> None:
        self.law = law
        self.state = WindowState(float(law.initial))
        self.inflight = 0
        self._changed = asyncio.Condition()

    def signal(self, signal: Signal) -> None:
        self.state = next_window(self.state, signal, time.monotonic(), self.law)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: self.inflight < self.state.slots)
            self.inflight += 1
        try:
            yield
        finally:
            async with self._changed:
                self.inflight -= 1
                self._changed.notify_all()


class AsyncJudgeClient(Judge[Coroutine[Any, Any, Verdict]]):
    """Judge calls for an event loop. ``async with AsyncJudgeClient(url, api_key=...) as judge:``."""

    def __init__(self, url: str | PoolConfig, api_key: str | None = None, *, seed: int | None = None,
                 http_transport: httpx.AsyncBaseTransport | None = None, **settings: Any) -> None:
        """``settings`` are :class:`PoolConfig`'s; ``http_transport`` replaces httpx's (a proxy, a test's
        mock); ``seed`` fixes the retry jitter."""
        super().__init__(url, api_key, seed, settings)
        config = self.config
        self.window = Window(config.window)
        self._http = httpx.AsyncClient(base_url=config.url,
                                       timeout=transport.timeout(config.read_timeout_s, config.connect_timeout_s),
                                       limits=httpx.Limits(max_connections=config.max_connections),
                                       transport=http_transport)

    async def call(self, request: JudgeRequest) -> Verdict:
        """The verdict of ``request``, retried as `genrm_client.retry` allows; a typed error otherwise."""
        async with self.window.slot():
            try:
                verdict = await self._drive(attempts(request, self.config.policy, self._rng))
            except JudgeError as error:
                overload = error.status == 429 or error.reason in wire.OVERLOAD_REASONS
                self.window.signal(signal_of(False, overload, 0.0, self.window.law))
                raise failed(error) from None
            self.window.signal(signal_of(True, False, verdict.latency_s, self.window.law))
            return settle(verdict)

    async def judge_many(self, requests: Iterable[JudgeRequest],
                         progress: Callable[[int, int], None] | None = None) -> list[Verdict | Unjudged]:
        """Every request's verdict, in order, or :class:`Unjudged` with its error; at most the window's
        size in flight. ``progress(done, total)`` is called as calls end."""
        batch = list(requests)
        done = 0

        async def one(request: JudgeRequest) -> Verdict | Unjudged:
            nonlocal done
            try:
                return await self.call(request)
            except JudgeError as error:
                return Unjudged(error)
            finally:
                done += 1
                if progress is not None:
                    progress(done, len(batch))

        return list(await asyncio.gather(*(one(request) for request in batch)))

    @asynccontextmanager
    async def step(self, number: int, *, expected: int | None = None, within_s: float | None = None,
                   starts_within_s: int = 0, revision: str | None = None) -> AsyncIterator[Step]:
        """A training step's judge phase (`genrm_client.step`); see ``JudgeClient.step``. Tasks created
        in the block count toward the step (they inherit its context)."""
        step, hint = self._new_step(number, expected, within_s, starts_within_s, revision)
        if hint is not None:
            try:
                await self._drive(attempts(hint, HINT_POLICY, self._rng))
            except JudgeError as error:
                step.hint_error = str(error)
        with entered(step):
            yield step

    async def _drive(self, plan: Attempts) -> Verdict:
        outcome: Outcome | None = None
        try:
            while True:
                action = plan.send(outcome)
                if isinstance(action, Sleep):
                    if action.cause is Cause.OVERLOAD:
                        self.window.signal(Signal.OVERLOAD)
                    await asyncio.sleep(action.seconds)
                    outcome = None
                else:
                    outcome = await self._send(action.request)
        except StopIteration as done:
            verdict: Verdict = done.value
            return verdict

    async def _send(self, request: JudgeRequest) -> Outcome:
        built = self._http.build_request("POST", request.path, json=dict(request.body),
                                         headers=transport.headers(request, self.config.api_key, pinned()))
        try:
            response = await self._http.send(built, stream=True)
        except httpx.TransportError as exc:
            return transport.before_answer(exc)
        try:
            return transport.answer(response, await response.aread())
        except httpx.TransportError as exc:
            return transport.during_answer(exc)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncJudgeClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self.aclose()

"""The blocking client, for training code without an event loop (and OpenRLHF's threads)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import httpx

from genrm_client import transport
from genrm_client.call import Attempts, Sleep, attempts
from genrm_client.calls import JudgeRequest
from genrm_client.config import PoolConfig
from genrm_client.errors import JudgeError, Unjudged
from genrm_client.judge import HINT_POLICY, Judge, failed, pinned, settle
from genrm_client.retry import Outcome
from genrm_client.step import Step, current, entered
from genrm_client.verdict import Verdict


class JudgeClient(Judge[Verdict]):
    """Judge calls that block; thread-safe. ``JudgeClient("http://judge.rl.svc:8000", api_key=...)``."""

    def __init__(self, url: str | PoolConfig, api_key: str | None = None, *, seed: int | None = None,
                 http_transport: httpx.BaseTransport | None = None, **settings: Any) -> None:
        """``settings`` are :class:`PoolConfig`'s; ``http_transport`` replaces httpx's (a proxy, a test's
        mock); ``seed`` fixes the retry jitter."""
        super().__init__(url, api_key, seed, settings)
        config = self.config
        self._http = httpx.Client(base_url=config.url,
                                  timeout=transport.timeout(config.read_timeout_s, config.connect_timeout_s),
                                  limits=httpx.Limits(max_connections=config.max_connections),
                                  transport=http_transport)

    def call(self, request: JudgeRequest) -> Verdict:
        """The verdict of ``request``, retried as `genrm_client.retry` allows; a typed error otherwise."""
        try:
            verdict = self._drive(attempts(request, self.config.policy, self._rng))
        except JudgeError as error:
            raise failed(error) from None
        return settle(verdict)

    def judge_many(self, requests: Iterable[JudgeRequest],
                   progress: Callable[[int, int], None] | None = None) -> list[Verdict | Unjudged]:
        """Every request's verdict, in order, or :class:`Unjudged` with its error, with the adaptive
        window of the async client (run on a thread of its own, so this works inside a running event
        loop's thread too). ``progress(done, total)`` is called as calls end."""
        from genrm_client.aio import AsyncJudgeClient  # the async client imports nothing of this one

        step, batch = current(), list(requests)

        async def run() -> list[Verdict | Unjudged]:
            async with AsyncJudgeClient(self.config) as client:
                if step is None:
                    return await client.judge_many(batch, progress)
                with entered(step):
                    return await client.judge_many(batch, progress)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, run()).result()

    @contextmanager
    def step(self, number: int, *, expected: int | None = None, within_s: float | None = None,
             starts_within_s: int = 0, revision: str | None = None) -> Iterator[Step]:
        """A training step's judge phase (`genrm_client.step`): sends the demand hint for ``expected``
        calls over ``within_s`` seconds, pins one revision, and counts every call made in the block."""
        step, hint = self._new_step(number, expected, within_s, starts_within_s, revision)
        if hint is not None:
            try:
                self._drive(attempts(hint, HINT_POLICY, self._rng))
            except JudgeError as error:
                step.hint_error = str(error)
        with entered(step):
            yield step

    def _drive(self, plan: Attempts) -> Verdict:
        outcome: Outcome | None = None
        try:
            while True:
                action = plan.send(outcome)
                if isinstance(action, Sleep):
                    time.sleep(action.seconds)
                    outcome = None
                else:
                    outcome = self._send(action.request)
        except StopIteration as done:
            verdict: Verdict = done.value
            return verdict

    def _send(self, request: JudgeRequest) -> Outcome:
        built = self._http.build_request("POST", request.path, json=dict(request.body),
                                         headers=transport.headers(request, self.config.api_key, pinned()))
        try:
            response = self._http.send(built, stream=True)
        except httpx.TransportError as exc:
            return transport.before_answer(exc)
        try:
            return transport.answer(response, response.read())
        except httpx.TransportError as exc:
            return transport.during_answer(exc)
        finally:
            response.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


"""What both clients share: the routes as methods, and how a step starts and counts its calls.

Why a generic base: the sync client returns verdicts and the async one coroutines of verdicts; the
route methods only build a request and hand it to ``call``, so they are written once for both, over
the type ``call`` returns.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from genrm_client import calls
from genrm_client.calls import JudgeRequest
from genrm_client.config import PoolConfig
from genrm_client.errors import JudgeError
from genrm_client.retry import RetryPolicy
from genrm_client.step import Step, current
from genrm_client.verdict import Verdict

R = TypeVar("R")

HINT_POLICY = RetryPolicy(deadline_s=10.0, max_attempts=4)
"""A demand hint is advice sent ahead of the phase: a few quick tries, then the step goes on without it."""


class Judge(Generic[R]):
    """The routes of a pool; ``call`` is the client's (sync: a verdict; async: a coroutine of one)."""

    def __init__(self, url: str | PoolConfig, api_key: str | None, seed: int | None,
                 settings: Mapping[str, Any]) -> None:
        self.config = url if isinstance(url, PoolConfig) else PoolConfig(url.rstrip("/"), api_key, **settings)
        self._rng = random.Random(seed)

    def call(self, request: JudgeRequest) -> R:
        raise NotImplementedError

    def chat(self, messages: Sequence[Mapping[str, Any]], **params: Any) -> R:
        """OpenAI chat completions; ``params`` as the API's (``temperature``, ``max_tokens``, ...)."""
        return self.call(calls.chat(messages, self.config.model, **params))

    def generate(self, text: str | Sequence[str] | None = None, *, input_ids: Sequence[int] | None = None,
                 sampling_params: Mapping[str, Any] | None = None, **extra: Any) -> R:
        """SGLang's native ``/generate``."""
        return self.call(calls.generate(text, input_ids=input_ids, sampling_params=sampling_params, **extra))

    def classify(self, text: str | Sequence[str], **extra: Any) -> R:
        """SGLang's native ``/classify`` (a reward model's scores)."""
        return self.call(calls.classify(text, **extra))

    def _new_step(self, number: int, expected: int | None, within_s: float | None, starts_within_s: int,
                  revision: str | None) -> tuple[Step, JudgeRequest | None]:
        """A step, and its demand hint when the trainer said how many calls it expects."""
        hint = None
        if expected is not None:
            hint = calls.demand(f"{self.config.hint_prefix}-step-{number}", expected,
                                round(within_s if within_s is not None else 60), starts_within_s)
        return Step(number, revision), hint


def settle(verdict: Verdict) -> Verdict:
    """A verdict, counted by the current step (which raises if another revision answered it)."""
    step = current()
    return verdict if step is None else step.verdict(verdict)


def pinned() -> str | None:
    """The revision the current step pins its calls to (``Step.pin``), when it has one."""
    step = current()
    return None if step is None else step.pin


def failed(error: JudgeError) -> JudgeError:
    """An error, counted by the current step."""
    step = current()
    if step is not None:
        step.failure(error)
    return error

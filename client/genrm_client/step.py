"""A training step's judge phase: its demand hint, its one judge revision, and its figures.

Why a step: a trainer reasons per step. Its verdicts must come from one judge (rewards from two
revisions in one batch are not comparable), its judge phase is a burst the pool can prepare for (a
demand hint), and its figures (verdicts, failures, retries, latency) are what an RL engineer logs
next to the loss. Revisions are read from the answers (the pool's ``x-genrm-revision`` header, else
SGLang's ``weight_version``, for an engine reached without the pool's gateway), and the first
revision a step sees pins it; a verdict of another revision is :class:`MixedJudges`. Time held at
zero is what the pool's activator says on each answer it held (``x-genrm-held-seconds``).
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from genrm_client.errors import JudgeError, MixedJudges
from genrm_client.verdict import Verdict


@dataclass(frozen=True)
class StepReport:
    """A step's figures, for the training log."""

    step: int
    verdicts: int
    unjudged: int
    errors: Mapping[str, int]
    """Calls without a verdict, by error type (``JudgeUnavailable``, ``Refused``, ...)."""
    retries: Mapping[str, int]
    """Retries by cause (``connect``, ``closed``, ``unavailable``, ``overload``)."""
    p50_s: float | None
    p99_s: float | None
    revision: str | None
    hint_error: str | None = None
    held_s: float = 0.0
    """Time the step's verdicts spent held by the pool's activator while the pool was at zero (summed
    over calls: a wake-up the step's calls waited for together counts once per call)."""
    """Why the step's demand hint was not taken, if it was not (a hint is advice: the step goes on)."""

    def line(self) -> str:
        """One log line: ``judge step=12 verdicts=4096 unjudged=0 retries=3 p50=0.41s p99=2.3s rev=abc``."""
        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.3g}s"
        return (f"judge step={self.step} verdicts={self.verdicts} unjudged={self.unjudged} "
                f"retries={sum(self.retries.values())} p50={seconds(self.p50_s)} p99={seconds(self.p99_s)} "
                f"held={self.held_s:.3g}s rev={self.revision or '-'}")


@dataclass
class Step:
    """The running figures of one step (thread-safe: a sync client's calls may come from threads)."""

    number: int
    revision: str | None = None
    """The pinned revision: given, else the first one seen."""
    hint_error: str | None = None
    pin: str | None = field(init=False, default=None)
    """What the step's calls send as ``x-genrm-revision`` (only that judge may answer them): the given
    revision, else the first one a gateway of the pool named; None until then. A revision read from
    the engine's body alone is not sent: no gateway named it, so none would check it."""
    _latencies: list[float] = field(default_factory=list)
    _errors: Counter[str] = field(default_factory=Counter)
    _retries: Counter[str] = field(default_factory=Counter)
    _held_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.pin = self.revision

    def verdict(self, verdict: Verdict) -> Verdict:
        """Count ``verdict``, or raise :class:`MixedJudges` if another revision answered it."""
        with self._lock:
            self._retries.update(verdict.retries)
            if verdict.revision is not None and self.revision is None:
                self.revision = verdict.revision
            if verdict.revision is not None and verdict.revision != self.revision:
                self._errors[MixedJudges.__name__] += 1
                raise MixedJudges(f"step {self.number} is pinned to revision {self.revision!r}, but revision "
                                  f"{verdict.revision!r} answered request {verdict.request_id}",
                                  (self.revision or "", verdict.revision))
            if verdict.gateway_named and self.pin is None:
                self.pin = verdict.revision
            self._latencies.append(verdict.latency_s)
            self._held_s += verdict.held_s
        return verdict

    def failure(self, error: JudgeError) -> None:
        """Count a call that ended without a verdict."""
        with self._lock:
            self._errors[type(error).__name__] += 1
            self._retries.update(error.retries)

    def report(self) -> StepReport:
        with self._lock:
            ordered = sorted(self._latencies)
            return StepReport(self.number, len(ordered), sum(self._errors.values()), dict(self._errors),
                              dict(self._retries), percentile(ordered, 50), percentile(ordered, 99), self.revision,
                              self.hint_error, self._held_s)


def percentile(ordered: list[float], p: float) -> float | None:
    """The nearest-rank percentile of sorted values (None for none)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


_current: contextvars.ContextVar[Step | None] = contextvars.ContextVar("genrm_client_step", default=None)


def current() -> Step | None:
    """The step the calling code runs in (async tasks started inside it inherit it)."""
    return _current.get()


@contextmanager
def entered(step: Step) -> Iterator[Step]:
    """Make ``step`` the current one for the block."""
    token = _current.set(step)
    try:
        yield step
    finally:
        _current.reset(token)

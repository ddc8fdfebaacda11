"""What a failing reconcile step does next: when it is retried, and what the pool's status says.

A step that raises (an API server error other than a Conflict, an unreadable object, a bug) is
retried after a capped exponential back-off, the work queue's rate limiter of controller-runtime
in small: ``RETRY_BASE_SECONDS`` doubling per failure in a row up to ``RETRY_MAX_SECONDS``, reset by
the first step that succeeds. Events still wake the step early (a user's fix is acted on at once);
only the retry of a failure waits. From ``REPEATED_FAILURES`` failures in a row on, the status shows
condition ``ReconcileFailed=True`` with the step's stage and the error; the next successful step
writes the status the core computes, which does not carry it (`core.reconcile` builds every
condition anew), so recovery clears it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.base import format_time
from ..api.pool import GenRMPoolStatus
from ..api.status import Condition, ConditionReason, ConditionStatus, ConditionType
from .clock import stamp
from .conditions import find, set_condition

RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
REPEATED_FAILURES = 3
"""Failures in a row from which the status shows ``ReconcileFailed``: one or two are usually a
passing API server hiccup, retried within seconds."""
MESSAGE_LIMIT = 1024
"""The error's message is cut here: some API server answers carry the whole object."""


def retry_delay(failures: int) -> float:
    """Seconds until the retry after ``failures`` failed steps in a row (0 when none failed)."""
    if failures <= 0:
        return 0.0
    return min(RETRY_BASE_SECONDS * 2.0 ** min(failures - 1, 32), RETRY_MAX_SECONDS)


@dataclass(frozen=True)
class Failure:
    """One failed step: where it failed and what was raised."""

    stage: str
    """The part of the step that raised (``read``, ``children``, ``observe``, ``decide``, ``write``, ...)."""
    error: str
    """The exception's class name."""
    message: str

    def describe(self) -> str:
        """``write: ApiException: (422) ...``."""
        return f"{self.stage}: {self.error}: {self.message}"[:MESSAGE_LIMIT]


@dataclass(frozen=True)
class Failures:
    """The failed steps in a row of one pool (none after a success)."""

    count: int = 0
    last: Failure | None = None
    since: float = 0.0
    """When the first of them failed (seconds since the epoch)."""

    def failed(self, failure: Failure, now: float) -> Failures:
        """One more failure in a row."""
        return Failures(count=self.count + 1, last=failure, since=self.since if self.count else now)

    def is_new(self, failure: Failure) -> bool:
        """Whether ``failure`` differs in stage or error class from the one before it in this row: its
        traceback is worth logging once, the same one again is not."""
        last = self.last
        return last is None or (last.stage, last.error) != (failure.stage, failure.error)

    @property
    def delay(self) -> float:
        """Seconds until the next attempt (`retry_delay`)."""
        return retry_delay(self.count)

    @property
    def repeated(self) -> bool:
        """Whether the status should show them (`REPEATED_FAILURES`)."""
        return self.count >= REPEATED_FAILURES and self.last is not None


def failed_status(status: GenRMPoolStatus, failures: Failures, generation: int, now: float) -> GenRMPoolStatus:
    """``status`` with condition ``ReconcileFailed=True`` describing ``failures``, or ``status`` itself
    when they are not repeated yet or it already says so (nothing to write)."""
    if not failures.repeated or failures.last is None:
        return status
    message = (f"{failures.last.describe()} (failing since {format_time(stamp(failures.since))}; retried with "
               f"back-off up to {RETRY_MAX_SECONDS:g}s)")
    condition = set_condition(status.conditions, ConditionType.RECONCILE_FAILED, ConditionStatus.TRUE,
                              ConditionReason.RECONCILE_ERROR, message, now, generation)
    old = find(status.conditions, ConditionType.RECONCILE_FAILED)
    if old is not None and _same(old, condition):
        return status
    return status.evolve(conditions=[*(c for c in status.conditions if c.type != ConditionType.RECONCILE_FAILED),
                                     condition])


def _same(a: Condition, b: Condition) -> bool:
    return (a.status, a.reason, a.message, a.observed_generation) == (b.status, b.reason, b.message,
                                                                      b.observed_generation)

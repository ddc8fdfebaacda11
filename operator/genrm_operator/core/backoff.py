"""The back-off of new replicas after failed operations (CrashLoopBackOff for a pool's creates)."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.base import format_time
from ..api.status import ConditionReason, HistoryEntry, OperationPhase
from .clock import stamp
from .step import WARNING_OUTCOMES

BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0


@dataclass(frozen=True)
class BackOff:
    """Creates held back after consecutive failed operations (`back_off`)."""

    failures: int
    """Operations in a row that ended for a reason the user must see."""
    last: HistoryEntry
    """The newest of them: creates wait from its end."""
    delay: float
    """Seconds from its end until creates resume."""

    @property
    def until(self) -> float:
        """When creates resume (seconds since the epoch)."""
        return self.last.finished_at.timestamp() + self.delay

    @property
    def reason(self) -> ConditionReason:
        """``VerificationBackOff`` when the last failure was a replica answering differently, else ``BackOff``."""
        if self.last.reason == ConditionReason.REPLICA_INCONSISTENT:
            return ConditionReason.VERIFICATION_BACK_OFF
        return ConditionReason.BACK_OFF

    def resumes(self) -> str:
        """When the next replica is created, and why not before."""
        return (f"next replica create at {format_time(stamp(self.until))} ({self.delay:g}s back-off "
                f"after {self.failures} failed operation(s) in a row)")

    def message(self) -> str:
        """`resumes` and the last failure: what a user waiting on the pool needs."""
        return f"{self.resumes()}; last: {self.last.id} {self.last.outcome} ({self.last.reason}): {self.last.message}"


def back_off(history: list[HistoryEntry]) -> BackOff | None:
    """The back-off of new pods after consecutive failed operations, or None when none failed.

    Exponential like CrashLoopBackOff, so a replica that can never start, or that keeps answering
    differently from the serving ones, does not turn into a create/delete loop burning GPU
    scheduling and model loads. It counts the operations that ended for a reason the user must
    see (`WARNING_OUTCOMES`: a replica, verification, the scheduler or a drain failed them), and
    waits from the last of them. A success resets the count. A superseded operation is skipped,
    and so is one that ended Partial only because this back-off held its creates (``BackOff``):
    it saw nothing fail, and counting it would let the back-off feed on itself.
    """
    counted: list[HistoryEntry] = []
    for entry in reversed(history):
        if entry.outcome is OperationPhase.SUCCEEDED:
            break
        if entry.outcome in WARNING_OUTCOMES and entry.reason != ConditionReason.BACK_OFF:
            counted.append(entry)
    if not counted:
        return None
    delay = min(BACKOFF_BASE_SECONDS * 2 ** (len(counted) - 1), BACKOFF_MAX_SECONDS)
    return BackOff(failures=len(counted), last=counted[0], delay=float(delay))


def create_backoff(history: list[HistoryEntry], now: float) -> float:
    """Seconds until new pods may be created (`back_off`); 0 when they may be now."""
    held = back_off(history)
    return max(0.0, held.until - now) if held is not None else 0.0

"""Why a judge call gave no verdict, as types: a failure is never a number.

Why types and not a sentinel score: a trainer that maps a failed judgement to 0 (or leaves it None)
trains on the failure. Each error names its cause, so a training loop can decide per cause (skip the
sample, stop the step, page someone), and carries what the client knows about the call: its request
id (the same on every attempt, and in the pool's logs), its attempts and its retries by cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class JudgeError(Exception):
    """A judge call ended without a verdict."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of the last answer, when there was one."""
        self.reason = reason
        """The pool's reason (``x-genrm-reason``) of the last answer, when it gave one."""
        self.request_id: str | None = None
        self.attempts = 0
        self.retries: Mapping[str, int] = MappingProxyType({})

    def settled(self, request_id: str, attempts: int, retries: Mapping[str, int]) -> JudgeError:
        """This error, with what the call it ended went through (set once, where the call gives up)."""
        self.request_id, self.attempts, self.retries = request_id, attempts, MappingProxyType(dict(retries))
        return self

    def __str__(self) -> str:
        where = f" [request {self.request_id}, {self.attempts} attempt(s)]" if self.request_id else ""
        return super().__str__() + where


class JudgeUnavailable(JudgeError):
    """No replica answered in time: connections refused, retryable refusals (a draining replica, a
    pool waking from zero) until the deadline, or a connection lost under the request."""


class Refused(JudgeError):
    """The pool refused the request itself (4xx: malformed, unauthenticated, too large, ...): sending
    it again would be refused again, so it is never retried."""


class JudgeTimeout(JudgeError):
    """The answer did not come in time (the client's read timeout, or the pool's ``504``)."""


class EngineFailed(JudgeError):
    """The engine, or the replica in front of it, failed under the request (a non-retryable 5xx: a
    crash mid-generation, an engine error). It may have been judged, so it is not sent again."""


class BadAnswer(JudgeError):
    """A 2xx answer that is not the route's JSON (nothing to read a verdict from)."""


class RevisionRetired(JudgeError):
    """The step's calls are pinned to a judge revision the pool no longer serves (its judge changed,
    blue/green): the pool's message names the pinned and the active revision. Never retried: every
    replica that could answer is of another revision, and its verdict would not be comparable."""


class MixedJudges(JudgeError):
    """One step saw verdicts from two judge revisions: its rewards are not comparable."""

    def __init__(self, message: str, revisions: tuple[str, ...]) -> None:
        super().__init__(message)
        self.revisions = revisions


@dataclass(frozen=True)
class Unjudged:
    """A batch member without a verdict: where a list of verdicts has a hole, it says why."""

    error: JudgeError

    def __bool__(self) -> bool:
        return False

"""Which outcomes of an attempt are retried, after how long, and which are final: the pure law.

Why only these retries. A judge call that is retried when it may already have been judged costs an
engine's work twice; one that is retried when it cannot succeed (a 4xx) only delays the error; and a
retry loop without a deadline turns an outage into a hung training step. So an attempt is sent again
only when the pool certainly did not judge it and another try can succeed:

* the connection was not made (:attr:`Cause.CONNECT`: refused, timed out, no pooled connection);
* the connection closed before any byte of an answer (:attr:`Cause.CLOSED`): an idle keep-alive
  connection a draining replica closed as the request went out; RFC 9112 §9.3.1 lets a client resend
  such a request when it is idempotent, and a judgement has no side effect;
* the pool said so: ``x-should-retry: true`` (every retryable refusal of the gateway and the
  activator carries it), or, from a server that does not say, a ``503`` or ``429`` with
  ``Retry-After``. ``x-should-retry: false`` always wins. The wait is the pool's ``retry-after-ms``
  or ``Retry-After`` (at least), else an exponential backoff.

Everything else is final and typed (`genrm_client.errors`). Nothing here does I/O or reads a clock:
the callers pass the time and the random source, so the whole law is unit-tested as values.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from genrm_client import wire
from genrm_client.errors import (
    BadAnswer,
    EngineFailed,
    JudgeError,
    JudgeTimeout,
    JudgeUnavailable,
    Refused,
    RevisionRetired,
)


class Cause(enum.StrEnum):
    """Why an attempt was sent again (the keys of a call's and a step's retry counts)."""

    CONNECT = "connect"
    """No connection was made."""
    CLOSED = "closed"
    """The connection closed before any byte of an answer (a drained keep-alive connection)."""
    UNAVAILABLE = "unavailable"
    """A retryable refusal: a draining replica, an engine down, a pool waking from zero."""
    OVERLOAD = "overload"
    """A retryable ``429``, or a refusal that says the pool is overloaded (`wire.OVERLOAD_REASONS`)."""


class Broken(enum.Enum):
    """An attempt that got no HTTP answer, by how far it got."""

    CONNECT = "connect"
    """No connection: nothing was sent."""
    CLOSED = "closed"
    """The connection closed before any answer byte."""
    TIMEOUT = "timeout"
    """No answer within the read timeout."""
    LOST = "lost"
    """The connection broke after the request went out, or in the middle of the answer."""


@dataclass(frozen=True)
class Answer:
    """An attempt's HTTP answer: status, headers (names in lower case) and the whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def reason(self) -> str | None:
        return self.headers.get(wire.REASON_HEADER)


@dataclass(frozen=True)
class Failure:
    """An attempt without an answer, and what the transport said."""

    broken: Broken
    detail: str


Outcome = Answer | Failure


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call may go on, and how it waits between attempts."""

    deadline_s: float = 600.0
    """No attempt starts, and no wait ends, later than this after the call began. Long enough for a
    pool at zero to start a replica (the activator holds the request meanwhile)."""
    max_attempts: int = 30
    backoff_s: float = 0.25
    """The first wait after a connection failure; it doubles with each retry, up to ``max_backoff_s``."""
    max_backoff_s: float = 8.0
    jitter: float = 0.2
    """A retry waits up to this fraction longer than its wait (so a refused burst does not return as
    one burst); never shorter than the pool's ``Retry-After``."""


@dataclass(frozen=True)
class Retry:
    """Send the same request again after ``wait_s``; ``cause`` is counted."""

    cause: Cause
    wait_s: float


def retry_after(headers: Mapping[str, str], now_epoch: float) -> float | None:
    """The wait an answer asks for: ``retry-after-ms`` (milliseconds), else ``Retry-After`` in
    seconds or as an HTTP date; None when it asks for none (or says something unreadable)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - now_epoch, 0.0)
    except (TypeError, ValueError):
        return None


def retryable(answer: Answer) -> bool:
    """Whether the pool marks ``answer`` retryable (see the module docstring)."""
    marker = answer.headers.get(wire.SHOULD_RETRY_HEADER, "").strip().lower()
    if marker in ("true", "false"):
        return marker == "true"
    return answer.status in (429, 503) and ("retry-after" in answer.headers or "retry-after-ms" in answer.headers)


def overloaded(answer: Answer) -> bool:
    """Whether ``answer`` says the pool has more than it can take (the batch window shrinks)."""
    return answer.status == 429 or answer.reason in wire.OVERLOAD_REASONS


def final_error(outcome: Outcome) -> JudgeError | None:
    """The typed error an outcome ends a call with when it is not retried; None for a 2xx answer."""
    if isinstance(outcome, Failure):
        if outcome.broken is Broken.TIMEOUT:
            return JudgeTimeout(f"no answer within the read timeout: {outcome.detail}")
        if outcome.broken is Broken.LOST:
            return JudgeUnavailable(f"the connection broke after the request was sent (it may have been judged, "
                                    f"so it is not sent again): {outcome.detail}")
        return JudgeUnavailable(f"no replica could be reached: {outcome.detail}")
    if 200 <= outcome.status < 300:
        return None
    message = f"{outcome.status} {outcome.reason or ''}: {_message(outcome.body)}".replace("  ", " ")
    kind: type[JudgeError]
    if retryable(outcome) or outcome.status == 503:
        kind = JudgeUnavailable
    elif outcome.reason == wire.REVISION_RETIRED:
        kind = RevisionRetired
    elif outcome.status == 504:
        kind = JudgeTimeout
    elif outcome.status >= 500:
        kind = EngineFailed
    elif outcome.status >= 400:
        kind = Refused
    else:
        kind = BadAnswer
    return kind(message, status=outcome.status, reason=outcome.reason)


def decide(outcome: Outcome, attempt: int, elapsed_s: float, policy: RetryPolicy, rng: random.Random,
           now_epoch: float) -> Retry | JudgeError | None:
    """What follows attempt number ``attempt`` (from 1), ``elapsed_s`` into its call: None (a 2xx
    answer: the verdict), a :class:`Retry`, or the error that ends the call."""
    cause = _cause(outcome)
    if cause is None:
        return final_error(outcome)
    asked = retry_after(outcome.headers, now_epoch) if isinstance(outcome, Answer) else None
    wait = asked if asked is not None else min(policy.backoff_s * 2 ** (attempt - 1), policy.max_backoff_s)
    wait *= 1 + policy.jitter * rng.random()
    if attempt >= policy.max_attempts or elapsed_s + wait > policy.deadline_s:
        error = final_error(outcome) or JudgeUnavailable("retries exhausted")
        return type(error)(f"gave up after {attempt} attempt(s), {elapsed_s:.1f}s (deadline "
                           f"{policy.deadline_s:g}s): {error.args[0]}", status=error.status, reason=error.reason)
    return Retry(cause, wait)


def _cause(outcome: Outcome) -> Cause | None:
    if isinstance(outcome, Failure):
        return {Broken.CONNECT: Cause.CONNECT, Broken.CLOSED: Cause.CLOSED}.get(outcome.broken)
    if not retryable(outcome):
        return None
    return Cause.OVERLOAD if overloaded(outcome) else Cause.UNAVAILABLE


def _message(body: bytes) -> str:
    """The pool's error message (its JSON error shape), else the start of the body."""
    try:
        document = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    if isinstance(document, dict) and "message" in document:  # SGLang's own error shape
        return str(document["message"])
    return body[:200].decode("utf-8", "replace")

"""The retry law as values: what is sent again, after how long, and what ends a call with which error."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest
from genrm_client.errors import BadAnswer, EngineFailed, JudgeTimeout, JudgeUnavailable, Refused
from genrm_client.retry import (
    Answer,
    Broken,
    Cause,
    Failure,
    Retry,
    RetryPolicy,
    decide,
    final_error,
    retry_after,
    retryable,
)

NOW = 1_000_000.0
POLICY = RetryPolicy(deadline_s=60, max_attempts=10, backoff_s=0.25, max_backoff_s=8, jitter=0.2)


def refusal(status: int, reason: str | None = None, **headers: str) -> Answer:
    fields = {k.replace("_", "-"): v for k, v in headers.items()}
    if reason:
        fields["x-genrm-reason"] = reason
    return Answer(status, fields, b'{"error": {"reason": "%s", "message": "told", "code": %d}}' % (
        (reason or "").encode(), status))


def decided(outcome: Answer | Failure, attempt: int = 1, elapsed: float = 0.0,
            policy: RetryPolicy = POLICY) -> Retry | object:
    return decide(outcome, attempt, elapsed, policy, random.Random(7), NOW)


@pytest.mark.parametrize(("headers", "expected"), [
    ({"retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    ({"retry-after": "2"}, 2.0),
    ({"retry-after": formatdate(NOW + 30, usegmt=True)}, 30.0),
    ({"retry-after": formatdate(NOW - 30, usegmt=True)}, 0.0),
    ({"retry-after": "soon"}, None),
    ({}, None),
])
def test_retry_after_reads_milliseconds_seconds_and_dates(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after(headers, NOW) == expected


@pytest.mark.parametrize(("answer", "expected"), [
    (refusal(503, "draining", x_should_retry="true", retry_after="1"), True),
    (refusal(503, "draining", x_should_retry="false", retry_after="1"), False),
    (refusal(503, retry_after="1"), True),
    (refusal(429, retry_after="1"), True),
    (refusal(503), False),
    (refusal(429), False),
    (refusal(502, "engineDisconnected", x_should_retry="false"), False),
    (refusal(500, x_should_retry="true"), True),
    (refusal(400, "invalidJson", x_should_retry="false"), False),
])
def test_the_pools_marker_decides_and_a_bare_retry_after_counts_only_on_503_and_429(
        answer: Answer, expected: bool) -> None:
    assert retryable(answer) is expected


def test_connection_failures_before_the_request_was_sent_back_off_exponentially() -> None:
    waits = [decided(Failure(Broken.CONNECT, "refused"), attempt=n) for n in range(1, 8)]
    assert all(isinstance(w, Retry) and w.cause is Cause.CONNECT for w in waits)
    bases = [min(0.25 * 2 ** (n - 1), 8) for n in range(1, 8)]
    assert all(base <= w.wait_s <= base * 1.2 for w, base in zip(waits, bases, strict=True))  # type: ignore[union-attr]


def test_a_connection_closed_before_any_answer_byte_is_retried() -> None:
    decision = decided(Failure(Broken.CLOSED, "Server disconnected without sending a response."))
    assert isinstance(decision, Retry) and decision.cause is Cause.CLOSED


def test_a_connection_lost_after_the_request_was_sent_is_never_retried() -> None:
    decision = decided(Failure(Broken.LOST, "ReadError"))
    assert isinstance(decision, JudgeUnavailable) and "may have been judged" in str(decision)


def test_a_read_timeout_is_a_timeout_and_not_retried() -> None:
    assert isinstance(decided(Failure(Broken.TIMEOUT, "ReadTimeout")), JudgeTimeout)


def test_a_retryable_refusal_waits_at_least_its_retry_after() -> None:
    for seed in range(50):
        decision = decide(refusal(503, "draining", x_should_retry="true", retry_after="1"), 1, 0.0, POLICY,
                          random.Random(seed), NOW)
        assert isinstance(decision, Retry) and decision.cause is Cause.UNAVAILABLE
        assert 1.0 <= decision.wait_s <= 1.2


@pytest.mark.parametrize("answer", [refusal(429, retry_after="2"),
                                    refusal(503, "holdQueueFull", x_should_retry="true", retry_after="1"),
                                    refusal(503, "tooManyConnections", x_should_retry="true", retry_after="1")])
def test_429_and_overload_refusals_are_retried_as_overload(answer: Answer) -> None:
    decision = decided(answer)
    assert isinstance(decision, Retry) and decision.cause is Cause.OVERLOAD


@pytest.mark.parametrize(("answer", "kind"), [
    (refusal(400, "invalidJson", x_should_retry="false"), Refused),
    (refusal(401, "invalidApiKey", x_should_retry="false"), Refused),
    (refusal(413, "bodyTooLarge", x_should_retry="false"), Refused),
    (refusal(429, "tooManyHints", x_should_retry="false"), Refused),
    (refusal(502, "engineDisconnected", x_should_retry="false"), EngineFailed),
    (refusal(500), EngineFailed),
    (refusal(504, "engineTimeout", x_should_retry="false"), JudgeTimeout),
    (refusal(503), JudgeUnavailable),
    (refusal(302), BadAnswer),
])
def test_everything_else_ends_the_call_with_a_typed_error_naming_status_and_reason(
        answer: Answer, kind: type) -> None:
    decision = decided(answer)
    assert type(decision) is kind
    assert decision.status == answer.status and decision.reason == answer.reason  # type: ignore[attr-defined]
    assert "told" in str(decision) or answer.status in (500, 302)


def test_a_2xx_answer_is_a_verdict() -> None:
    assert decided(Answer(200, {}, b"{}")) is None
    assert final_error(Answer(202, {}, b"{}")) is None


def test_retries_stop_at_the_deadline_rather_than_wait_past_it() -> None:
    draining = refusal(503, "draining", x_should_retry="true", retry_after="5")
    assert isinstance(decided(draining, elapsed=50.0), Retry)
    late = decided(draining, elapsed=56.0)
    assert isinstance(late, JudgeUnavailable) and "gave up" in str(late) and late.reason == "draining"


def test_retries_stop_after_the_last_attempt() -> None:
    late = decided(Failure(Broken.CONNECT, "refused"), attempt=POLICY.max_attempts)
    assert isinstance(late, JudgeUnavailable) and "10 attempt" in str(late)

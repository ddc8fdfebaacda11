"""The back-off of a failing reconcile step and the condition that shows it (`core.retry`)."""

from __future__ import annotations

from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.api.status import ConditionStatus, ConditionType
from genrm_operator.core.conditions import find
from genrm_operator.core.retry import (
    REPEATED_FAILURES,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    Failure,
    Failures,
    failed_status,
    retry_delay,
)

NOW = 1_700_000_000.0
BOOM = Failure("write", "ApiException", "(500) etcd timeout")


def test_the_delay_doubles_from_one_second_and_is_capped_at_a_minute() -> None:
    assert retry_delay(0) == 0.0
    assert [retry_delay(n) for n in range(1, 9)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert retry_delay(10_000) == RETRY_MAX_SECONDS and retry_delay(1) == RETRY_BASE_SECONDS


def test_failures_count_in_a_row_and_a_success_resets_them() -> None:
    f = Failures()
    assert f.delay == 0.0 and not f.repeated and f.is_new(BOOM)
    f = f.failed(BOOM, NOW)
    assert (f.count, f.since, f.delay) == (1, NOW, 1.0)
    assert not f.is_new(BOOM), "the same stage and error again: no second traceback"
    assert f.is_new(Failure("read", "ApiException", "x")) and f.is_new(Failure("write", "KeyError", "x"))
    f = f.failed(BOOM, NOW + 1)
    assert f.since == NOW, "the row started at the first failure"
    assert Failures().delay == 0.0, "a success starts again from none"


def test_a_repeated_failure_shows_as_a_condition_once_and_recovery_is_the_core_status() -> None:
    status = GenRMPoolStatus()
    f = Failures()
    for n in range(1, REPEATED_FAILURES):
        f = f.failed(BOOM, NOW + n)
        assert failed_status(status, f, 3, NOW + n) is status, "one or two failures are not shown"
    f = f.failed(BOOM, NOW + REPEATED_FAILURES)
    shown = failed_status(status, f, 3, NOW + REPEATED_FAILURES)
    c = find(shown.conditions, ConditionType.RECONCILE_FAILED)
    assert c is not None and c.status is ConditionStatus.TRUE and c.reason == "ReconcileError"
    assert c.observed_generation == 3 and "write: ApiException: (500) etcd timeout" in c.message
    assert c.last_transition_time.timestamp() == NOW + REPEATED_FAILURES
    again = failed_status(shown, f.failed(BOOM, NOW + 60), 3, NOW + 60)
    assert again is shown, "the same failure again writes nothing"
    other = failed_status(shown, f.failed(Failure("read", "KeyError", "'metadata'"), NOW + 61), 3, NOW + 61)
    c2 = find(other.conditions, ConditionType.RECONCILE_FAILED)
    assert c2 is not None and "read: KeyError" in c2.message
    assert c2.last_transition_time == c.last_transition_time, "still failing: no transition"
    assert [x.type for x in other.conditions].count(ConditionType.RECONCILE_FAILED) == 1

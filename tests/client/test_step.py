"""A step pins the first revision it sees, counts its calls and reports its figures."""

from __future__ import annotations

import pytest
from genrm_client.errors import JudgeUnavailable, MixedJudges
from genrm_client.step import Step, current, entered, percentile
from genrm_client.verdict import Verdict


def verdict(revision: str | None, latency: float = 0.1, **retries: int) -> Verdict:
    return Verdict({}, "r", revision, latency, 1 + sum(retries.values()), retries)


def test_the_first_revision_pins_the_step_and_another_is_mixed_judges() -> None:
    step = Step(3)
    step.verdict(verdict(None))
    step.verdict(verdict("a"))
    step.verdict(verdict("a", closed=1))
    with pytest.raises(MixedJudges) as mixed:
        step.verdict(verdict("b"))
    assert mixed.value.revisions == ("a", "b")
    report = step.report()
    assert (report.verdicts, report.unjudged, report.revision) == (3, 1, "a")
    assert report.errors == {"MixedJudges": 1} and report.retries == {"closed": 1}


def test_a_given_revision_is_pinned_from_the_start() -> None:
    with pytest.raises(MixedJudges):
        Step(1, revision="a").verdict(verdict("b"))


def test_a_step_pins_its_calls_to_a_revision_only_a_gateway_named_or_it_was_given() -> None:
    """What a step's later calls send as ``x-genrm-revision``: a revision read from the engine's body
    alone is never sent (no gateway named it, none would check it), one a gateway named is."""
    step = Step(2)
    assert step.pin is None
    step.verdict(verdict("a"))
    assert (step.revision, step.pin) == ("a", None)
    step.verdict(Verdict({}, "r", "a", 0.1, 1, {}, 0.0, gateway_named=True))
    assert step.pin == "a"
    with pytest.raises(MixedJudges):
        step.verdict(Verdict({}, "r", "b", 0.1, 1, {}, 0.0, gateway_named=True))
    assert step.pin == "a"
    assert Step(1, revision="c").pin == "c"


def test_the_report_has_failures_by_type_retries_and_latency_percentiles() -> None:
    step = Step(9)
    for i in range(100):
        step.verdict(verdict("a", latency=(i + 1) / 100))
    failure = JudgeUnavailable("gone").settled("r", 3, {"unavailable": 2})
    step.failure(failure)
    report = step.report()
    assert report.p50_s == 0.5 and report.p99_s == 0.99
    assert report.errors == {"JudgeUnavailable": 1} and report.retries == {"unavailable": 2}
    assert report.line() == "judge step=9 verdicts=100 unjudged=1 retries=2 p50=0.5s p99=0.99s held=0s rev=a"


def test_the_time_the_activator_held_the_steps_calls_adds_up() -> None:
    step = Step(4)
    for held in (0.0, 2.5, 2.25):
        step.verdict(Verdict({}, "r", "a", held + 0.1, 1, {}, held))
    assert step.report().held_s == 4.75 and " held=4.75s " in step.report().line()


def test_percentiles_of_nothing_are_none() -> None:
    assert percentile([], 50) is None
    assert percentile([2.0], 99) == 2.0


def test_the_current_step_is_the_innermost_block() -> None:
    assert current() is None
    with entered(Step(1)) as outer:
        assert current() is outer
        with entered(Step(2)) as inner:
            assert current() is inner
        assert current() is outer
    assert current() is None

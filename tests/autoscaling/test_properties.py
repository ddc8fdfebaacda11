"""Properties of the control law over random observations and histories."""

from __future__ import annotations

from autoscaling_support import TARGET, observe, serving, spec, starting
from genrm_operator.api.autoscaling import AutoscalerStatus
from genrm_operator.autoscaling import Observation, decide
from hypothesis import given, settings
from hypothesis import strategies as st

two_metrics = [
    {"type": "InFlight", "target": {"averageValue": str(TARGET)}},
    {"type": "Queue", "target": {"averageValue": "4"}},
]
sample = st.one_of(st.none(), st.floats(min_value=0, max_value=500, allow_nan=False))
pods = st.lists(st.tuples(sample, sample), min_size=0, max_size=12)
ticks = st.lists(
    st.tuples(st.integers(1, 60), pods, st.integers(0, 3), st.integers(0, 14)), min_size=1, max_size=25
)


def observation_at(
    now: int, loads: list[tuple[float | None, float | None]], pending: int, current: int
) -> Observation:
    replicas = [
        r.__class__(r.name, r.state, {k: v for k, v in (("InFlight", a), ("Queue", b)) if v is not None})
        for r, (a, b) in zip(serving(*[0.0] * len(loads)), loads, strict=True)
    ]
    return observe(now, [*replicas, *starting(pending)], current=current)


@settings(max_examples=200, deadline=None)
@given(ticks, st.integers(1, 4), st.integers(4, 14))
def test_decisions_stay_within_bounds_and_never_shrink_on_a_failed_metric(
    trace: list[tuple[int, list[tuple[float | None, float | None]], int, int]], low: int, high: int
) -> None:
    scaling = spec(metrics=two_metrics, minReplicas=low, maxReplicas=high)
    status, now = AutoscalerStatus(), 0
    for gap, loads, pending, current in trace:
        now += gap
        observation = observation_at(now, loads, pending, current)
        decision = decide(scaling, observation, status)
        status = decision.status
        if current == 0:
            assert decision.desired_replicas == 0
            continue
        assert low <= decision.desired_replicas <= high or decision.desired_replicas == current
        if low <= current <= high and any(m.failed or m.replicas is None for m in decision.metrics):
            assert decision.desired_replicas >= current


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), min_size=2, max_size=40))
def test_scale_down_never_goes_below_the_down_window_maximum(loads: list[float]) -> None:
    """Stabilization: within the 600 s window the pool never goes below any recommendation made in it."""
    status, current, seen = AutoscalerStatus(), 5, []
    for i, total in enumerate(loads):
        decision = decide(spec(), observe(5 * i, serving(*[total / current] * current)), status)
        seen.append(decision.raw_recommendation)
        if decision.desired_replicas < current:
            assert decision.desired_replicas >= max(seen)
        status, current = decision.status, decision.desired_replicas


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), min_size=1, max_size=30))
def test_advisory_and_auto_agree_on_the_first_recommendation_and_advisory_never_applies(loads: list[float]) -> None:
    status = AutoscalerStatus()
    for i, total in enumerate(loads):
        observation = observe(5 * i, serving(total, total))
        advisory = decide(spec(mode="Advisory"), observation, status)
        assert not advisory.apply
        if i == 0:
            assert advisory.desired_replicas == decide(spec(), observation, status).desired_replicas
        status = advisory.status

"""Replica arithmetic is exact: integer milli-units as HPA computes them, checked against rationals.

Aspects under test: a demand of exactly N targets asks for N replicas (65 requests in flight over
3 replicas at target 5 is 13, which float arithmetic made 14); every per-metric proposal (demand
with missing and starting replicas, the KV-cache guard, pool metrics of both target types) equals
the same rules evaluated in ``fractions.Fraction`` over random inputs; rate-policy percentages
and the panic threshold are exact at their edges; the two conversions into milli-units.
"""

from __future__ import annotations

import math
from fractions import Fraction

from autoscaling_support import at, observe, serving, spec, starting
from genrm_operator.api.autoscaling import AutoscalerStatus, Behavior, MetricSpec
from genrm_operator.autoscaling import Observation, decide
from genrm_operator.autoscaling.metrics import Tolerance, evaluate
from genrm_operator.autoscaling.milli import quantity_milli, sample_milli
from genrm_operator.autoscaling.policies import limit
from hpa_reference import Hpa, Pod
from hypothesis import given, settings
from hypothesis import strategies as st

NO_TOLERANCE = Tolerance(up=0, down=0)


def in_flight(target: str, **extra: object) -> MetricSpec:
    return MetricSpec.model_validate({"type": "InFlight", "target": {"averageValue": target}, **extra})


def test_65_requests_over_3_replicas_at_target_5_ask_for_13() -> None:
    """The case that float arithmetic got wrong: ceil(65 / 3 / 5 * 3) is 14 in floats."""
    assert math.ceil(65 / 3 / 5 * 3) == 14
    observation = observe(0, serving(22, 22, 21))
    scaling = spec(metrics=[{"type": "InFlight", "target": {"averageValue": "5"}}])
    assert decide(scaling, observation, AutoscalerStatus()).raw_recommendation == 13
    hpa = Hpa(targets={"InFlight": 5000}, min_replicas=1, max_replicas=20)
    pods = [Pod(r.name, "Running", {"InFlight": round(r.values["InFlight"] * 1000)}) for r in observation.replicas]
    assert hpa.plain_metric_replicas(pods, "InFlight", 3) == 13


@st.composite
def whole_demand(draw: st.DrawFn) -> tuple[list[int], int, int]:
    """Whole-request loads on 1-20 replicas adding up to exactly k x an integer target."""
    replicas = draw(st.integers(1, 20))
    target = draw(st.integers(1, 50))
    k = draw(st.integers(1, 200))
    cuts = sorted(draw(st.lists(st.integers(0, k * target), min_size=replicas - 1, max_size=replicas - 1)))
    loads = [b - a for a, b in zip([0, *cuts], [*cuts, k * target], strict=True)]
    return loads, target, k


@settings(max_examples=300, deadline=None)
@given(whole_demand())
def test_a_demand_of_exactly_k_targets_asks_for_k_replicas(case: tuple[list[int], int, int]) -> None:
    loads, target, k = case
    outcome = evaluate(in_flight(str(target)), observe(0, serving(*loads)), NO_TOLERANCE)
    assert outcome.replicas == k


def fraction_of(quantity: str) -> Fraction:
    """A quantity string as an exact rational."""
    return Fraction(quantity[:-1]) / 1000 if quantity.endswith("m") else Fraction(quantity)


def within(ratio: Fraction, up: Fraction, down: Fraction) -> bool:
    return 1 - down <= ratio <= 1 + up


def rational_demand(samples: list[Fraction], missing: int, starting_: int, current: int, target: Fraction,
                    up: Fraction, down: Fraction) -> int:
    """HPA's calcPlainMetricReplicas in rationals: the average truncated to a milli-unit as HPA's
    GetMetricUsageRatio does, everything after it exact (missing pods at the target on a scale-down,
    and also at a ratio of exactly 1, the documented deviation)."""
    def average(total: Fraction, count: int) -> Fraction:
        return Fraction(math.floor(total * 1000 / count), 1000)

    ratio = average(sum(samples, Fraction(0)), len(samples)) / target
    rebalance = starting_ > 0 and ratio > 1
    if not rebalance and missing == 0:
        return current if within(ratio, up, down) else math.ceil(ratio * len(samples))
    unready = starting_ if rebalance else 0
    filled = [*samples, *[target if ratio <= 1 else Fraction(0)] * missing, *[Fraction(0)] * unready]
    new_ratio = average(sum(filled, Fraction(0)), len(filled)) / target
    if within(new_ratio, up, down) or (ratio > 1 > new_ratio) or (ratio < 1 < new_ratio):
        return current
    replicas = math.ceil(new_ratio * len(filled))
    if (new_ratio < 1 and replicas > current) or (new_ratio > 1 and replicas < current):
        return current
    return replicas


quantity = st.one_of(
    st.integers(1, 100_000).map(lambda m: f"{m}m"),
    st.integers(1, 100_000).map(lambda m: f"{m // 1000}.{m % 1000:03d}"),
)
tolerance = st.integers(0, 500).map(lambda m: f"{m}m")
milli_sample = st.one_of(st.none(), st.integers(0, 2_000_000))


def behavior(up: str, down: str) -> Behavior:
    return Behavior.model_validate({"scaleUp": {"tolerance": up}, "scaleDown": {"tolerance": down}})


@settings(max_examples=500, deadline=None)
@given(st.lists(milli_sample, min_size=1, max_size=20), st.integers(0, 5), st.integers(1, 30), quantity,
       tolerance, tolerance)
def test_demand_equals_the_rational_computation(samples: list[int | None], pending: int, current: int,
                                                target: str, up: str, down: str) -> None:
    observation = observe(0, [*serving(*[None if m is None else m / 1000 for m in samples]), *starting(pending)],
                          current=current)
    outcome = evaluate(in_flight(target), observation, Tolerance.of(behavior(up, down)))
    known = [Fraction(m, 1000) for m in samples if m is not None]
    if not known:
        assert outcome.replicas is None
        return
    expected = rational_demand(known, len(samples) - len(known), pending, current, fraction_of(target),
                               fraction_of(up), fraction_of(down))
    assert outcome.replicas == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(milli_sample, min_size=1, max_size=20), st.integers(1, 1000), st.integers(1, 30))
def test_kv_guard_equals_the_rational_computation(samples: list[int | None], target_milli: int,
                                                  current: int) -> None:
    metric = MetricSpec.model_validate({"type": "KVCache", "target": {"averageValue": f"{target_milli}m"}})
    values = [None if m is None else m / 1000 for m in samples]
    outcome = evaluate(metric, observe(0, serving(*values, metric="KVCache"), current=current), NO_TOLERANCE)
    known = [Fraction(m, 1000) for m in samples if m is not None]
    if not known:
        assert outcome.replicas is None
        return
    target = Fraction(target_milli, 1000)
    if sum(known) / len(known) >= target:
        expected = current + 1
    else:
        expected = math.floor((sum(known) + (len(samples) - len(known)) * target) / target) + 1
    assert outcome.replicas == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000_000), quantity, st.sampled_from(["AverageValue", "Value"]), st.integers(1, 30),
       st.integers(1, 30), tolerance, tolerance)
def test_pool_metrics_equal_the_rational_computation(value_milli: int, target: str, kind: str, current: int,
                                                     ready: int, up: str, down: str) -> None:
    field = "averageValue" if kind == "AverageValue" else "value"
    metric = MetricSpec.model_validate({"type": "Prometheus", "query": "q", "target": {"type": kind, field: target}})
    observation = Observation(now=at(0), current_replicas=current, replicas=serving(*[1.0] * ready),
                              pool_values={"Prometheus": value_milli / 1000})
    outcome = evaluate(metric, observation, Tolerance.of(behavior(up, down)))
    value, goal, tol_up, tol_down = Fraction(value_milli, 1000), fraction_of(target), fraction_of(up), fraction_of(down)
    if kind == "AverageValue":
        expected = current if within(value / (goal * current), tol_up, tol_down) else math.ceil(value / goal)
    else:
        expected = current if within(value / goal, tol_up, tol_down) else math.ceil(value / goal * ready)
    assert outcome.replicas == expected


def percent_behavior(value: int) -> Behavior:
    policy = [{"type": "Percent", "value": value, "periodSeconds": 60}]
    return Behavior.model_validate({"scaleUp": {"policies": policy}, "scaleDown": {"policies": policy}})


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1000), st.integers(1, 300))
def test_percent_policies_equal_the_rational_computation(current: int, percent: int) -> None:
    rules, now, bounds = percent_behavior(percent), at(0), (0, 10**6)
    grow, _ = limit(10**6, current, bounds, rules, (), now)
    shrink, _ = limit(0, current, bounds, rules, (), now)
    assert grow == max(math.ceil(current * (1 + Fraction(percent, 100))), current)
    assert shrink == max(min(math.trunc(current * (1 - Fraction(percent, 100))), current), 0)


def test_percent_policies_at_the_edges_floats_got_wrong() -> None:
    assert limit(1000, 100, (1, 1000), percent_behavior(9), (), at(0))[0] == 109       # floats: 110
    assert limit(1, 90, (1, 1000), percent_behavior(30), (), at(0))[0] == 63           # floats: 62


def test_panic_threshold_is_exact_at_its_edge() -> None:
    """1.12 x 25 replicas is 28 exactly (28.000000000000004 in floats, which missed the panic)."""
    scaling = spec(panic={"threshold": "1.12"}, maxReplicas=40)
    decision = decide(scaling, observe(0, serving(*[11.2] * 25)), AutoscalerStatus())
    assert (decision.raw_recommendation, decision.panicking) == (28, True)


@given(st.integers(0, 10**12))
def test_a_value_written_in_milli_units_converts_back_exactly(milli: int) -> None:
    assert sample_milli(milli / 1000) == milli


def test_conversions_into_milli_units() -> None:
    assert sample_milli(0.1 + 0.2) == 300                      # float noise is not a milli-unit more
    assert sample_milli(0.0625) == 63                          # halves round up (62.5)
    assert quantity_milli("850m") == quantity_milli("0.85") == 850
    assert quantity_milli("0.0005") == 1                       # below a milli-unit rounds up, like MilliValue()
    assert quantity_milli("8") == 8000


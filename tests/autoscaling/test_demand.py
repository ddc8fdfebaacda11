"""Demand hints and scale to zero in the control law (pure: spec, observation and status in).

Aspects: a hint raises the pool to ceil(rate / replicaRequestsPerSecond) at once, past the
stabilization window and rate policies, bounded by maxReplicas, and recorded (decision record,
status); hints add up, expire by themselves after startsWithinSeconds + forSeconds counted from when
the operator first saw them, and an expired id reported again does not start again; once a replica
near its InFlight target was measured, the floor is sized from that throughput (a moving average)
instead of the declared rate; a pool with
scaleToZero goes to zero only when every replica reported idle for idleSeconds and no hint is
active, never on missing reports, and wakes from zero to at least minReplicas on a hint; a pool
without scaleToZero never goes below minReplicas.
"""

from __future__ import annotations

from typing import Any

from autoscaling_support import at, observe, serving, spec
from genrm_contract.demand import DemandHint
from genrm_operator.api.autoscaling import AutoscalerStatus
from genrm_operator.autoscaling import ReplicaSample, ReplicaState, decide
from genrm_operator.autoscaling.demand import annotation_hint, is_new
from hypothesis import given
from hypothesis import strategies as st


def hint(requests: int, for_seconds: int, within: int = 0, hint_id: str = "phase") -> DemandHint:
    return DemandHint(id=hint_id, requests=requests, starts_within_seconds=within, for_seconds=for_seconds)


def zero_spec(**overrides: Any) -> Any:
    return spec(scaleToZero={"idleSeconds": 60}, demand={"replicaRequestsPerSecond": "2"}, **overrides)


def test_a_hint_raises_the_pool_to_its_floor_at_once_past_the_windows() -> None:
    s = spec(demand={"replicaRequestsPerSecond": "2"}, behavior={"scaleUp": {"stabilizationWindowSeconds": 600}})
    # 4800 requests over 600 s = 8/s = 4 replicas of 2/s each; load alone asks for 1.
    d = decide(s, observe(0, serving(1.0), hints=[hint(4800, 600)]), AutoscalerStatus())
    assert (d.desired_replicas, d.limited_by, d.apply) == (4, "DemandFloor", True)
    assert d.status.demand_floor == 4 and [h.id for h in d.status.demand] == ["phase"]
    assert d.record is not None and d.record.demand_floor == 4


def test_hints_add_up_and_the_floor_is_bounded_by_max_replicas() -> None:
    s = spec(demand={"replicaRequestsPerSecond": "2"}, maxReplicas=6)
    two = [hint(1200, 600, hint_id="a"), hint(2400, 600, hint_id="b")]  # 2/s + 4/s = 3 replicas
    assert decide(s, observe(0, serving(1.0), hints=two), AutoscalerStatus()).desired_replicas == 3
    huge = decide(s, observe(0, serving(1.0), hints=[hint(10**9, 60)]), AutoscalerStatus())
    assert huge.desired_replicas == 6 and huge.status.demand_floor == 6


def test_a_hint_expires_by_itself_and_an_expired_id_reported_again_does_not_start_again() -> None:
    s = spec(demand={"replicaRequestsPerSecond": "2"})
    first = decide(s, observe(0, serving(1.0), hints=[hint(240, 60, within=30)]), AutoscalerStatus())
    assert first.status.demand_floor == 2
    still = decide(s, observe(89, serving(1.0, 1.0), hints=[hint(240, 60, within=30)]), first.status)
    assert still.status.demand_floor == 2, "the lifetime counts from when the operator first saw it"
    gone = decide(s, observe(90, serving(1.0, 1.0), hints=[hint(240, 60, within=30)]), still.status)
    assert gone.status.demand_floor is None and gone.status.demand == () and gone.status.demand_seen == ("phase",)
    assert not is_new(gone.status, [hint(240, 60, within=30)])
    assert is_new(gone.status, [hint(240, 60, hint_id="next-phase")])


def test_a_re_announced_hint_counts_again_from_now() -> None:
    s = spec(demand={"replicaRequestsPerSecond": "2"})
    first = decide(s, observe(0, serving(1.0), hints=[hint(240, 60)]), AutoscalerStatus())
    again = decide(s, observe(50, serving(1.0, 1.0), hints=[hint(480, 60)]), first.status)
    assert again.status.demand_floor == 4 and again.status.demand[0].seen_at == at(50)


def test_an_idle_pool_goes_to_zero_only_after_idle_seconds_and_only_with_scale_to_zero() -> None:
    early = decide(zero_spec(), observe(0, serving(0.0, 0.0), idle_seconds=59.0), AutoscalerStatus())
    assert early.desired_replicas == 1, "an ordinary scale-down to minReplicas, not to zero"
    d = decide(zero_spec(), observe(0, serving(0.0, 0.0), idle_seconds=60.0), AutoscalerStatus())
    assert (d.desired_replicas, d.limited_by, d.apply) == (0, "IdleToZero", True)
    kept = decide(spec(), observe(0, serving(0.0, 0.0), idle_seconds=10_000.0), AutoscalerStatus())
    assert kept.desired_replicas >= 1


def test_missing_reports_or_an_active_hint_keep_an_idle_pool_up() -> None:
    assert decide(zero_spec(), observe(0, serving(0.0), idle_seconds=None), AutoscalerStatus()).desired_replicas == 1
    hinted = decide(zero_spec(), observe(0, serving(0.0), idle_seconds=600.0, hints=[hint(10, 600)]),
                    AutoscalerStatus())
    assert hinted.desired_replicas == 1 and hinted.limited_by != "IdleToZero"


def test_a_pool_at_zero_stays_there_until_a_hint_then_wakes_to_at_least_min_replicas() -> None:
    s = zero_spec(minReplicas=2)
    idle = decide(s, observe(0, [], current=0), AutoscalerStatus())
    assert (idle.desired_replicas, idle.apply) == (0, False)
    assert any(c.reason == "ScaledToZero" for c in idle.conditions)
    woken = decide(s, observe(1, [], current=0, hints=[hint(12, 6)]), AutoscalerStatus())
    assert (woken.desired_replicas, woken.limited_by, woken.apply) == (2, "DemandFloor", True)
    big = decide(s, observe(1, [], current=0, hints=[hint(60, 6)]), AutoscalerStatus())
    assert big.desired_replicas == 5


def test_without_scale_to_zero_a_pool_at_zero_is_left_alone_as_before() -> None:
    d = decide(spec(), observe(0, [], current=0, hints=[hint(100, 10)]), AutoscalerStatus())
    assert (d.desired_replicas, d.apply) == (0, False)


def test_the_annotation_is_a_hint_or_says_why_not() -> None:
    assert annotation_hint(None) == (None, None)
    good, error = annotation_hint('{"id": "p7", "requests": 4096, "startsWithinSeconds": 60, "forSeconds": 600}')
    assert error is None and good is not None and good.lifetime == 660
    bad, why = annotation_hint('{"requests": -1, "forSeconds": 600}')
    assert bad is None and why is not None and "requests" in why
    d = decide(spec(), observe(0, serving(1.0), hint_error=why), AutoscalerStatus())
    assert d.status.demand_annotation_error == why


@given(rates=st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 3600)), max_size=8),
       per_replica=st.integers(1, 50), current=st.integers(1, 30), load=st.floats(0, 100))
def test_property_the_outcome_is_within_bounds_and_never_below_the_floor(
        rates: list[tuple[int, int]], per_replica: int, current: int, load: float) -> None:
    s = spec(demand={"replicaRequestsPerSecond": str(per_replica)}, maxReplicas=30)
    hints = [hint(n, t, hint_id=f"h{i}") for i, (n, t) in enumerate(rates)]
    d = decide(s, observe(0, serving(*[load] * current), hints=hints), AutoscalerStatus())
    floor = d.status.demand_floor or 0
    assert 1 <= d.desired_replicas <= 30
    assert floor <= 30 and d.desired_replicas >= floor
    assert (floor > 0) == bool(hints)


def test_the_floor_is_sized_from_measured_throughput_once_a_busy_replica_was_measured() -> None:
    s = spec(demand={"replicaRequestsPerSecond": "2"})  # InFlight target 10 per replica
    idle = [ReplicaSample("r0", ReplicaState.SERVING, {"InFlight": 1.0}, throughput=3.0)]
    first = decide(s, observe(0, idle), AutoscalerStatus())
    assert first.status.replica_throughput is None, "a replica far below its target measures what was sent"
    busy = [ReplicaSample("r0", ReplicaState.SERVING, {"InFlight": 9.0}, throughput=10.0),
            ReplicaSample("r1", ReplicaState.SERVING, {"InFlight": 12.0}, throughput=14.0)]
    measured = decide(s, observe(5, busy), first.status)
    assert measured.status.replica_throughput == "12"
    again = decide(s, observe(10, [ReplicaSample("r0", ReplicaState.SERVING, {"InFlight": 10.0}, throughput=2.0)]),
                   measured.status)
    assert again.status.replica_throughput == "9", "a moving average: 0.7 x 12 + 0.3 x 2"
    # 4800 requests over 600 s = 8/s: 4 replicas at the declared 2/s, 1 at the measured 9/s.
    hinted = decide(s, observe(15, serving(1.0), hints=[hint(4800, 600)]), again.status)
    assert hinted.status.demand_floor == 1
    assert decide(s, observe(15, serving(1.0), hints=[hint(4800, 600)]), AutoscalerStatus()).status.demand_floor == 4

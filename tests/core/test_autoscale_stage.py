"""The autoscaler as a stage of the reconcile step (``genrm_operator.core.autoscale``).

One step classifies the pods once and produces the whole status: the state machine's three
conditions next to HPA's, the next ``status.autoscaler`` and the decision the shell applies.
Between decisions (no samples) the autoscaler's conditions and memory are carried over as
they are, so an idle step writes nothing; samples of a replica that is not serving (a
published pod whose engine crashed) never reach the control law.
"""

from __future__ import annotations

from dataclasses import replace

from genrm_contract.demand import DemandHint
from genrm_contract.sidecar import DrainState
from genrm_operator.api.status import AUTOSCALER_CONDITIONS, ConditionType, EventReason
from genrm_operator.core.model import MetricSamples, PodView, SidecarView
from genrm_operator.core.reconcile import reconcile

from .test_reconcile import NOW, make_spec, observe, serving_pod

AUTO = {"mode": "Auto", "minReplicas": 1, "maxReplicas": 8, "intervalSeconds": 2,
        "metrics": [{"type": "InFlight", "target": {"averageValue": "2"}}]}


def test_a_due_decision_comes_out_of_the_same_step_as_the_state_machine() -> None:
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    samples = MetricSamples({"judge-0": {"InFlight": 6.0}, "judge-1": {"InFlight": 6.0}})
    plan = reconcile(replace(observe(make_spec(2, autoscaling=AUTO), pods), metrics=samples))
    types = [c.type for c in plan.status.conditions]
    assert types[:3] == [ConditionType.AVAILABLE, ConditionType.PROGRESSING, ConditionType.DEGRADED]
    assert set(types[3:]) == AUTOSCALER_CONDITIONS
    assert plan.decision is not None and plan.decision.apply and plan.decision.desired_replicas == 6
    assert plan.status.autoscaler == plan.decision.status
    assert plan.status.autoscaler is not None and plan.status.autoscaler.desired_replicas == 6


def test_between_decisions_the_autoscaler_part_of_the_status_is_carried_over() -> None:
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    spec = make_spec(2, autoscaling=AUTO)
    first = reconcile(replace(observe(spec, pods), metrics=MetricSamples({"judge-0": {"InFlight": 2.0},
                                                                           "judge-1": {"InFlight": 2.0}})))
    later = reconcile(observe(spec, pods, status=first.status, now=NOW + 1))
    assert later.decision is None
    assert later.status == first.status


def test_samples_of_a_replica_that_is_not_serving_are_not_capacity_or_load() -> None:
    crashed = serving_pod("judge-1", restarts=1)  # still labelled published, but Failed to the core
    pods = [serving_pod("judge-0"), crashed]
    samples = MetricSamples({"judge-0": {"InFlight": 2.0}, "judge-1": {"InFlight": 100.0}})
    plan = reconcile(replace(observe(make_spec(2, autoscaling=AUTO), pods), metrics=samples))
    assert plan.decision is not None
    assert plan.decision.metrics[0].value == 2.0  # judge-0's alone: judge-1's 100 would make it 51
    assert plan.decision.desired_replicas == 2


def test_mode_off_leaves_no_autoscaler_condition_and_no_decision() -> None:
    pods = [serving_pod("judge-0")]
    on = reconcile(replace(observe(make_spec(1, autoscaling=AUTO), pods),
                           metrics=MetricSamples({"judge-0": {"InFlight": 1.0}})))
    off = reconcile(replace(observe(make_spec(1), pods, status=on.status), metrics=MetricSamples()))
    assert off.decision is None
    assert not {c.type for c in off.status.conditions} & AUTOSCALER_CONDITIONS


def test_a_surge_replica_of_a_rollout_is_capacity_on_the_way_not_a_reason_to_scale() -> None:
    outdated = [serving_pod("judge-0", revision="old"), serving_pod("judge-1", revision="old")]
    surge = serving_pod("judge-2", published=False, ever_published=False, ready=False, verification="")
    samples = MetricSamples({"judge-0": {"InFlight": 2.0}, "judge-1": {"InFlight": 2.0}})
    plan = reconcile(replace(observe(make_spec(2, autoscaling=AUTO), [*outdated, surge]), metrics=samples))
    assert plan.status.operation is not None and plan.status.operation.type == "Rollout"
    assert plan.decision is not None and plan.decision.desired_replicas == 2


ZERO = {**AUTO, "scaleToZero": {"idleSeconds": 60}, "demand": {"replicaRequestsPerSecond": "1"}}


def _idle(since: float) -> SidecarView:
    return SidecarView(DrainState.SERVING, 0, True, idle_from=since)


def test_scale_to_zero_reads_every_replicas_own_idle_report_and_nothing_else() -> None:
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    samples = MetricSamples({"judge-0": {"InFlight": 0.0}, "judge-1": {"InFlight": 0.0}})

    def decided(sidecars: dict[str, SidecarView | None], extra: list[PodView] = []) -> int:  # noqa: B006
        plan = reconcile(replace(observe(make_spec(2, autoscaling=ZERO), pods + extra, sidecars=sidecars),
                                 metrics=samples))
        assert plan.decision is not None
        return plan.decision.desired_replicas

    assert decided({"judge-0": _idle(NOW - 61), "judge-1": _idle(NOW - 70)}) == 0
    assert decided({"judge-0": _idle(NOW - 61), "judge-1": _idle(NOW - 30)}) == 1, "idle for less than 60 s"
    assert decided({"judge-0": _idle(NOW - 61), "judge-1": None}) == 1, "a replica not heard from is never idle"
    busy = SidecarView(DrainState.SERVING, 3, True)
    assert decided({"judge-0": _idle(NOW - 61), "judge-1": busy}) == 1
    loading = serving_pod("judge-2", NOW - 5, ready=False, published=False, ever_published=False, verification="")
    assert decided({"judge-0": _idle(NOW - 99), "judge-1": _idle(NOW - 99), "judge-2": None}, [loading]) == 1


def test_hints_from_gateways_and_the_annotation_set_the_floor_and_a_bad_annotation_warns_once() -> None:
    pods = [serving_pod("judge-0")]
    samples = MetricSamples({"judge-0": {"InFlight": 1.0}})
    sidecars: dict[str, SidecarView | None] = {"judge-0": SidecarView(
        DrainState.SERVING, 1, True, demand=(DemandHint(id="rollout-9", requests=300, for_seconds=100),))}
    obs = replace(observe(make_spec(1, autoscaling=ZERO), pods, sidecars=sidecars), metrics=samples,
                  demand_annotation='{"id": "by-hand", "requests": 200, "forSeconds": 100}')
    plan = reconcile(obs)
    assert plan.decision is not None and plan.decision.desired_replicas == 5  # 3/s + 2/s at 1/s each
    assert plan.status.autoscaler is not None
    assert {h.id for h in plan.status.autoscaler.demand} == {"rollout-9", "by-hand"}
    bad = replace(obs, demand_annotation="{oops", status=plan.status)
    first = reconcile(bad)
    assert [e.reason for e in first.events if e.reason == EventReason.DEMAND_HINT_INVALID] == \
        [EventReason.DEMAND_HINT_INVALID]
    again = reconcile(replace(bad, status=first.status, now=NOW + 5))
    assert not [e for e in again.events if e.reason == EventReason.DEMAND_HINT_INVALID], "once per change"


def test_requests_held_at_zero_wake_the_pool_at_once_and_hints_through_the_activator_count() -> None:
    zero = make_spec(0, autoscaling={**ZERO, "minReplicas": 2})
    asleep = reconcile(replace(observe(zero, []), metrics=MetricSamples()))
    assert asleep.decision is not None and asleep.decision.desired_replicas == 0
    held = reconcile(replace(observe(zero, []), metrics=MetricSamples(), held=3))
    assert held.decision is not None and (held.decision.desired_replicas, held.decision.limited_by) == \
        (2, "HeldRequests")
    relayed = (DemandHint(id="at-zero", requests=500, for_seconds=100),)
    hinted = reconcile(replace(observe(zero, []), metrics=MetricSamples(), relayed_hints=relayed))
    assert hinted.decision is not None and hinted.decision.desired_replicas == 5

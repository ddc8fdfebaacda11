"""One autoscaler decision: the control law end to end, called once per interval.

Order of the stages, each of which may change the count and is then named in
``limited_by``:

1. bounds first: a pool outside [min, max] is brought inside without looking at metrics;
2. per-metric proposals and the missing-data rules (:mod:`.recommend`) give the raw
   recommendation;
3. panic (optional): a raw recommendation at ``threshold`` x the current count starts a
   panic; while it lasts the up window shrinks to the panic window, nothing scales down and
   the hold for starting replicas (stage 5) is lifted;
4. stabilization windows (:mod:`.stabilize`);
5. replicas on the way: while replicas that this autoscaler added are still starting, no
   further scale-up (unless panicking). Starting replicas already count as capacity in the
   proposals; this hold covers what the gauges cannot tell apart: the backlog that piles
   up on the serving replicas during a minutes-long model load inflates InFlight and
   Queue, and following it would order replicas that are idle once the first ones serve
   (the cascade of Knative #4344, KServe #871; WVA and Dynamo hold the same way);
6. unschedulable replicas, or replicas whose containers cannot be created, stop any growth: more
   pods could not schedule or start either;
7. rate policies and bounds (:mod:`.policies`);
8. the demand floor (:mod:`.demand`): active demand hints hold the count up, past the
   stabilization windows and rate policies, since the load they announce has not arrived yet.

Scale to zero (opt-in, ``scaleToZero``) comes before all of them: a pool whose every replica has
been idle for ``idleSeconds``, with no hint active, goes to zero, and a pool at zero stays there
until a hint asks for replicas (then it wakes to at least ``minReplicas``).

The function is pure: everything it remembers goes into the returned status, which the
caller persists (in mode Auto after writing ``spec.replicas``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from genrm_operator.api.autoscaling import (
    MAX_DECISIONS,
    AutoscalerStatus,
    AutoscalingSpec,
    DecisionRecord,
    DecisionResult,
    MetricReading,
    format_quantity,
)
from genrm_operator.api.status import Condition, ConditionReason, ConditionStatus, ConditionType

from .demand import demand, measured_throughput
from .metrics import MetricOutcome, Tolerance, evaluate
from .milli import MILLI, quantity_milli
from .observation import Observation, ReplicaState
from .policies import limit, record_event
from .recommend import recommend
from .stabilize import remember, stabilize


@dataclass(frozen=True)
class Decision:
    """The outcome of one interval.

    ``apply`` is True when the caller must write ``desired_replicas`` to ``spec.replicas``
    (mode Auto and a change). ``status`` is the next ``status.autoscaler``; ``record`` the
    entry appended to its decisions this time (None when nothing new happened), for the
    Event and the log. ``limited_by`` names the stage that changed the raw recommendation.
    """

    current_replicas: int
    desired_replicas: int
    raw_recommendation: int
    limited_by: str | None
    metrics: tuple[MetricOutcome, ...]
    conditions: tuple[Condition, ...]
    panicking: bool
    apply: bool
    status: AutoscalerStatus
    record: DecisionRecord | None


_STABILIZED = frozenset({"ScaleUpStabilized", "ScaleDownStabilized"})
_INACTIVE = {
    "ScalingDisabled": "spec.replicas is 0: autoscaling is paused until something scales the pool up",
    "NoServingReplicas": "no replica is serving yet, so there is nothing to measure; holding",
    "FailedGetMetrics": "no driving metric could be read; holding until fallback.failureThreshold",
    "FallbackActive": "no driving metric could be read for fallback.failureThreshold intervals; applying it",
    "ScaledToZero": "the pool is at zero replicas (scaleToZero); a request or a demand hint wakes it",
}
_MESSAGES = {
    "ScaleUpStabilized": "recent recommendations were lower; applying the lowest in the up window",
    "ScaleDownStabilized": "recent recommendations were higher; applying the highest in the down window",
    "ScaleUpLimit": "the desired count grows faster than the scale-up policies allow",
    "ScaleDownLimit": "the desired count shrinks faster than the scale-down policies allow",
    "TooManyReplicas": "the desired count is above maxReplicas",
    "TooFewReplicas": "the desired count is below minReplicas",
    "Unschedulable": "replicas cannot be scheduled; not adding more until they are",
    "CannotStart": "replicas cannot start (a container cannot be created as specified); not adding more until they do",
    "Panic": "panic mode: no scale-down until the burst has passed",
    "Pending": "replicas added earlier are still starting; no further scale-up until they serve",
    "MetricsFailed": "a metric failed; scale-down is blocked until it reads again",
    "DemandFloor": "a demand hint holds the pool at the floor it asked for",
    "IdleToZero": "every replica has been idle for scaleToZero.idleSeconds and no demand hint is active",
    "HeldRequests": "the activator holds requests for the pool at zero; waking it",
}


def decide(spec: AutoscalingSpec, observation: Observation, status: AutoscalerStatus) -> Decision:
    """Decide the pool's replica count for this interval (spec mode must not be Off)."""
    if spec.max_replicas is None:
        raise ValueError("decide() needs an active autoscaling spec (mode Advisory or Auto)")
    current = observation.current_replicas
    tolerance = Tolerance.of(spec.behavior)
    outcomes = tuple(evaluate(m, observation, tolerance) for m in spec.metrics)
    low, high = spec.min_replicas, spec.max_replicas
    status = status.evolve(replica_throughput=measured_throughput(spec, observation.replicas,
                                                                  status.replica_throughput))
    hinted = demand(spec.demand, status, observation.hints, observation.now, high)
    status = status.evolve(demand=hinted.active, demand_seen=hinted.seen, demand_floor=hinted.floor or None,
                           demand_annotation_error=observation.hint_error)
    # Requests held at zero are demand that has arrived: at least minReplicas, at once.
    floor = max(hinted.floor, low if observation.held else 0)
    step = _Step(spec, observation, status, outcomes, floor)
    if current == 0 and spec.scale_to_zero is None:
        return step.conclude(current, current, "ScalingDisabled", inactive="ScalingDisabled")
    if current == 0:
        if not floor:
            return step.conclude(current, current, None, inactive="ScaledToZero")
        woken = min(max(floor, low), high)
        return step.conclude(woken, woken, "HeldRequests" if observation.held else "DemandFloor")
    idle = observation.idle_seconds
    if spec.scale_to_zero is not None and not floor and idle is not None \
            and idle >= spec.scale_to_zero.idle_seconds:
        return step.conclude(0, 0, "IdleToZero")
    if not low <= current <= high or current < floor:
        clamped = min(max(current, low, floor), high)
        reason = "TooManyReplicas" if current > high else "TooFewReplicas" if current < low else "DemandFloor"
        return step.conclude(clamped, clamped, reason)
    recommendation = recommend(spec, outcomes, current, status.consecutive_failures)
    step.status = status.evolve(consecutive_failures=recommendation.consecutive_failures)
    inactive = recommendation.reason if recommendation.reason in _INACTIVE else None
    if recommendation.replicas is None:
        return step.conclude(current, current, recommendation.reason, inactive=inactive)
    return step.control(recommendation.replicas, recommendation.reason, inactive)


class _Step:
    """One decision in the making: the inputs, and the status as it gets updated."""

    def __init__(
        self,
        spec: AutoscalingSpec,
        observation: Observation,
        status: AutoscalerStatus,
        outcomes: tuple[MetricOutcome, ...],
        floor: int,
    ) -> None:
        self.spec = spec
        self.observation = observation
        self.previous = status
        self.status = status
        self.outcomes = outcomes
        self.floor = floor
        self.panicking = False

    def control(self, raw: int, reason: str | None, inactive: str | None) -> Decision:
        """Stages 3-6 for a raw recommendation (``reason`` is set when it came from the fallback)."""
        spec, behavior = self.spec, self.spec.behavior
        assert spec.max_replicas is not None
        current, now = self.observation.current_replicas, self.observation.now
        panic_until = self._panic_until(raw)
        self.panicking = panic_until is not None
        up_window = timedelta(seconds=behavior.scale_up.stabilization_window_seconds)
        down_window = timedelta(seconds=behavior.scale_down.stabilization_window_seconds)
        panic_window = timedelta(seconds=spec.panic.window_seconds if spec.panic else 0)
        longest = max(up_window, down_window, panic_window)
        if self.panicking:
            up_window = min(up_window, panic_window)

        desired = stabilize(self.status.recommendations, raw, current, now, up_window, down_window)
        if desired != raw:
            reason = "ScaleUpStabilized" if raw >= current else "ScaleDownStabilized"
        if self.panicking and desired < current:
            desired, reason = current, "Panic"
        if desired > current and not self.panicking and self._own_replicas_starting():
            desired, reason = current, "Pending"
        if self.observation.blocked > 0 and desired > current:
            desired, reason = current, "Unschedulable" if self.observation.unschedulable else "CannotStart"
        limited, limiter = limit(
            desired, current, (spec.min_replicas, spec.max_replicas), behavior, self.status.scale_events, now
        )
        if limited < self.floor:
            limited, limiter = self.floor, "DemandFloor"
        self.status = self.status.evolve(
            recommendations=remember(self.status.recommendations, raw, now, longest), panic_until=panic_until
        )
        return self.conclude(raw, limited, limiter or reason, inactive=inactive)

    def _own_replicas_starting(self) -> bool:
        """True while replicas are starting and this autoscaler's last applied change added replicas."""
        if self.observation.count(ReplicaState.STARTING) <= self.observation.blocked:
            return False
        applied = [d for d in self.status.decisions if d.applied]
        return bool(applied) and applied[-1].result == "ScaleUp"

    def _panic_until(self, raw: int) -> datetime | None:
        """When the panic (if any) ends: ``duration_seconds`` after the last crossing of the threshold."""
        panic, now = self.spec.panic, self.observation.now
        if panic is None:
            return None
        if raw * MILLI >= quantity_milli(panic.threshold) * self.observation.current_replicas:
            return now + timedelta(seconds=panic.duration_seconds)
        previous = self.status.panic_until
        if previous is not None and previous > now:
            return previous
        return None

    def conclude(
        self, raw: int, desired: int, limited_by: str | None, inactive: str | None = None
    ) -> Decision:
        """Conditions, the decision record and the next status for a decided count."""
        current, now = self.observation.current_replicas, self.observation.now
        apply = self.spec.mode == "Auto" and desired != current
        update: dict[str, object] = {"desired_replicas": desired}
        if apply:
            update["last_scale_time"] = now
            update["scale_events"] = record_event(
                self.status.scale_events, desired - current, now, self.spec.behavior
            )
        record = self._record(raw, desired, limited_by)
        if record is not None:
            update["decisions"] = (*self.status.decisions, record)[-MAX_DECISIONS:]
        return Decision(
            current_replicas=current,
            desired_replicas=desired,
            raw_recommendation=raw,
            limited_by=limited_by,
            metrics=self.outcomes,
            conditions=_conditions(limited_by, inactive, now),
            panicking=self.panicking,
            apply=apply,
            status=self.status.evolve(**update),
            record=record,
        )

    def _record(self, raw: int, desired: int, limited_by: str | None) -> DecisionRecord | None:
        """A record for this decision, or None when it repeats the last one (same counts, same limiter).

        Recording only what changed keeps the 20 entries useful: a pool that sits stabilized
        for ten minutes would otherwise flush the interesting decisions out in under two.
        """
        decisions = self.previous.decisions
        last = decisions[-1] if decisions else None
        current = self.observation.current_replicas
        floor = self.floor or None
        summary = (current, raw, desired, limited_by, floor)
        if last is not None and (last.current_replicas, last.raw_recommendation, last.desired_replicas,
                                 last.limited_by, last.demand_floor) == summary:
            return None
        if last is None and summary == (current, current, current, None, None):
            return None
        result: DecisionResult = (
            "ScaleUp" if desired > current else "ScaleDown" if desired < current else "NoChange"
        )
        readings = tuple(
            MetricReading(
                name=o.key,
                value=None if o.value is None else format_quantity(o.value),
                target=format_quantity(o.target),
                replicas=o.replicas,
            )
            for o in self.outcomes
        )
        return DecisionRecord(
            id=last.id + 1 if last else 1,
            time=self.observation.now,
            current_replicas=current,
            metrics=readings,
            raw_recommendation=raw,
            limited_by=limited_by,
            demand_floor=floor,
            desired_replicas=desired,
            result=result,
            applied=self.spec.mode == "Auto" and result != "NoChange",
        )


def _conditions(limited_by: str | None, inactive: str | None, now: datetime) -> tuple[Condition, ...]:
    """HPA's three conditions as of ``now``: is there a usable signal, was it stabilized, was it clamped."""
    def condition(type_: ConditionType, holds: bool, reason: str, message: str) -> Condition:
        status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
        return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=now)

    active = (
        condition(ConditionType.SCALING_ACTIVE, False, inactive, _INACTIVE[inactive])
        if inactive
        else condition(ConditionType.SCALING_ACTIVE, True, ConditionReason.VALID_METRIC_FOUND,
                       "the metrics gave a count")
    )
    able = (
        condition(ConditionType.ABLE_TO_SCALE, True, limited_by, _MESSAGES[limited_by])
        if limited_by in _STABILIZED and limited_by
        else condition(ConditionType.ABLE_TO_SCALE, True, ConditionReason.READY_FOR_NEW_SCALE,
                       "the recommendation is applied as computed")
    )
    limited = (
        condition(ConditionType.SCALING_LIMITED, True, limited_by, _MESSAGES[limited_by])
        if limited_by in _MESSAGES and limited_by not in _STABILIZED and limited_by
        else condition(ConditionType.SCALING_LIMITED, False, ConditionReason.DESIRED_WITHIN_RANGE,
                       "the desired count is within the range")
    )
    return (active, able, limited)

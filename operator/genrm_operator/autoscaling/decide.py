"""One autoscaler decision: the control law end to end, called once per interval.

Order of the stages, each of which may change the count and is then named in
``limited_by``:

1. bounds first: a pool outside [min, max] is brought inside without looking at metrics;
2. per-metric proposals and the missing-data rules (:mod:`.recommend`) give the raw
   recommendation;
3. panic (optional): a raw recommendation at ``threshold`` x the current count starts a
   panic; while it lasts the up window shrinks to the panic window and nothing scales down;
4. stabilization windows (:mod:`.stabilize`);
5. unschedulable replicas stop any growth: more pods cannot schedule either;
6. rate policies and bounds (:mod:`.policies`).

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
    format_time,
    parse_time,
    quantity_value,
)

from .metrics import MetricOutcome, Tolerance, evaluate
from .observation import Observation
from .policies import limit, record_event
from .recommend import Recommendation, recommend
from .stabilize import remember, stabilize


@dataclass(frozen=True)
class Condition:
    """A condition to set on the pool: AbleToScale, ScalingActive or ScalingLimited (HPA's three)."""

    type: str
    status: bool
    reason: str
    message: str


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
}
_MESSAGES = {
    "ScaleUpStabilized": "recent recommendations were lower; applying the lowest in the scale-up window",
    "ScaleDownStabilized": "recent recommendations were higher; applying the highest in the scale-down window",
    "ScaleUpLimit": "the desired count grows faster than the scale-up policies allow",
    "ScaleDownLimit": "the desired count shrinks faster than the scale-down policies allow",
    "TooManyReplicas": "the desired count is above maxReplicas",
    "TooFewReplicas": "the desired count is below minReplicas",
    "Unschedulable": "replicas cannot be scheduled; not adding more until they are",
    "Panic": "panic mode: no scale-down until the burst has passed",
    "MetricsFailed": "a metric failed; scale-down is blocked until it reads again",
}


def decide(spec: AutoscalingSpec, observation: Observation, status: AutoscalerStatus) -> Decision:
    """Decide the pool's replica count for this interval (spec mode must not be Off)."""
    if spec.max_replicas is None:
        raise ValueError("decide() needs an active autoscaling spec (mode Advisory or Auto)")
    current = observation.current_replicas
    tolerance = Tolerance(
        up=quantity_value(spec.behavior.scale_up.tolerance),
        down=quantity_value(spec.behavior.scale_down.tolerance),
    )
    outcomes = tuple(evaluate(m, observation, tolerance) for m in spec.metrics)
    bounds = (spec.min_replicas, spec.max_replicas)
    if current == 0:
        recommendation = Recommendation(None, "ScalingDisabled", status.consecutive_failures)
    elif not bounds[0] <= current <= bounds[1]:
        clamped = min(max(current, bounds[0]), bounds[1])
        reason = "TooManyReplicas" if current > clamped else "TooFewReplicas"
        return _conclude(spec, observation, status, outcomes, clamped, clamped, reason, status)
    else:
        recommendation = recommend(spec, outcomes, current, status.consecutive_failures)
    interim = status.model_copy(update={"consecutive_failures": recommendation.consecutive_failures})
    if recommendation.replicas is None:
        return _conclude(spec, observation, status, outcomes, current, current, recommendation.reason, interim)
    return _control(spec, observation, interim, outcomes, recommendation)


def _control(
    spec: AutoscalingSpec,
    observation: Observation,
    status: AutoscalerStatus,
    outcomes: tuple[MetricOutcome, ...],
    recommendation: Recommendation,
) -> Decision:
    """Stages 3-6 for a raw recommendation."""
    assert recommendation.replicas is not None and spec.max_replicas is not None
    raw, current, now = recommendation.replicas, observation.current_replicas, observation.now
    behavior = spec.behavior
    panic_until = _panic_until(spec, raw, current, now, status.panic_until)
    panicking = panic_until is not None
    up_window = timedelta(seconds=behavior.scale_up.stabilization_window_seconds)
    if spec.panic is not None and panicking:
        up_window = min(up_window, timedelta(seconds=spec.panic.window_seconds))
    down_window = timedelta(seconds=behavior.scale_down.stabilization_window_seconds)
    longest = max(
        timedelta(seconds=behavior.scale_up.stabilization_window_seconds),
        down_window,
        timedelta(seconds=spec.panic.window_seconds if spec.panic else 0),
    )

    desired = stabilize(status.recommendations, raw, current, now, up_window, down_window)
    reason = None if desired == raw else ("ScaleUpStabilized" if raw >= current else "ScaleDownStabilized")
    if panicking and desired < current:
        desired, reason = current, "Panic"
    if observation.unschedulable > 0 and desired > current:
        desired, reason = current, "Unschedulable"
    limited, limiter = limit(desired, current, (spec.min_replicas, spec.max_replicas), behavior,
                             status.scale_events, now)
    status = status.model_copy(
        update={
            "recommendations": remember(status.recommendations, raw, now, longest),
            "panic_until": format_time(panic_until) if panic_until else None,
        }
    )
    return _conclude(spec, observation, status, outcomes, raw, limited, limiter or reason, status,
                     fallback=recommendation.fallback, panicking=panicking)


def _panic_until(
    spec: AutoscalingSpec, raw: int, current: int, now: datetime, previous: str | None
) -> datetime | None:
    """When the panic (if any) ends: ``window_seconds`` after the last crossing of the threshold."""
    if spec.panic is None:
        return None
    if raw >= quantity_value(spec.panic.threshold) * current:
        return now + timedelta(seconds=spec.panic.window_seconds)
    if previous is not None and parse_time(previous) > now:
        return parse_time(previous)
    return None


def _conclude(
    spec: AutoscalingSpec,
    observation: Observation,
    previous: AutoscalerStatus,
    outcomes: tuple[MetricOutcome, ...],
    raw: int,
    desired: int,
    limited_by: str | None,
    status: AutoscalerStatus,
    *,
    fallback: bool = False,
    panicking: bool = False,
) -> Decision:
    """Conditions, the decision record and the next status for a decided count."""
    current, now = observation.current_replicas, observation.now
    apply = spec.mode == "Auto" and desired != current
    result: DecisionResult = "ScaleUp" if desired > current else "ScaleDown" if desired < current else "NoChange"
    update: dict[str, object] = {"desired_replicas": desired}
    if apply:
        update["last_scale_time"] = format_time(now)
        update["scale_events"] = record_event(status.scale_events, desired - current, now, spec.behavior)
    record = _record(spec, observation, previous, outcomes, raw, desired, limited_by, result)
    if record is not None:
        update["decisions"] = (*status.decisions, record)[-MAX_DECISIONS:]
    if fallback:
        limited_by = "FallbackActive"
    return Decision(
        current_replicas=current,
        desired_replicas=desired,
        raw_recommendation=raw,
        limited_by=limited_by,
        metrics=outcomes,
        conditions=_conditions(limited_by),
        panicking=panicking,
        apply=apply,
        status=status.model_copy(update=update),
        record=record,
    )


def _record(
    spec: AutoscalingSpec,
    observation: Observation,
    previous: AutoscalerStatus,
    outcomes: tuple[MetricOutcome, ...],
    raw: int,
    desired: int,
    limited_by: str | None,
    result: DecisionResult,
) -> DecisionRecord | None:
    """A record for this decision, or None when it repeats the last one (same counts, same limiter).

    Recording only what changed keeps the 20 entries useful: a pool that sits stabilized
    for ten minutes would otherwise flush the interesting decisions out in under two.
    """
    last = previous.decisions[-1] if previous.decisions else None
    current = observation.current_replicas
    if last is not None and (last.current_replicas, last.raw_recommendation, last.desired_replicas,
                             last.limited_by) == (current, raw, desired, limited_by):
        return None
    if last is None and raw == desired == current and limited_by is None:
        return None
    readings = tuple(
        MetricReading(
            name=o.key,
            value=None if o.value is None else format_quantity(o.value),
            target=format_quantity(o.target),
            replicas=o.replicas,
        )
        for o in outcomes
    )
    return DecisionRecord(
        id=(last.id + 1) if last else 1,
        time=format_time(observation.now),
        current_replicas=current,
        metrics=readings,
        raw_recommendation=raw,
        limited_by=limited_by,
        desired_replicas=desired,
        result=result,
        applied=spec.mode == "Auto" and result != "NoChange",
    )


def _conditions(limited_by: str | None) -> tuple[Condition, ...]:
    """HPA's three conditions for the stage that limited the decision."""
    inactive = limited_by in _INACTIVE
    active = Condition(
        "ScalingActive",
        not inactive,
        limited_by if inactive and limited_by else "ValidMetricFound",
        _INACTIVE[limited_by] if inactive and limited_by else "the metrics were read and a count computed",
    )
    stabilized = limited_by in _STABILIZED
    able = Condition(
        "AbleToScale",
        True,
        limited_by if stabilized and limited_by else "ReadyForNewScale",
        _MESSAGES[limited_by] if stabilized and limited_by else "the recommendation is applied as computed",
    )
    clamped = limited_by is not None and not stabilized and not inactive
    limited = Condition(
        "ScalingLimited",
        clamped,
        limited_by if clamped and limited_by else "DesiredWithinRange",
        _MESSAGES[limited_by] if clamped and limited_by else "the desired count is within the acceptable range",
    )
    return (active, able, limited)

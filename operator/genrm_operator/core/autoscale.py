"""The autoscaler as a stage of the reconcile step: the replicas the step classified in, its part of the status out.

The control law (:mod:`genrm_operator.autoscaling`) decides from an observation; this stage
builds that observation from the step's own classification (so a step classifies its pods
once), applies the precedence rule for other writers of ``spec.replicas``
(:mod:`genrm_operator.autoscaling.override`) and turns the decision into conditions, the next
``status.autoscaler`` and Events. The shell only scrapes the samples before the step (when a
decision is due) and, after the status write, writes the decided count through the scale
subresource.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from genrm_contract.demand import DemandHint

from ..api.autoscaling import AutoscalerStatus
from ..api.status import AUTOSCALER_CONDITIONS, Condition, ConditionReason, ConditionStatus, ConditionType, EventReason
from ..autoscaling import Decision, Observation, ReplicaSample, ReplicaState, decide
from ..autoscaling.demand import annotation_hint
from ..autoscaling.override import adopt, external_write
from .classify import Replica, Role
from .conditions import find, set_condition
from .model import Event, Observed

_STATE = {Role.SERVING: ReplicaState.SERVING, Role.STARTING: ReplicaState.STARTING}


@dataclass(frozen=True)
class Scaling:
    """The autoscaler's part of one step."""

    conditions: tuple[Condition, ...]
    status: AutoscalerStatus | None
    """The next ``status.autoscaler`` (the previous one when no decision was due)."""
    decision: Decision | None = None
    """This step's decision, when one was due; the shell applies it after the status write."""
    events: tuple[Event, ...] = ()


def autoscale(obs: Observed, replicas: list[Replica]) -> Scaling:
    """Decide when samples were taken (a decision is due); between decisions keep the last conditions."""
    spec, previous = obs.spec.autoscaling, obs.status
    if spec.mode == "Off":
        return Scaling(conditions=(), status=previous.autoscaler)
    if obs.metrics is None:
        kept = tuple(c for c in previous.conditions if c.type in AUTOSCALER_CONDITIONS)
        return Scaling(conditions=kept, status=previous.autoscaler)
    seen = observation(obs, replicas)
    memory = previous.autoscaler or AutoscalerStatus()
    external = external_write(spec, seen.current_replicas, previous.autoscaler)
    events: tuple[Event, ...] = (Event("Warning", EventReason.AUTOSCALER_OVERRIDDEN,
                                       f"spec.replicas set to {seen.current_replicas} by another writer; adopted as "
                                       "the autoscaler's current count"),) if external else ()
    if external:
        memory = adopt(spec, memory, seen.current_replicas, seen.now)
    decision = decide(spec, seen, memory)
    events = (*events, *_annotation_events(previous.autoscaler, decision))
    was_overridden = (c := find(previous.conditions, ConditionType.AUTOSCALER_OVERRIDDEN)) is not None \
        and c.status is ConditionStatus.TRUE
    overridden = external or (was_overridden and not decision.apply) if spec.mode == "Auto" else None
    return Scaling(conditions(decision, overridden, obs), decision.status, decision, events)


def _annotation_events(previous: AutoscalerStatus | None, decision: Decision) -> tuple[Event, ...]:
    """A Warning when the pool's demand annotation newly stopped being a hint (once per change, not per interval)."""
    error = decision.status.demand_annotation_error
    if error is None or (previous is not None and previous.demand_annotation_error == error):
        return ()
    return (Event("Warning", EventReason.DEMAND_HINT_INVALID, f"annotation genrm.io/demand ignored: {error}"),)


def reported_hints(obs: Observed) -> tuple[tuple[DemandHint, ...], str | None]:
    """Every demand hint reported now (by the gateways, the activators, the annotation), and why the
    annotation is no hint."""
    annotated, error = annotation_hint(obs.demand_annotation)
    hints = [h for view in obs.sidecars.values() if view is not None for h in view.demand]
    return (*hints, *obs.relayed_hints, *((annotated,) if annotated is not None else ())), error


def idle_seconds(obs: Observed, replicas: list[Replica]) -> float | None:
    """How long every replica has been idle: None when any replica is starting, not heard from or busy,
    or when there is none (scale to zero never acts on what it cannot see)."""
    froms: list[float] = []
    for r in replicas:
        if r.role is Role.STARTING:
            return None
        if r.role is not Role.SERVING:
            continue
        view = obs.sidecars.get(r.pod.name)
        if view is None or view.idle_from is None:
            return None
        froms.append(view.idle_from)
    return obs.now - max(froms) if froms else None


def observation(obs: Observed, replicas: list[Replica]) -> Observation:
    """The control law's view of the pool: serving and starting replicas (draining ones are not capacity)."""
    samples = obs.metrics.per_replica if obs.metrics is not None else {}
    throughput = obs.metrics.throughput if obs.metrics is not None else {}
    hints, hint_error = reported_hints(obs)
    return Observation(
        now=datetime.fromtimestamp(obs.now, UTC),
        current_replicas=obs.spec.replicas,
        replicas=[
            ReplicaSample(r.pod.name, _STATE[r.role],
                          dict(samples.get(r.pod.name, {})) if r.role is Role.SERVING else {},
                          throughput.get(r.pod.name) if r.role is Role.SERVING else None)
            for r in replicas if r.role in _STATE
        ],
        unschedulable=sum(1 for r in replicas if r.role is Role.STARTING and r.pod.unschedulable),
        cannot_start=sum(1 for r in replicas if r.role is Role.STARTING and r.pod.cannot_start
                         and not r.pod.unschedulable),
        pool_values=dict(obs.metrics.pool) if obs.metrics is not None else {},
        hints=hints,
        hint_error=hint_error,
        idle_seconds=None if obs.held else idle_seconds(obs, replicas),
        held=obs.held,
    )


def conditions(decision: Decision, overridden: bool | None, obs: Observed) -> tuple[Condition, ...]:
    """HPA's three conditions from the decision, plus ``AutoscalerOverridden`` (None: not mode Auto, left out)."""
    previous, now, generation = obs.status.conditions, obs.now, obs.generation
    out = [set_condition(previous, c.type, c.status, c.reason, c.message, now, generation)
           for c in decision.conditions]
    if overridden:
        out.append(set_condition(previous, ConditionType.AUTOSCALER_OVERRIDDEN, ConditionStatus.TRUE,
                                 ConditionReason.EXTERNAL_WRITE,
                                 "spec.replicas was set by another writer; the autoscaler adopted it as its "
                                 "current count and changes it only when its own decision differs",
                                 now, generation))
    elif overridden is not None:
        out.append(set_condition(previous, ConditionType.AUTOSCALER_OVERRIDDEN, ConditionStatus.FALSE,
                                 ConditionReason.AUTOSCALER_IN_CHARGE,
                                 "spec.replicas is what the autoscaler last decided",
                                 now, generation))
    return tuple(out)

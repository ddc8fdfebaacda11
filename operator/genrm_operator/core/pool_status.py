"""The pool's status after one reconcile step: counts, revisions and conditions (CloudNativePG's
``cluster_status.go`` in small). Conditions are recomputed from scratch each step
(`core.conditions`); the autoscaler's follow the state machine's."""

from __future__ import annotations

from ..api.pool import GenRMPoolStatus
from ..api.status import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    Operation,
    OperationPhase,
    OperationType,
)
from .autoscale import Scaling
from .backoff import BackOff, back_off
from .childrenplan import CHILD_FAILED
from .classify import Role
from .conditions import set_condition
from .judgeswitch import judge_status
from .names import selector
from .step import WARNING_OUTCOMES, Step, counts, failure_detail, failure_text, in_service, role, victim_names

PROGRESSING_REASONS = {OperationType.SCALE_OUT: ConditionReason.SCALING_OUT,
                       OperationType.SCALE_IN: ConditionReason.SCALING_IN,
                       OperationType.ROLLOUT: ConditionReason.ROLLING_OUT,
                       OperationType.JUDGE_SWITCH: ConditionReason.SWITCHING_JUDGE}


def next_status(s: Step, op: Operation | None, scaling: Scaling) -> GenRMPoolStatus:
    """The whole status: the state machine's counts and conditions, then the autoscaler's."""
    serving, starting, draining = counts(s, op)
    live = [r for r in s.replicas if r.role is not Role.TERMINATING]
    victims_left = sum(1 for v in op.victims if v.name in s.by_name) if op and \
        op.type is not OperationType.SCALE_OUT else 0
    victims = victim_names(op)
    drained = sum(1 for r in role(s, Role.DRAINED) if r.pod.name not in victims)  # victims are counted above
    held = back_off(s.history)
    if held is not None and (held.until <= s.now or serving + starting >= s.desired):
        held = None  # creates may go, or none is needed: nothing is held back
    reachable = sum(1 for r in s.replicas if in_service(s, r))
    conds = [
        available(s, reachable),
        progressing(s, op, serving, starting, draining, held),
        degraded(s, serving, draining + drained + victims_left, held),
    ]
    if op is not None and op.type is OperationType.ROLLOUT:
        conds.append(condition(s, ConditionType.ROLLOUT_BLOCKED, bool(s.blocked),
                               ConditionReason.SURGE_BLOCKED if s.blocked else ConditionReason.AS_EXPECTED, s.blocked))
    revisions = {r.pod.revision for r in live}
    return s.status.evolve(
        updated_replicas=sum(1 for r in live if r.pod.revision == s.revision),
        update_revision=s.revision,
        current_revision=s.revision if revisions <= {s.revision} else s.status.current_revision
        or min(revisions - {s.revision}),
        observed_generation=s.obs.generation,
        replicas=len(live),
        ready_replicas=sum(1 for r in live if r.pod.ready),
        serving_replicas=reachable,
        draining_replicas=draining + drained + victims_left,
        selector=selector(s.obs.name),
        next_ordinal=s.next_ordinal,
        conditions=[*conds, *scaling.conditions],
        autoscaler=scaling.status,
        placement=s.placement,
        judge=judge_status(s, op),
        operation=op,
        operation_count=s.op_count,
        history=s.history,
    )


def condition(s: Step, type_: ConditionType, holds: bool, reason: str, message: str) -> Condition:
    """``type_`` as this step sees it, keeping its transition time unless its status flips."""
    status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
    return set_condition(s.status.conditions, type_, status, reason, message, s.now, s.obs.generation)


def available(s: Step, serving: int) -> Condition:
    if s.desired == 0:
        return condition(s, ConditionType.AVAILABLE, True, ConditionReason.SCALED_TO_ZERO, "no replicas requested")
    if serving > 0:
        return condition(s, ConditionType.AVAILABLE, True, ConditionReason.REPLICAS_SERVING,
                         f"{serving}/{s.desired} replicas serving")
    return condition(s, ConditionType.AVAILABLE, False, ConditionReason.NO_SERVING_REPLICAS, "no replica is serving")


def progressing(s: Step, op: Operation | None, serving: int, starting: int, draining: int,
                held: BackOff | None) -> Condition:
    if op is not None:
        if op.phase is OperationPhase.PAUSED:
            return condition(s, ConditionType.PROGRESSING, False, ConditionReason.ROLLOUT_PAUSED,
                             f"{op.id} paused by spec.paused: {op.message}")
        return condition(s, ConditionType.PROGRESSING, True, PROGRESSING_REASONS[op.type],
                         f"{op.id} {op.phase}: {op.message}")
    if serving == s.desired and starting == 0 and draining == 0:
        return condition(s, ConditionType.PROGRESSING, False, ConditionReason.AT_TARGET, f"{serving} replicas serving")
    if held is not None:
        return condition(s, ConditionType.PROGRESSING, False, held.reason,
                         f"{serving}/{s.desired} serving; {starting} starting; {held.resumes()}")
    last = s.history[-1] if s.history else None
    reason = last.reason if last is not None and last.outcome in WARNING_OUTCOMES else ""
    return condition(s, ConditionType.PROGRESSING, False, reason or ConditionReason.WAITING,
                     f"{serving}/{s.desired} serving; {starting} starting")


def degraded(s: Step, serving: int, surplus: int, held: BackOff | None) -> Condition:
    """Degraded while a replica failed, creates back off after failures (`back_off`, with when
    they resume), or the last operation fell short; False otherwise."""
    failed = role(s, Role.FAILED)
    last = s.history[-1] if s.history else None
    if s.obs.child_errors:
        return condition(s, ConditionType.DEGRADED, True, CHILD_FAILED, "; ".join(s.obs.child_errors))
    if failed:
        inconsistent = all(r.failure == ConditionReason.REPLICA_INCONSISTENT for r in failed)
        detail = "; ".join(f"{r.pod.name}: {failure_text(r.failure, failure_detail(r))}" for r in failed)
        return condition(s, ConditionType.DEGRADED, True,
                         ConditionReason.REPLICA_INCONSISTENT if inconsistent else ConditionReason.REPLICA_FAILED,
                         detail)
    if held is not None:
        return condition(s, ConditionType.DEGRADED, True, held.reason, held.message())
    if last is not None and last.outcome in WARNING_OUTCOMES and (serving != s.desired or surplus):
        return condition(s, ConditionType.DEGRADED, True, last.reason or ConditionReason.OPERATION_FAILED, last.message)
    return condition(s, ConditionType.DEGRADED, False, ConditionReason.AS_EXPECTED, "")

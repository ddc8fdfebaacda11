"""One level-based reconcile step: observed state and time in, status and actions out.

The single writer (one kopf daemon per pool) calls :func:`reconcile` whenever
something changed or a resync is due, writes the returned status first and
only then carries out the actions that take replicas away or back or create
them (`model.deliver`; publishes and verification probes go beside the
write). Every action is idempotent, so running a step twice, crashing between
the status write and the actions, or a publish whose status write was refused,
is safe.

This module is the step's pipeline and what it does outside any operation
(note creates seen, supersede, replace failed replicas, start an operation).
The rest is free functions per concern over one small state object
(`step.Step`), each taking the operation and returning the next one:
`scale_out`, `scale_in`, `rollout`, `pool_status`, and `backoff` for creates
held back after failures.

Scale-out phases: Pending -> Provisioning -> Verifying -> Succeeded | Partial.
Scale-in phases:  Pending -> Unpublishing -> Fencing -> Draining -> Removing
                  -> Succeeded | Failed.
A new ``spec.replicas`` while an operation runs supersedes it; the next
operation undoes the least progressed work first (rescue draining replicas
before creating pods; remove unpublished pods before serving ones).

Pod-count bound (checked by the property tests and the e2e soak): pods that
hold GPUs -- every pod of the pool, Terminating and Drained ones included,
except failed ones (crashed, failed, never ready in time or answering
differently) -- never exceed ``max(spec.replicas, their previous count)``:
creates only fill the room that all those pods leave below ``spec.replicas``,
so a scale-out waits for Terminating pods to go. A failed replica is replaced
without waiting for it to go (at once when it is the first failure in a row,
else after the back-off: `back_off`): if it once served it is fenced before
deletion, so its replacement may briefly run beside it. A replica that never served is deleted with a grace period of
``NEVER_SERVED_GRACE_SECONDS``: its preStop would otherwise hold its GPUs for
the whole drain deadline, waiting for a drain nobody needs.
"""

from __future__ import annotations

from genrm_contract.sidecar import DrainPhase, DrainState

from ..api.status import AddedPod, ConditionReason, EventReason, Operation, OperationPhase, OperationType
from . import activation, placement
from .autoscale import autoscale
from .backoff import create_backoff
from .children import owner_reference
from .childrenplan import ChildAction, desired_children, plan_children
from .classify import Replica, Role
from .clock import stamp
from .judgeswitch import (
    advance_judge_switch,
    judge_of,
    label_unlabelled,
    pinned_judge,
    start_fields,
    switch_needed,
)
from .model import Drain, Observed, Plan, SetPublished, Undrain
from .names import drain_id
from .pool_status import next_status
from .rollout import advance_rollout, outdated
from .scale_in import advance_scale_in
from .scale_out import advance_scale_out, awaits_publication
from .step import (
    Step,
    begin,
    counts,
    delete,
    emit,
    failure_detail,
    failure_text,
    finish,
    ordinal_of,
    role,
    victim_names,
)


def reconcile(obs: Observed) -> Plan:
    """Decide the next status and actions for one pool: free functions over one small `Step`, the
    operation passed to each and returned by it."""
    s = begin(obs)
    op = note_observed_creates(s, obs.status.operation)
    # Supersede first: the victims of a superseded scale-in are ordinary replicas again, so a
    # failed or drained one is cleaned up in this step rather than outliving its replacement.
    op = supersede_if_target_changed(s, op)
    clean_up_outside_operations(s, op)
    if op is None:
        op = maybe_start_operation(s)
    if op is not None and op.type is OperationType.SCALE_OUT:
        op = advance_scale_out(s, op)
    elif op is not None and op.type is OperationType.SCALE_IN:
        op = advance_scale_in(s, op)
    elif op is not None and op.type is OperationType.JUDGE_SWITCH:
        op = advance_judge_switch(s, op)
    elif op is not None:
        op = advance_rollout(s, op)
    # The autoscaler sizes what clients reach: a preview's idle replicas would dilute its signal.
    scaling = autoscale(obs, [r for r in s.replicas if judge_of(s, r) == s.active_judge])
    return Plan(status=next_status(s, op, scaling), actions=tuple(s.actions),
                events=(*s.events, *scaling.events), decision=scaling.decision, children=plan_pool_children(obs))


def plan_pool_children(obs: Observed) -> tuple[ChildAction, ...]:
    """The Secret's, the Service's, the PodDisruptionBudget's and the activator's EndpointSlice's
    decisions (`childrenplan`, `activation`), none when the step observed no children."""
    c = obs.children
    if c is None:
        return ()
    desired = desired_children(obs.name, c.pool_uid, c.namespace, obs.spec, c.token, pinned_judge(obs))
    if c.activator is not None and activation.wants_activator(obs, activation.serving_addresses(obs.name, c.slices)):
        desired["EndpointSlice"] = activation.slice_manifest(obs.name, c.pool_uid, c.namespace, c.activator,
                                                             owner_reference(obs.name, c.pool_uid))
    return plan_children(desired, c.objects, c.pool_uid)


def note_observed_creates(s: Step, op: Operation | None) -> Operation | None:
    """Mark the operation's creates the index shows, and note those that failed.

    A failure is noted while the pod shows it, before it is deleted: from its deletion on, a
    pod's phase is the kubelet's answer to the deletion (`classify.failure_reason`). The note
    is a decision, written before the delete that retires the failed pod, so it outlives the
    pod and an operator restart, and the operation ends on it (`noted_failures`). A pod the
    operation chose to retire (one of its victims, such as a surge replica a retarget made
    outdated) is never noted: retiring it is no failure of the operation."""
    if op is None or op.type is OperationType.SCALE_IN:
        return op
    victims = victim_names(op)

    def noted(added: AddedPod) -> AddedPod:
        r = s.by_name.get(added.name)
        if r is None:
            return added
        if added.failure or added.name in victims or not r.failure:
            return added.evolve(observed=True)
        return added.evolve(observed=True, failure=r.failure, failure_message=failure_detail(r))
    return op.evolve(added_pods=[noted(a) for a in op.added_pods])


def clean_up_outside_operations(s: Step, op: Operation | None) -> None:
    """Replace failed and misplaced replicas, delete drained leftovers, unpublish pods deleted by others,
    undrain published replicas left draining outside any operation."""
    victims = victim_names(op)
    for r in s.replicas:
        pod = r.pod
        if r.role is Role.TERMINATING and pod.published:
            s.actions.append(SetPublished(pod.name, pod.uid, False))
        if pod.name in victims:
            continue
        if r.role is Role.SERVING and r.sidecar is not None and judge_of(s, r) == s.active_judge \
                and r.sidecar.state in (DrainState.SOFT_DRAIN, DrainState.FENCED):
            # Published and no victim, yet draining: a victim given back or put back whose undrain
            # was lost (its operation superseded before it landed). Only the operator's own drain id
            # is undone; a drain under another (the gateway's preStop) refuses it. Another judge
            # revision's fence is the switch's (`judgeswitch`), not a lost undrain.
            s.actions.append(Undrain(pod.name, drain_id(pod.uid)))
        if r.role is Role.FAILED:
            retire_failed(s, r)
        elif r.role is Role.DRAINED:
            delete(s, pod)
        elif pod.name in s.misplaced and s.placement is not None:
            # Never served, so it goes at once; the operation's shortfall makes its replacement,
            # pinned. Retiring it is the operator's choice, no failure: it backs nothing off.
            emit(s, EventReason.REPLICA_MISPLACED, f"Replacing {placement.describe(r, s.products)}: new replicas "
                 f"go to GPU {s.placement.gpu_product}, the product of {s.placement.replica}'s node")
            delete(s, pod)


def retire_failed(s: Step, r: Replica) -> None:
    """Replace a failed replica without cutting off requests it still holds.

    A crashed engine may have restarted and admitted new work before we
    noticed, so a once-published replica whose sidecar still answers is
    unpublished and fenced first and deleted once nothing is in flight. A
    replica that never served, or whose sidecar is unreachable, cannot be
    serving anyone and is deleted directly.
    """
    pod, sidecar = r.pod, r.sidecar
    emit(s, EventReason.REPLICA_FAILED, f"Replacing {pod.name}: {failure_text(r.failure, failure_detail(r))}",
         warning=True)
    if pod.published:
        s.actions.append(SetPublished(pod.name, pod.uid, False))
    if sidecar is None or not pod.ever_published or (
            sidecar.inflight == 0 and sidecar.state in (DrainState.FENCED, DrainState.DRAINED)):
        delete(s, pod)
    elif sidecar.state in (DrainState.SERVING, DrainState.SOFT_DRAIN):
        s.actions.append(Drain(pod.name, drain_id(pod.uid), DrainPhase.FENCE))


def supersede_if_target_changed(s: Step, op: Operation | None) -> Operation | None:
    """End ``op`` when what it works toward changed: the replica count (a judge switch follows it
    instead), the judge (another revision than the switch's, or any while another operation runs:
    its creates would be of the new judge), or the update strategy under a rollout."""
    if op is None:
        return None
    if op.type is OperationType.JUDGE_SWITCH:
        if op.judge_to != s.judge:
            finish(s, op, OperationPhase.SUPERSEDED, ConditionReason.JUDGE_CHANGED,
                   f"the spec's judge revision changed to {s.judge}")
            return None
        return op
    if s.judge != s.active_judge:
        finish(s, op, OperationPhase.SUPERSEDED, ConditionReason.JUDGE_CHANGED,
               f"the spec's judge revision changed to {s.judge}")
        return None
    if op.to != s.desired:
        finish(s, op, OperationPhase.SUPERSEDED, ConditionReason.TARGET_CHANGED,
               f"spec.replicas changed to {s.desired}")
        return None
    if op.type is OperationType.ROLLOUT and s.obs.spec.update_strategy.type == "OnDelete":
        finish(s, op, OperationPhase.SUPERSEDED, ConditionReason.STRATEGY_CHANGED,
               "spec.updateStrategy.type is OnDelete")
        return None
    return op


def maybe_start_operation(s: Step) -> Operation | None:
    label_unlabelled(s)
    if switch_needed(s):
        return start(s, OperationType.JUDGE_SWITCH, counts(s, None)[0])
    if s.judge != s.active_judge:
        return None  # a pod still to be labelled holds the switch back; no other operation may start
    serving, starting, draining = counts(s, None)
    backoff = create_backoff(s.history, s.now)
    publishable = any(awaits_publication(r) for r in role(s, Role.STARTING))
    shortfall = s.desired - serving - starting
    if shortfall > 0 and (draining > 0 or backoff == 0.0 or publishable):
        return start(s, OperationType.SCALE_OUT, serving)
    if serving + starting + draining > s.desired:
        return start(s, OperationType.SCALE_IN, serving)
    if serving < s.desired and publishable:
        return start(s, OperationType.SCALE_OUT, serving)
    if outdated(s, None) and s.obs.spec.update_strategy.type == "RollingUpdate" and backoff == 0.0:
        return start(s, OperationType.ROLLOUT, serving)
    return None


def start(s: Step, type_: OperationType, serving: int) -> Operation:
    s.op_count += 1
    now = stamp(s.now)
    added = s.carried if type_ is not OperationType.SCALE_IN else []
    if type_ is OperationType.SCALE_OUT:
        added = [*added, *adopted(s, {a.name for a in added})]
    detail = f" to revision {s.revision}" if type_ is OperationType.ROLLOUT else \
        f" from judge revision {s.active_judge} to {s.judge}" if type_ is OperationType.JUDGE_SWITCH else ""
    emit(s, EventReason.operation(type_, "Started"), f"op-{s.op_count} {type_} {serving}->{s.desired}{detail}")
    return Operation(
        id=f"op-{s.op_count}", type=type_, from_=serving, to=s.desired, phase=OperationPhase.PENDING,
        started_at=now, last_transition_time=now, added_pods=added,
        revision=s.revision if type_ is OperationType.ROLLOUT else "",
        **(start_fields(s) if type_ is OperationType.JUDGE_SWITCH else {}),
    )


def adopted(s: Step, known: set[str]) -> list[AddedPod]:
    """The starting replicas a new scale-out takes over (observed; ``known``: already its own).

    It verifies and publishes them as its own, so it ends on their failures too: a replacement
    that an earlier operation created and left starting, then failed verification under this
    one, must count for the back-off (`back_off`) like the replica it replaced."""
    return [AddedPod(name=r.pod.name, ordinal=ordinal, observed=True) for r in role(s, Role.STARTING)
            if r.pod.name not in known and (ordinal := ordinal_of(s.obs.name, r.pod.name)) is not None]

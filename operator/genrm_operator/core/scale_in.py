"""Scale-in: victims fixed in status first, then each one unpublished, soft-drained, fenced, drained
and deleted (CloudNativePG's ``cluster_scale.go`` in small). A rollout retires its outdated
replicas through the same victim steps (`advance_victims`)."""

from __future__ import annotations

from genrm_contract.sidecar import DrainPhase, DrainState

from ..api.status import ConditionReason, EventReason, Operation, OperationPhase, Victim
from .activation import activator_in_place
from .classify import Role
from .clock import instant, stamp
from .model import DeletePod, Drain, SetPublished
from .names import drain_id
from .step import VICTIM_PHASES, Step, counts, delete, emit, finish, set_phase
from .victims import choose_victims


def advance_scale_in(s: Step, op: Operation) -> Operation | None:
    if op.phase is OperationPhase.PENDING:
        return select_victims(s, op)
    victims, phases, failure = advance_victims(s, op.victims)
    op = op.evolve(victims=victims)
    left = [p for p in phases if p is not None]
    if failure:
        finish(s, op, OperationPhase.FAILED, ConditionReason.DRAIN_TIMEOUT, failure)
        return None
    if not left:
        finish(s, op, OperationPhase.SUCCEEDED, ConditionReason.TARGET_REACHED, f"removed {len(victims)} replica(s)")
        return None
    return set_phase(s, op, min(left, key=VICTIM_PHASES.index), f"{len(left)} victim(s) left")


def select_victims(s: Step, op: Operation) -> Operation:
    """Fix the victims in status before any side effect touches them."""
    serving, starting, draining = counts(s, op)
    candidates = [r for r in s.replicas if r.role in (Role.SERVING, Role.STARTING, Role.DRAINING)]
    chosen = choose_victims(candidates, serving + starting + draining - s.desired, s.revision)
    victims = [Victim(name=r.pod.name, uid=r.pod.uid, needs_drain=r.pod.ever_published) for r in chosen]
    emit(s, EventReason.VICTIMS_SELECTED, ", ".join(v.name for v in victims) or "none")
    # The message the next step keeps while it unpublishes: that step then has nothing to write
    # before its actions (the victims' names are in the VictimsSelected event).
    return set_phase(s, op.evolve(victims=victims), OperationPhase.UNPUBLISHING, f"{len(victims)} victim(s) left")


def advance_victims(s: Step, victims: list[Victim]) -> tuple[list[Victim], list[OperationPhase | None], str]:
    """Move every victim along: the victims, each one's phase (None when gone) and the first failure."""
    drain = s.obs.spec.drain
    moved: list[Victim] = []
    phases: list[OperationPhase | None] = []
    failure = ""
    for v in victims:
        v, phase, problem = advance_victim(s, v, drain.propagation_seconds, drain.timeout_seconds, drain.on_timeout)
        moved.append(v)
        phases.append(phase)
        failure = failure or problem
    return moved, phases, failure


def advance_victim(s: Step, v: Victim, propagation: float, timeout: float,
                   on_timeout: str) -> tuple[Victim, OperationPhase | None, str]:
    """Move one victim along; returns it, its phase (None when gone) and a failure message."""
    r = s.by_name.get(v.name)
    if r is None or r.pod.uid != v.uid:
        return v, None, ""
    pod, now = r.pod, s.now
    if r.role is Role.TERMINATING:
        return v, OperationPhase.REMOVING, ""
    if not v.needs_drain and (pod.published or pod.ever_published):
        # Chosen from a pod list that predated its publication: it may be serving, so drain it.
        v = v.evolve(needs_drain=True)
    if r.role is Role.FAILED or not v.needs_drain or v.drained_at is not None or r.role is Role.DRAINED:
        if r.role is Role.DRAINED and v.drained_at is None:
            v = v.evolve(drained_at=stamp(now))
        delete(s, pod)
        return v, OperationPhase.REMOVING, ""
    did = drain_id(pod.uid)
    state = r.sidecar.state if r.sidecar is not None else None
    if pod.published or v.unpublished_at is None or now - v.unpublished_at.timestamp() < propagation:
        # The propagation window counts from the first step that sees the pod unpublished, which
        # is after the label change reached the API server: counted from when the unpublish was
        # sent, it would lose the patch's own latency, and an unpublish lost to an operator crash
        # must not start it at all. While the pod is seen published nothing is recorded, so the
        # unpublish goes out in the step right after the victims were written, with no write of
        # its own.
        if pod.published and s.desired == 0 and s.obs.spec.autoscaling.scale_to_zero is not None \
                and not activator_in_place(s.obs):
            # Going to zero: the Service points at the activator first, or a request arriving
            # while this replica drains would find no endpoint at all.
            return v, OperationPhase.UNPUBLISHING, ""
        if pod.published:
            v = v.evolve(unpublished_at=None)
            s.actions.append(SetPublished(pod.name, pod.uid, False))
        elif v.unpublished_at is None:
            v = v.evolve(unpublished_at=instant(now))
        if state in (None, DrainState.SERVING):
            s.actions.append(Drain(pod.name, did, DrainPhase.SOFT))
        return v, OperationPhase.UNPUBLISHING, ""
    fenced_at = v.fenced_at or instant(now)
    v = v.evolve(fenced_at=fenced_at)
    if state in (None, DrainState.SERVING, DrainState.SOFT_DRAIN):
        s.actions.append(Drain(pod.name, did, DrainPhase.FENCE))
    if now - fenced_at.timestamp() <= timeout:
        return v, OperationPhase.FENCING if state != DrainState.FENCED else OperationPhase.DRAINING, ""
    inflight = r.sidecar.inflight if r.sidecar is not None else "unknown"
    message = f"{pod.name} not drained after {timeout:g}s ({inflight} in flight)"
    if on_timeout == "Force":
        emit(s, EventReason.DRAIN_FORCED, message, warning=True)
        s.actions.append(DeletePod(pod.name, pod.uid))
        return v.evolve(forced=True, drained_at=stamp(now)), OperationPhase.REMOVING, ""
    return v, OperationPhase.DRAINING, message

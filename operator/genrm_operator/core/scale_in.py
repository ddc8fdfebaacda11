"""Scale-in: victims fixed in status first, then each one unpublished, soft-drained, fenced, drained
and deleted (CloudNativePG's ``cluster_scale.go`` in small). A rollout retires its outdated
replicas through the same victim steps (`advance_victims`).

A victim leaves the pool's Service only while another replica serves in it (`in_service`): when the
others fail or go unready, a healthy victim is kept published, or undrained and published again
(`keep`), until one does; and a scale-in whose other replicas failed or went gives back the victims
the pool needs again (`give_back`). Otherwise one crash of the survivor right after the victims were
chosen leaves the Service empty while a replica that could serve is draining.
"""

from __future__ import annotations

from genrm_contract.sidecar import DrainPhase, DrainState

from ..api.status import ConditionReason, EventReason, Operation, OperationPhase, Victim
from .activation import activator_in_place
from .classify import Replica, Role
from .clock import instant, stamp
from .model import DeletePod, Drain, SetPublished, Undrain
from .names import drain_id
from .scale_out import publish_or_verify
from .step import VICTIM_PHASES, Step, counts, delete, emit, finish, in_service, set_phase
from .victims import choose_victims

RESCUABLE_STATES = (DrainState.SERVING, DrainState.SOFT_DRAIN, DrainState.FENCED)
"""Sidecar states a victim can serve again from (Drained is final)."""


def advance_scale_in(s: Step, op: Operation) -> Operation | None:
    if op.phase is OperationPhase.PENDING:
        op = select_victims(s, op)
        publish_or_verify(s, op)  # the replicas it keeps serve at once (it only writes the victims)
        return op
    op, given = give_back(s, op)
    victims, phases, failure = advance_victims(s, op.victims, hold=s.desired > 0)
    publish_or_verify(s, op)  # the replicas it keeps, a victim given back included, serve at once
    op = op.evolve(victims=victims)
    left = [p for p in phases if p is not None]
    kept = f"; kept {', '.join(given)}: the pool needs it again" if given else ""
    if failure:
        finish(s, op, OperationPhase.FAILED, ConditionReason.DRAIN_TIMEOUT, failure)
        return None
    if not left:
        finish(s, op, OperationPhase.SUCCEEDED, ConditionReason.TARGET_REACHED,
               f"removed {len(victims)} replica(s){kept}")
        return None
    return set_phase(s, op, min(left, key=VICTIM_PHASES.index), f"{len(left)} victim(s) left{held_note(victims)}")


def held_note(victims: list[Victim]) -> str:
    """What the operation's message says of the victims kept in the Service (`keep`)."""
    held = [v.name for v in victims if v.held_at is not None]
    return f"; {', '.join(held)} kept in the Service: no other replica serves" if held else ""


def give_back(s: Step, op: Operation) -> tuple[Operation, list[str]]:
    """Drop the victims the pool needs again, least progressed first: its other replicas failed or
    went since they were chosen, and fewer than ``spec.replicas`` would be left.

    Like a reversal's rescue, a victim that can serve again is better than a new pod: it is warm and
    verified. A victim still published stays; one taken out is undrained, and published again once
    Ready by the scale-in itself (`scale_out.publish_or_verify`). Without this, a victim held in the
    Service (`keep`) while its survivors are replaced would wait for a replacement no operation
    creates."""
    serving, starting, draining = counts(s, op)
    short = s.desired - serving - starting - draining
    if short <= 0:
        return op, []
    back = sorted((v for v in op.victims if rescuable(s, v)), key=lambda v: victim_progress(s, v))[:short]
    for v in back:
        r = s.by_name[v.name]
        undrain(s, r)
        emit(s, EventReason.VICTIM_KEPT_PUBLISHED if r.pod.published else EventReason.VICTIM_RESCUED,
             f"{v.name} stays: fewer than {s.desired} replica(s) would be left without it")
    names = {v.name for v in back}
    return op.evolve(victims=[v for v in op.victims if v.name not in names]), sorted(names)


def rescuable(s: Step, v: Victim) -> bool:
    """Whether victim ``v`` can still serve: not failed, not going, not drained, its engine healthy."""
    r = s.by_name.get(v.name)
    if r is None or r.pod.uid != v.uid or v.drained_at is not None or v.forced \
            or r.role in (Role.FAILED, Role.TERMINATING, Role.DRAINED):
        return False
    if r.pod.published and r.pod.ready:
        return True
    return r.sidecar is not None and r.sidecar.engine_healthy and r.sidecar.state in RESCUABLE_STATES


def victim_progress(s: Step, v: Victim) -> int:
    """How far a victim is on its way out: published 0, unpublished 1, soft-drained 2, fenced 3."""
    r = s.by_name[v.name]
    if r.pod.published or r.sidecar is None:
        return 0 if r.pod.published else 1
    return {DrainState.SOFT_DRAIN: 2, DrainState.FENCED: 3}.get(r.sidecar.state, 1)


def undrain(s: Step, r: Replica) -> None:
    """Undrain a victim's draining sidecar: it admits again (a soft-drained one never stopped, and was
    Ready throughout; a fenced one turns Ready at its next probe)."""
    if r.sidecar is not None and r.sidecar.state in (DrainState.SOFT_DRAIN, DrainState.FENCED):
        s.actions.append(Undrain(r.pod.name, drain_id(r.pod.uid)))


def keep(s: Step, v: Victim, r: Replica) -> Victim:
    """Keep a victim in the Service, or put it back, while no other replica serves (`advance_victims`).

    Its drain starts over once another one does: the propagation window is measured from the new
    unpublish. Its fence keeps its clock, less the time it was held (`release`): a survivor whose
    readiness keeps blipping must not restart the drain for ever, out of reach of
    ``drain.timeoutSeconds``, nor may a long hold use that time up."""
    if v.held_at is None:
        serving = r.pod.published and (r.sidecar is None or r.sidecar.state == DrainState.SERVING)
        emit(s, EventReason.VICTIM_KEPT_PUBLISHED if serving else EventReason.VICTIM_RESCUED,
             f"{v.name} stays in the Service until another replica serves: no other published replica "
             "is a ready endpoint")
    pod = r.pod
    undrain(s, r)
    if not pod.published:
        # Published again in the step that decides it, not once Ready as a new replica is: it passed
        # verification when it first served, and a soft-draining gateway still answers Ready, so the
        # Service lists it with its label. Its publish waits for the record like its undrain: on a
        # spec that changed meanwhile the write's Conflict cancels both, never leaving a draining
        # replica published outside any operation.
        s.actions.append(SetPublished(pod.name, pod.uid, True, rescue=True))
    return v.evolve(held_at=v.held_at or stamp(s.now), unpublished_at=None)


def release(s: Step, v: Victim) -> Victim:
    """A held victim's drain goes on (`keep`): its fence clock moves on by the time it was held."""
    assert v.held_at is not None
    if v.fenced_at is None:
        return v.evolve(held_at=None)
    held = max(0.0, s.now - v.held_at.timestamp())
    return v.evolve(held_at=None, fenced_at=instant(v.fenced_at.timestamp() + held))


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


def advance_victims(s: Step, victims: list[Victim],
                    hold: bool) -> tuple[list[Victim], list[OperationPhase | None], str]:
    """Move every victim along: the victims, each one's phase (None when gone) and the first failure.

    ``hold``: the operation means to leave replicas serving, so a healthy victim leaves the Service
    only while a replica outside the victims serves in it (`in_service`), and is kept or put back
    otherwise (`keep`). Scale to zero (and a rollout that may take every replica away) has no
    survivor to wait for: there the activator's guard decides."""
    drain = s.obs.spec.drain
    names = {v.name for v in victims}
    others = any(in_service(s, r) for r in s.replicas if r.pod.name not in names)
    moved: list[Victim] = []
    phases: list[OperationPhase | None] = []
    failure = ""
    for v in victims:
        if hold and not others and rescuable(s, v) and s.by_name[v.name].pod.ever_published:
            moved.append(keep(s, v, s.by_name[v.name]))
            phases.append(OperationPhase.UNPUBLISHING)
            continue
        if v.held_at is not None:
            v = release(s, v)
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

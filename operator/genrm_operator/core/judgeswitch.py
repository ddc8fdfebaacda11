"""Blue/green judge switch: a new judge revision comes up beside the active one and takes the pool's
Service in one step, so no client gets answers from two judges within one judge phase.

Why not the rolling update: it mixes judges for its whole length (a training step would get rewards
from both). Why not a weighted split or a selector switch alone (KServe, Knative, the Inference
Extension, Argo Rollouts): the first mixes by design, the second leaves kept-alive clients on the old
pods. Here the Service selects one judge revision (`pinned_judge`) whenever a pool runs two, the
switch moves that pin, and the previous revision's gateways are then fenced with the switch as
reason after being told the new revision's replicas as peers, so what still reaches them (a
kept-alive connection) is answered by the new judge and the connection closed.

One operation, ``JudgeSwitch`` (``op.judge_from`` -> ``op.judge_to``), in two halves:

* before promotion: the preview revision (the spec's judge) is brought up like a scale-out, within
  its own replicas (verified against its own reference, never the active one's), to
  ``previewReplicas`` (default ``spec.replicas``); it is published only once the observed Service
  pins the active revision, so the publication reaches the revision's own clients only. Ready,
  it waits for its promotion (`promotion_due`); promoting is a recorded decision (``status.judge``),
  and the Service moves only on a later step, from the written record (`pinned_judge`);
* after promotion: once the previous revision's gateways had time to hold their new peers, they
  are fenced (``judgeSwitched``); after ``scaleDownDelaySeconds`` its replicas retire like
  scale-in victims. Reverting the judge fields within the delay is a new switch back, whose
  preview is warm: it is undrained, not loaded again.

Pods of any other judge revision (a preview abandoned by a second change) retire at once.
While a switch runs the pool does not scale its active revision (new pods would be built from
the spec, which is the new judge); a replica of it that fails is not replaced until the switch ends.
"""

from __future__ import annotations

import dataclasses

from genrm_contract.sidecar import ADMITTING_STATES, DrainPhase, DrainReason, DrainState

from ..api.status import (
    ConditionReason,
    EventReason,
    JudgeRevisionStatus,
    JudgeStatus,
    Operation,
    OperationPhase,
    OperationType,
    Victim,
)
from .classify import Replica, Role
from .clock import stamp
from .model import Drain, LabelJudge, Observed, Undrain
from .names import JUDGE_REVISION_LABEL, PROMOTE_ANNOTATION, drain_id
from .scale_in import advance_victims, held_note
from .scale_out import create, may_create, noted_failures, publish_or_verify, retry_creates
from .step import VICTIM_PHASES, Step, emit, finish, gpu_holders, pending_creates, set_phase, victim_names


def judge_of(s: Step, r: Replica) -> str:
    """A replica's judge revision; a pod made before judge revisions counts as the active one's."""
    return r.pod.judge or s.active_judge


def switch_needed(s: Step) -> bool:
    """Whether the pool must run a judge switch: the spec names another judge than the active one,
    or pods of another judge revision are left (a switch ended by an operator upgrade, say). Not
    while a pod made before judge revisions is unlabelled (`label_unlabelled`): the Service's pin
    would leave it out, and a later step would count it as the new judge's."""
    if any(not r.pod.judge and r.role is not Role.TERMINATING for r in s.replicas):
        return False
    return s.judge != s.active_judge or any(
        judge_of(s, r) != s.active_judge for r in s.replicas if r.role is not Role.TERMINATING)


def label_unlabelled(s: Step) -> None:
    """Before a judge switch, label the pods made before judge revisions with the active one: what
    they answer, since the judge fields could not change while they ran (they were immutable before
    judge switches). Only then does an unlabelled pod matter: without a switch the Service has no pin."""
    if s.judge == s.active_judge:
        return
    for r in s.replicas:
        if not r.pod.judge and r.role is not Role.TERMINATING:
            s.actions.append(LabelJudge(r.pod.name, r.pod.uid, s.active_judge))


def pinned_judge(obs: Observed) -> str | None:
    """The judge revision the pool's Service must select, or None when it may select every published pod.

    From the written status only (the step's own decisions are not in it yet): the Service moves to a
    promoted revision after the promotion is recorded, so a refused status write never leaves it on
    a revision the next step would not have chosen. Pinned while a switch is recorded or a pod of
    another revision exists, so a preview's publication never reaches the pool's clients."""
    judge = obs.status.judge
    if judge is None:
        return None
    op = obs.status.operation
    if (op is not None and op.type is OperationType.JUDGE_SWITCH) or any(
            p.judge and p.judge != judge.active and not p.deleting for p in obs.pods):
        return judge.active
    return None


def told_revisions(obs: Observed) -> tuple[str, str | None] | None:
    """The pool's active and preview judge revisions as its gateways are told them (their revision
    document, `genrm_contract.revisions`), from the written status like the Service's pin; None
    before the pool has a recorded judge."""
    judge, op = obs.status.judge, obs.status.operation
    if judge is None:
        return None
    switching = op is not None and op.type is OperationType.JUDGE_SWITCH and op.promoted_at is None
    preview = op.judge_to if switching and op is not None and op.judge_to != judge.active else None
    return judge.active, preview


def service_selects(obs: Observed, judge: str) -> bool:
    """Whether the observed pool Service selects ``judge`` alone (True in a world without children)."""
    if obs.children is None:
        return True
    service = obs.children.objects.get("Service")
    selector = (service or {}).get("spec", {}).get("selector") or {}
    return bool(selector.get(JUDGE_REVISION_LABEL) == judge)


def of_judge(s: Step, judge: str) -> Step:
    """The step as seen by one revision's replicas alone: its actions, events and ordinals are the
    step's own (`merge_back`), so the scale-out functions work within one revision unchanged."""
    return dataclasses.replace(s, replicas=[r for r in s.replicas if judge_of(s, r) == judge])


def merge_back(s: Step, sub: Step) -> None:
    """Carry what a revision's view decided that is not shared by reference back into the step."""
    s.next_ordinal = sub.next_ordinal


def advance_judge_switch(s: Step, op: Operation) -> Operation | None:
    """Retire unwanted revisions; bring the preview up and promote it, or fence and retire the previous one."""
    wanted = (s.active_judge, op.judge_to, op.judge_from)
    op = retire(s, op, [r for r in s.replicas if judge_of(s, r) not in wanted], EventReason.REPLICAS_RETIRING,
                "a judge revision no longer wanted")
    moved, phases, failure = advance_victims(s, op.victims, hold=False)
    op = op.evolve(victims=[v for v, p in zip(moved, phases, strict=True) if p is not None])
    release_held_fences(s, op)
    if failure:
        finish(s, op, OperationPhase.FAILED, ConditionReason.DRAIN_TIMEOUT, failure)
        return None
    if op.promoted_at is None and op.judge_to != s.active_judge:
        return bring_up_preview(s, op)
    previous = [r for r in s.replicas if judge_of(s, r) != s.active_judge and r.pod.name not in victim_names(op)]
    fence_previous(s, previous, op.promoted_at.timestamp() if op.promoted_at is not None else None)
    delay = float(s.obs.spec.judge_update.blue_green.scale_down_delay_seconds)
    # Retired only once seen fenced: a victim is soft-drained first, which would let it admit
    # requests again if that call overtook the fence.
    over = op.promoted_at is None or s.now >= op.promoted_at.timestamp() + delay
    late = op.promoted_at is None or s.now >= op.promoted_at.timestamp() + delay + FENCE_GRACE_SECONDS
    leaving = [r for r in previous if r.sidecar is None or r.sidecar.state not in ADMITTING_STATES or late]
    if leaving and over:
        op = retire(s, op, leaving, EventReason.JUDGE_RETIRING, f"Judge revision {op.judge_from} retires")
    left = [p for p in phases if p is not None]
    if not op.victims and not [r for r in s.replicas if judge_of(s, r) != s.active_judge
                               and r.role is not Role.TERMINATING]:
        finish(s, op, OperationPhase.SUCCEEDED, ConditionReason.TARGET_REACHED,
               f"every replica is on judge revision {s.active_judge}")
        return None
    if left:
        return set_phase(s, op, min(left, key=VICTIM_PHASES.index),
                         f"judge revision {s.active_judge} serves; {len(op.victims)} replica(s) of "
                         f"{op.judge_from} retiring" + held_note(op.victims))
    remaining = max(0.0, op.promoted_at.timestamp() + delay - s.now) if op.promoted_at else 0.0
    return set_phase(s, op, OperationPhase.PROMOTED,
                     f"judge revision {s.active_judge} serves; {op.judge_from} fenced, retiring in {remaining:.0f}s "
                     "unless the judge fields are reverted")


def retire(s: Step, op: Operation, replicas: list[Replica], reason: EventReason, why: str) -> Operation:
    """Make ``replicas`` victims (outside the ones already), drained first when they ever served, with
    one event naming them (``reason``: ``why``: the pods)."""
    victims = victim_names(op)
    leaving = [r for r in replicas if r.role is not Role.TERMINATING and r.pod.name not in victims]
    if not leaving:
        return op
    emit(s, reason, f"{why}: " + ", ".join(r.pod.name for r in leaving))
    return op.evolve(victims=[*op.victims, *(Victim(name=r.pod.name, uid=r.pod.uid, needs_drain=r.pod.ever_published)
                                             for r in leaving)])


PEERS_LEAD_SECONDS = 0.5
"""How long after its promotion the previous revision is fenced at the soonest. Its gateways are told
the new revision's replicas as peers from the first step after the record (`core.peers.forwards_to`;
a list replaced whole is pushed at once: `shell.peers`); fenced once they hold them, they hand over
what still reaches them instead of refusing it."""
FENCE_GRACE_SECONDS = 30.0
"""After the scale-down delay, how long a previous-revision replica that never took the switch's fence
(a gateway older than judge switches refuses the reason) may stay before it retires all the same."""


def fence_previous(s: Step, previous: list[Replica], promoted_at: float | None) -> None:
    """Fence the previous revision's admitting gateways at once, naming the switch, once their new
    peers had `PEERS_LEAD_SECONDS` to reach them: what still reaches them (a kept-alive connection, a
    kube-proxy behind the Service's move) is then handed to the new judge, and the connection closed
    after it. The fence does not wait for the Service: a fenced gateway hands over, so it answers with
    the new judge wherever the Service sends a request. It is held (never Drained by itself) for a
    rollback within the scale-down delay (`release_held_fences`)."""
    if promoted_at is not None and s.now < promoted_at + PEERS_LEAD_SECONDS:
        return
    for r in previous:
        if r.sidecar is not None and r.sidecar.state in ADMITTING_STATES:
            s.actions.append(Drain(r.pod.name, drain_id(r.pod.uid), DrainPhase.FENCE,
                                   DrainReason.JUDGE_SWITCHED, s.active_judge))


def release_held_fences(s: Step, op: Operation) -> None:
    """A retiring victim fenced for the switch holds its fence (it could have been promoted back);
    a plain fence releases it, so it drains and proves it like any victim."""
    for v in op.victims:
        r = s.by_name.get(v.name)
        if r is not None and r.sidecar is not None and r.sidecar.reason is DrainReason.JUDGE_SWITCHED:
            s.actions.append(Drain(r.pod.name, drain_id(r.pod.uid), DrainPhase.FENCE))


def preview_size(s: Step) -> int:
    """Replicas of the preview revision: ``previewReplicas``, else ``spec.replicas``."""
    size = s.obs.spec.judge_update.blue_green.preview_replicas
    return s.desired if size is None else size


def bring_up_preview(s: Step, op: Operation) -> Operation | None:
    """Create, verify and publish the preview revision within itself; promote it when due."""
    view = of_judge(s, op.judge_to)
    size = preview_size(s)
    victims = victim_names(op)
    own = [r for r in view.replicas if r.role in (Role.SERVING, Role.STARTING, Role.DRAINING)
           and r.pod.name not in victims]
    for r in own:  # a revision promoted away from and wanted back: warm, so undrained, not loaded again
        if r.sidecar is not None and r.sidecar.state in (DrainState.SOFT_DRAIN, DrainState.FENCED):
            s.actions.append(Undrain(r.pod.name, drain_id(r.pod.uid)))
    op = retry_creates(view, op, size)
    missing = size - len(own) - len(pending_creates(view, op))
    # Two revisions at once is the switch's price, and its bound: the active revision's pods (more
    # than spec.replicas when a rollout's surge or a lower count was left over: nothing scales it
    # while the switch runs) and the preview's. Pods of a preview given up, still leaving, hold GPUs
    # the new preview waits for.
    active = sum(1 for r in s.replicas if judge_of(s, r) == s.active_judge and r.role is not Role.FAILED)
    room = max(s.desired, active) + size - gpu_holders(s, op)
    if min(missing, room) > 0 and may_create(view, op):
        op = create(view, op, min(missing, room))
    if service_selects(s.obs, s.active_judge):
        publish_or_verify(view, op)
    merge_back(s, view)
    failure, failed = noted_failures(op)
    ready = [r for r in own if r.role is Role.SERVING and r.pod.ready and r.sidecar is not None
             and r.sidecar.state is DrainState.SERVING and r.sidecar.engine_healthy]
    if failure and not pending_creates(view, op):
        finish(s, op, OperationPhase.PARTIAL, failure, failed)
        return None
    if len(ready) < size or pending_creates(view, op):
        phase = OperationPhase.VERIFYING if any(r.role is Role.STARTING and r.pod.ready for r in own) \
            else OperationPhase.PROVISIONING
        return set_phase(s, op, phase, f"preview {op.judge_to}: {len(ready)}/{size} ready; "
                                       f"{s.active_judge} serves")
    due, waiting = promotion_due(s, op)
    if not due:
        return set_phase(s, op, OperationPhase.AWAITING_PROMOTION,
                         f"preview {op.judge_to}: {len(ready)}/{size} ready; {waiting}")
    emit(s, EventReason.JUDGE_PROMOTED, f"{op.id}: judge revision {op.judge_to} takes the pool's Service from "
                                        f"{s.active_judge}")
    s.active_judge = op.judge_to
    return set_phase(s, op.evolve(promoted_at=stamp(s.now)), OperationPhase.PROMOTED,
                     f"judge revision {op.judge_to} promoted; the Service moves to it")


def promotion_due(s: Step, op: Operation) -> tuple[bool, str]:
    """Whether the ready preview is promoted now, and otherwise what it waits for."""
    spec = s.obs.spec.judge_update.blue_green
    if spec.promotion == "Auto":
        return True, ""
    if spec.promotion == "Manual":
        if s.obs.promote == op.judge_to:
            return True, ""
        return False, (f"waiting for a manual promotion: kubectl annotate genrmpool {s.obs.name} "
                       f"{PROMOTE_ANNOTATION}={op.judge_to} --overwrite")
    busy = idle_gap_busy(s, float(spec.idle_gap_seconds))
    return (not busy), (f"waiting for an idle gap of {spec.idle_gap_seconds}s on {s.active_judge}: {busy}"
                        if busy else "")


def idle_gap_busy(s: Step, gap: float) -> str:
    """Why the active revision is not in an idle gap of ``gap`` seconds ('' when it is): a request in
    flight or held, a demand hint that announces a phase, or a serving replica that has not been idle
    that long (or whose gateway does not say: unknown is not idle)."""
    if not any(judge_of(s, r) == s.active_judge and r.role is Role.SERVING for r in s.replicas):
        return ""  # at zero (or none left): no phase runs on the active judge, and held requests wait for one
    if s.obs.held:
        return f"{s.obs.held} request(s) held by the activator"
    if s.obs.relayed_hints:  # the gateways and activators keep a hint until it expires
        return "a demand hint announces a judge phase"
    for r in s.replicas:
        if judge_of(s, r) != s.active_judge or r.role is not Role.SERVING:
            continue
        view = r.sidecar
        if view is None:
            return f"{r.pod.name}'s gateway does not answer"
        if view.demand:
            return "a demand hint announces a judge phase"
        if view.inflight:
            return f"{view.inflight} request(s) in flight on {r.pod.name}"
        if view.idle_from is None or s.now - view.idle_from < gap:
            return f"{r.pod.name} was busy within {gap:g}s"
    return ""


def judge_status(s: Step, op: Operation | None) -> JudgeStatus:
    """Every judge revision with live pods and its role, the active one first."""
    live = [r for r in s.replicas if r.role is not Role.TERMINATING]
    preview = op.judge_to if op is not None and op.type is OperationType.JUDGE_SWITCH else ""
    names = sorted({judge_of(s, r) for r in live} | {s.active_judge}, key=lambda j: (j != s.active_judge, j))

    def role(judge: str) -> JudgeRevisionStatus:
        mine = [r for r in live if judge_of(s, r) == judge]
        kind = "Active" if judge == s.active_judge else "Preview" if judge == preview else "Retiring"
        return JudgeRevisionStatus(name=judge, role=kind, replicas=len(mine),
                                   serving=sum(1 for r in mine if r.role is Role.SERVING and r.pod.ready))
    return JudgeStatus(active=s.active_judge, revisions=[role(j) for j in names])


def start_fields(s: Step) -> dict[str, object]:
    """A new JudgeSwitch's own record: from the active revision to the spec's."""
    return {"judge_from": s.active_judge, "judge_to": s.judge}


"""Scale-out: rescue draining replicas first, retry unobserved creates, create within the pod-count
bound, verify new replicas against a serving one and publish them (CloudNativePG's
``cluster_scale.go`` in small). A rollout makes its surge replicas with the same functions."""

from __future__ import annotations

from genrm_contract.sidecar import DrainState

from ..api.status import AddedPod, ConditionReason, EventReason, Operation, OperationPhase
from . import placement
from .backoff import back_off
from .classify import Replica, Role
from .model import CreatePod, SetPublished, Undrain, Verify
from .names import drain_id, pod_name
from .step import (
    Step,
    counts,
    emit,
    failure_text,
    finish,
    gpu_holders,
    in_service,
    pending_creates,
    role,
    set_phase,
    victim_names,
)


def awaits_publication(r: Replica) -> bool:
    """A starting replica whose engine is warm and that is ready."""
    return r.pod.ready and verifiable(r)


def verifiable(r: Replica) -> bool:
    """A starting replica whose sidecar reports a warm engine (one that failed verification is
    no longer starting: `classify.failure_reason`).

    Verification starts on the sidecar's own report, not on the pod's Ready condition, which
    only follows it at the next readiness probe: the probes then overlap that wait."""
    sidecar = r.sidecar
    return sidecar is not None and sidecar.state == DrainState.SERVING and sidecar.engine_healthy


def advance_scale_out(s: Step, op: Operation) -> Operation | None:
    serving, starting, _ = counts(s, op)
    shortfall = s.desired - serving - starting
    rescuing = rescue(s, shortfall)
    shortfall -= rescuing
    op = retry_creates(s, op, s.desired)
    room = max(0, s.desired - gpu_holders(s, op))
    if min(shortfall, room) > 0 and may_create(s, op):
        op = create(s, op, min(shortfall, room))
    releasing = max(0, shortfall - room)  # replicas held back while leaving pods hold GPUs
    verifying = publish_or_verify(s, op)

    failure, failed = noted_failures(op)
    waiting = role(s, Role.STARTING)
    pending = pending_creates(s, op)
    victims = victim_names(op)
    reachable = sum(1 for r in s.replicas if r.pod.name not in victims and in_service(s, r))
    if reachable >= op.to:
        finish(s, op, OperationPhase.SUCCEEDED, ConditionReason.TARGET_REACHED, f"{reachable} serving replicas")
        return None
    if failure and not pending:
        # Not while a replacement's create is unobserved: once this operation is gone nothing
        # would count that pod, and a lagging index would make the next step create another.
        finish(s, op, OperationPhase.PARTIAL, failure, failed)
        return None
    if waiting and not rescuing and not pending and all(r.pod.blocked for r in waiting):
        pod = waiting[0].pod
        reason = ConditionReason.UNSCHEDULABLE if pod.unschedulable else ConditionReason.CANNOT_START
        finish(s, op, OperationPhase.PARTIAL, reason, f"{pod.name}: {pod.blocked}")
        return None
    if not waiting and not rescuing and not pending and shortfall > 0 and not releasing:
        finish(s, op, OperationPhase.PARTIAL, ConditionReason.BACK_OFF, "waiting before creating replacement replicas")
        return None
    # Published but not yet a ready endpoint of the Service: still on its way to serving, and past
    # verification.
    phase = OperationPhase.VERIFYING if (verifying or serving > reachable) and not pending \
        else OperationPhase.PROVISIONING
    waiting_for = f"; {releasing} more once leaving pods release their GPUs" if releasing else ""
    unlisted = f"; {serving - reachable} published, not yet ready endpoints of the Service" \
        if serving > reachable else ""
    return set_phase(s, op, phase, f"{reachable}/{op.to} serving{unlisted}{waiting_for}")


def may_create(s: Step, op: Operation) -> bool:
    """Whether the running operation may create pods now.

    Not while the back-off after earlier failed operations runs (`back_off`). A replica of
    this operation that failed is replaced at once when it is the first failure in a row;
    after earlier ones its replacement waits for this operation to end Partial and for the
    longer back-off that counts it, so a replica that keeps failing (answering differently on
    every attempt, say) is retried ever more slowly, not once per model load."""
    held = back_off(s.history)
    return held is None or (held.until <= s.now and not noted_failures(op)[0])


def noted_failures(op: Operation) -> tuple[str, str]:
    """The reason and detail a Partial gives for the operation's own pods noted failed
    (`note_observed_creates`), or ('', '') when none failed."""
    failed = [a for a in op.added_pods if a.failure]
    return (failed[0].failure if failed else ""), ", ".join(
        f"{a.name}: {failure_text(a.failure, a.failure_message)}" for a in failed)


def retry_creates(s: Step, op: Operation, limit: int) -> Operation:
    """Repeat the creates the pod index has not shown yet (lost or lagging), within ``limit`` pods.

    Creates carried over from a superseded rollout may be more than a scale-out's bound
    allows; those beyond it are dropped (never retried, their names never reused)."""
    pending = pending_creates(s, op)
    keep = pending[:max(0, limit - (gpu_holders(s, op) - len(pending)))]
    for added in keep:
        s.actions.append(CreatePod(added.name, added.ordinal, pinned(s)))
    if len(keep) < len(pending):
        dropped = {a.name for a in pending[len(keep):]}
        op = op.evolve(added_pods=[a for a in op.added_pods if a.name not in dropped])
    return op


def rescue(s: Step, shortfall: int) -> int:
    """Undrain draining replicas first: they are warm and verified, unlike a new pod."""
    candidates = [r for r in role(s, Role.DRAINING) if r.sidecar is not None]
    candidates.sort(key=lambda r: (r.sidecar.state != DrainState.SOFT_DRAIN if r.sidecar else True,
                                   -r.pod.created_at))
    chosen = candidates[: max(shortfall, 0)]
    for r in chosen:
        s.actions.append(Undrain(r.pod.name, drain_id(r.pod.uid)))
        emit(s, EventReason.REPLICA_RESCUED, f"Undraining {r.pod.name} instead of creating a pod")
    return len(chosen)


def create(s: Step, op: Operation, count: int) -> Operation:
    added = list(op.added_pods)
    for _ in range(count):
        name = pod_name(s.obs.name, s.next_ordinal)
        added.append(AddedPod(name=name, ordinal=s.next_ordinal))
        s.actions.append(CreatePod(name, s.next_ordinal, pinned(s)))
        s.next_ordinal += 1
    return op.evolve(added_pods=added)


def pinned(s: Step) -> str:
    """The GPU product a pod created now is required onto ('' for none)."""
    return s.placement.gpu_product if s.placement is not None else ""


def publish_or_verify(s: Step, op: Operation, revision: str | None = None) -> bool:
    """Publish warm, verified replicas (of ``revision`` only, when given); ask for verification of the others.

    Returns True when some replica is past provisioning: being verified, verified and waiting
    for its Ready condition (the kubelet's next readiness probe), or being published. Counting
    the waiting one keeps the operation in Verifying; otherwise it fell back to Provisioning
    between verification and readiness and returned to Verifying at publication, two status
    writes more, the second one holding the publish back until it landed.
    """
    reference = placement.reference(s.replicas)
    verifying = False
    victims = victim_names(op)
    for r in role(s, Role.STARTING):
        if not verifiable(r) or r.pod.name in victims | s.misplaced or revision not in (None, r.pod.revision):
            continue
        pod = r.pod
        verifying = True
        if pod.verification != "passed" and s.obs.spec.verification.enabled:
            s.actions.append(Verify(pod.name, pod.uid, reference.pod.name if reference else None,
                                    placement.verification_context(r, reference, s.products)))
        elif pod.ready:
            s.actions.append(SetPublished(pod.name, pod.uid, True))
            emit(s, EventReason.REPLICA_PUBLISHED, f"{pod.name} is serving")
    return verifying

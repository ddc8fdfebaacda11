"""Rollout: replace replicas made from an older pod template, a verified surge replica first, then
an outdated one retired like a scale-in victim (CloudNativePG's ``cluster_upgrade.go`` in small)."""

from __future__ import annotations

from ..api.status import ConditionReason, EventReason, Operation, OperationPhase, Victim
from .classify import Replica, Role
from .scale_in import advance_victims, held_note
from .scale_out import create, may_create, noted_failures, publish_or_verify, retry_creates
from .step import (
    VICTIM_PHASES,
    Step,
    counts,
    emit,
    finish,
    gpu_holders,
    in_service,
    pending_creates,
    role,
    set_phase,
    victim_names,
)
from .victims import choose_victims


def outdated(s: Step, op: Operation | None) -> list[Replica]:
    """Serving or starting replicas, outside ``op``'s victims, made from another pod template."""
    victims = victim_names(op)
    return [r for r in s.replicas if r.role in (Role.SERVING, Role.STARTING)
            and r.pod.name not in victims and r.pod.revision != s.revision]


def advance_rollout(s: Step, op: Operation) -> Operation | None:
    """Replace outdated replicas: surge a verified replacement first, then retire an outdated one.

    Level-based like a scale: every step recounts. New-template replicas are created while
    fewer than ``spec.replicas`` exist, within ``replicas + maxSurge`` pods; outdated serving
    replicas are retired (drained exactly like scale-in victims) only while the serving count
    stays at ``spec.replicas``, or at ``replicas - maxUnavailable`` when no surge replica can
    be added (no room, or every one waiting is unschedulable). Outdated replicas that do not
    serve (and draining leftovers of a superseded scale-in) are retired at once. ``spec.paused``
    stops new replacements; the ones under way finish. Surge replicas whose containers cannot be
    created end it Partial (``ReplicaCannotStart``) with every outdated replica still serving.
    """
    strategy, paused = s.obs.spec.update_strategy.rolling_update, s.obs.spec.paused
    if op.revision != s.revision:
        emit(s, EventReason.ROLLOUT_RETARGETED, f"{op.id} continues to revision {s.revision}")
        op = op.evolve(revision=s.revision)
    # Unless the user lets the whole pool be unavailable, an outdated replica leaves the Service only
    # while another one serves (`advance_victims`).
    moved, phases, failure = advance_victims(s, op.victims, hold=strategy.max_unavailable < s.desired)
    kept = [v for v, p in zip(moved, phases, strict=True) if p is not None]
    victim_phases = [p for p in phases if p is not None]
    op = op.evolve(victims=kept, replaced=op.replaced + len(moved) - len(kept))
    if failure:
        finish(s, op, OperationPhase.FAILED, ConditionReason.DRAIN_TIMEOUT, failure)
        return None
    op = retry_creates(s, op, s.desired + strategy.max_surge)
    serving, starting, _ = counts(s, op)
    current = [r for r in s.replicas if r.role in (Role.SERVING, Role.STARTING) and r.pod.revision == s.revision]
    waiting = [r for r in current if r.role is Role.STARTING]
    missing = s.desired - len(current) - len(pending_creates(s, op))
    if paused:
        missing = min(missing, s.desired - serving - starting)  # only lost capacity is restored
    room = max(0, s.desired + strategy.max_surge - gpu_holders(s, op))
    if min(missing, room) > 0 and may_create(s, op):
        op = create(s, op, min(missing, room))
    verifying = publish_or_verify(s, op, s.revision)
    # A surge replica on its way (scheduled, or its create not yet observed) fills the room: not blocked.
    # Only a lack of room is worked around by draining outdated replicas first: a surge replica that
    # cannot start for its configuration would not start in the room they leave either.
    on_its_way = any(not r.pod.unschedulable for r in waiting) or bool(pending_creates(s, op))
    surge_blocked = (missing > 0 and room == 0 and not on_its_way) or \
        (bool(waiting) and all(r.pod.unschedulable for r in waiting))
    old = outdated(s, op)
    if not paused:
        floor = s.desired - (strategy.max_unavailable if surge_blocked else 0)
        victims = victim_names(op)
        # Unpublished leftovers (an outdated starting replica, a draining one from a superseded
        # scale-in) serve no one and hold the GPUs a surge replica needs.
        retire = [r for r in old if r.role is Role.STARTING]
        retire += [r for r in role(s, Role.DRAINING) if r.pod.name not in victims]
        retire += choose_victims([r for r in old if r.role is Role.SERVING], serving - floor, s.revision)
        if retire:
            emit(s, EventReason.REPLICAS_RETIRING, ", ".join(r.pod.name for r in retire))
            op = op.evolve(victims=[*op.victims, *(Victim(name=r.pod.name, uid=r.pod.uid,
                                                           needs_drain=r.pod.ever_published) for r in retire)])
            old = [r for r in old if r not in retire]
            victim_phases += [OperationPhase.UNPUBLISHING] * len(retire)
    return finish_or_phase_rollout(s, op, old, waiting, verifying, surge_blocked, victim_phases)


def finish_or_phase_rollout(s: Step, op: Operation, old: list[Replica], waiting: list[Replica], verifying: bool,
                            surge_blocked: bool, victim_phases: list[OperationPhase]) -> Operation | None:
    """Succeeded once no outdated replica is left; Partial on a failed replacement; else the phase."""
    victims = victim_names(op)
    serving = sum(1 for r in s.replicas if r.pod.name not in victims and in_service(s, r))
    failure, failed = noted_failures(op)
    pending = pending_creates(s, op)
    progress = f"{op.replaced} replaced, {len(old) + len(op.victims)} outdated left, {serving}/{op.to} serving" \
        + held_note(op.victims)
    if not old and not op.victims and serving >= op.to and not pending:
        finish(s, op, OperationPhase.SUCCEEDED, ConditionReason.TARGET_REACHED,
               f"{op.replaced} replica(s) replaced; every replica is on revision {s.revision}")
        return None
    if failure and not pending:
        finish(s, op, OperationPhase.PARTIAL, failure, failed)
        return None
    stuck = [r.pod for r in waiting if r.pod.cannot_start and not r.pod.unschedulable]
    if stuck and not pending and all(r.pod.blocked for r in waiting):
        # Also beside an Unschedulable one: draining outdated replicas could place that one, never this.
        finish(s, op, OperationPhase.PARTIAL, ConditionReason.CANNOT_START, f"{stuck[0].name}: {stuck[0].cannot_start}")
        return None
    if victim_phases:
        phase = min(victim_phases, key=VICTIM_PHASES.index)
    elif verifying:
        phase = OperationPhase.VERIFYING
    elif s.obs.spec.paused and not waiting and not pending:
        phase = OperationPhase.PAUSED
    else:
        phase = OperationPhase.PROVISIONING
    if surge_blocked and not op.victims and old and not s.obs.spec.paused:
        why = next((f"{r.pod.name}: {r.pod.unschedulable}" for r in waiting if r.pod.unschedulable),
                   "no room within maxSurge")
        s.blocked = (f"no surge replica can start ({why}) and "
                     f"maxUnavailable={s.obs.spec.update_strategy.rolling_update.max_unavailable} "
                     "allows no outdated replica to drain first")
        emit(s, EventReason.ROLLOUT_BLOCKED, s.blocked, warning=True)
    return set_phase(s, op, phase, progress)

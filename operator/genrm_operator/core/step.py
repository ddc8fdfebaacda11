"""The small state of one reconcile step and its bookkeeping (`core.reconcile` runs the step).

`Step` holds what a step decides from (the pods classified once, the template's revision, the GPU
pin) and what it has decided so far (actions, events, history, ordinals). The operation is not in
it: each function that moves the operation takes it and returns the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..api.pool import GenRMPoolStatus
from ..api.status import (
    HISTORY_LIMIT,
    AddedPod,
    ConditionReason,
    EventReason,
    HistoryEntry,
    Operation,
    OperationPhase,
    OperationType,
    Outcome,
    Placement,
)
from . import placement
from .children import template_revision
from .classify import Replica, Role, classify
from .clock import stamp
from .judge import judge_revision
from .model import Action, DeletePod, Event, Observed, PodView

NEVER_SERVED_GRACE_SECONDS = 2
VICTIM_PHASES = [OperationPhase.UNPUBLISHING, OperationPhase.FENCING, OperationPhase.DRAINING, OperationPhase.REMOVING]
"""A victim's phases in order: an operation with several victims is in the least advanced one."""
WARNING_OUTCOMES = (OperationPhase.PARTIAL, OperationPhase.FAILED)
"""Ends the user must see: a Warning event, and the reason stays in Progressing and Degraded."""


def ordinal_of(pool: str, name: str) -> int | None:
    """The ordinal encoded in a replica pod name, if it is one of ours."""
    prefix = f"{pool}-"
    tail = name[len(prefix):] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def failure_detail(r: Replica) -> str:
    """What a failed replica showed beyond its reason: a mismatch's verification message (both
    replicas with their nodes and GPU products, and the first answers that differ)."""
    return r.pod.verification_message if r.failure == ConditionReason.REPLICA_INCONSISTENT else ""


def failure_text(reason: str, detail: str) -> str:
    """``ReplicaInconsistent: judge-1 on node ...``, or the reason alone when there is no detail."""
    return f"{reason}: {detail}" if detail else reason


@dataclass
class Step:
    """The small state of one pure reconcile step: what it decides from, and what it has decided so
    far. The operation is not here: every function that moves it takes it and returns the next one.
    """

    obs: Observed
    replicas: list[Replica]
    """The pool's pods with their roles (`classify`), in the order observed."""
    revision: str
    """The current pod template's revision: pods with another one are outdated."""
    judge: str
    """The spec's judge revision (`judge.judge_revision`): what new replicas answer."""
    active_judge: str
    """The judge revision the pool's Service serves (``status.judge``; the spec's for a pool without
    one); a promotion in this step moves it (`judgeswitch`)."""
    next_ordinal: int
    placement: Placement | None
    """The GPU product new replicas are required onto, if any (`placement.choose`)."""
    misplaced: set[str]
    """Never-served replicas on another GPU product than the pin: replaced, never verified."""
    op_count: int
    history: list[HistoryEntry]
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    blocked: str = ""
    """Why a rollout cannot go on (condition RolloutBlocked), or ''."""
    carried: list[AddedPod] = field(default_factory=list)
    """Unobserved creates of a scale-out that finished this step: still counted, retried if resumed."""
    by_name: dict[str, Replica] = field(init=False)

    @property
    def now(self) -> float:
        return self.obs.now

    @property
    def desired(self) -> int:
        return self.obs.spec.replicas

    @property
    def status(self) -> GenRMPoolStatus:
        """The status the step started from."""
        return self.obs.status

    @property
    def products(self) -> Mapping[str, str]:
        return self.obs.gpu_products

    def __post_init__(self) -> None:
        self.by_name = {r.pod.name: r for r in self.replicas}


def begin(obs: Observed) -> Step:
    """The state a step starts from: the pods classified once, the template's revision, the pin."""
    spec, status = obs.spec, obs.status
    replicas = classify(obs.pods, obs.sidecars, obs.now, float(spec.engine.startup_timeout_seconds))
    ordinals = [o for r in replicas if (o := ordinal_of(obs.name, r.pod.name)) is not None]
    pin = placement.choose(spec, replicas, obs.gpu_products)
    judge = judge_revision(spec)
    return Step(
        obs=obs, replicas=replicas, revision=template_revision(obs.name, spec), judge=judge,
        active_judge=status.judge.active if status.judge is not None else judge,
        next_ordinal=max([status.next_ordinal, *(o + 1 for o in ordinals)]), placement=pin,
        misplaced={r.pod.name for r in replicas if pin is not None and placement.misplaced(r, pin, obs.gpu_products)},
        op_count=status.operation_count, history=list(status.history),
    )


def emit(s: Step, reason: EventReason, message: str, warning: bool = False) -> None:
    s.events.append(Event("Warning" if warning else "Normal", reason, message))


def role(s: Step, role_: Role) -> list[Replica]:
    return [r for r in s.replicas if r.role is role_]


def victim_names(op: Operation | None) -> set[str]:
    """The replicas a scale-in or rollout ``op`` is taking away."""
    return {v.name for v in op.victims} if op is not None and op.type is not OperationType.SCALE_OUT else set()


def pending_creates(s: Step, op: Operation | None) -> list[AddedPod]:
    """Pods ``op`` created that the index has not shown yet (create may be lost); with no operation,
    those a scale-out that finished this step left (`Step.carried`)."""
    if op is None:
        return [a for a in s.carried if a.name not in s.by_name]
    if op.type is OperationType.SCALE_IN:
        return []
    return [a for a in op.added_pods if not a.observed and a.name not in s.by_name]


def counts(s: Step, op: Operation | None) -> tuple[int, int, int]:
    """Serving, starting (incl. pending creates) and draining replicas outside ``op``'s victims."""
    victims = victim_names(op)

    def n(role_: Role) -> int:
        return sum(1 for r in role(s, role_) if r.pod.name not in victims)
    return n(Role.SERVING), n(Role.STARTING) + len(pending_creates(s, op)), n(Role.DRAINING)


def in_service(s: Step, r: Replica) -> bool:
    """Whether ``r`` serves as its clients see it: published, Ready, and a ready endpoint of the pool's
    Service (when the shell watches its EndpointSlices: `Observed.endpoints`). kube-proxy and every
    client follow the EndpointSlices, so a replica counts as serving (the status, an operation's
    outcome, the victim a scale-in keeps) only once they list it. A sidecar that reports its engine
    down says first what the pod's readiness will say next: a scale-in puts a victim back on that
    report, not a status update and an EndpointSlice change later."""
    endpoints = s.obs.endpoints
    return r.role is Role.SERVING and r.pod.ready and (endpoints is None or r.pod.name in endpoints) \
        and (r.sidecar is None or r.sidecar.engine_healthy)


def gpu_holders(s: Step, op: Operation | None) -> int:
    """Pods counted by the pod-count bound (`core.reconcile`'s docstring), unobserved creates included."""
    return len(s.replicas) - len(role(s, Role.FAILED)) + len(pending_creates(s, op))


def delete(s: Step, pod: PodView) -> None:
    """Delete a replica: one that never served at once, any other with its drain period."""
    if pod.published or pod.ever_published:
        s.actions.append(DeletePod(pod.name, pod.uid))
    else:
        s.actions.append(DeletePod(pod.name, pod.uid, NEVER_SERVED_GRACE_SECONDS, pod.resource_version))


def set_phase(s: Step, op: Operation, phase: OperationPhase, message: str = "") -> Operation:
    """``op`` in ``phase`` (validated against its type).

    A phase change posts no Event: the phase is in ``status.operation``, and the Events are
    kept to what a user acts on (an operation started or ended, a replica published, victims
    chosen, warnings), about one per action as Kubernetes' own controllers post. An Event per
    phase was a large share of the operator's API writes in a scale storm
    (figures: docs/performance.md#measurements-behind-the-code).
    """
    if op.phase == phase and op.message == message:
        return op
    if op.phase != phase:
        return op.evolve(phase=phase, message=message, last_transition_time=stamp(s.now))
    return op.evolve(message=message)


def finish(s: Step, op: Operation, outcome: Outcome, reason: str, message: str) -> None:
    """Move the operation to history: the caller's next operation is none."""
    forced = sum(1 for v in op.victims if v.forced)
    if op.type is not OperationType.SCALE_IN:
        s.carried = [a for a in op.added_pods if not a.observed and a.name not in s.by_name]
    s.history.append(HistoryEntry(
        id=op.id, type=op.type, from_=op.from_, to=op.to, outcome=outcome, reason=reason, message=message,
        started_at=op.started_at, finished_at=stamp(s.now),
        duration_seconds=round(max(0.0, s.now - op.started_at.timestamp()), 3), forced_drains=forced,
    ))
    s.history = s.history[-HISTORY_LIMIT:]
    warning = outcome in WARNING_OUTCOMES
    emit(s, EventReason.operation(op.type, outcome),
         f"{op.id} {op.type} {op.from_}->{op.to}: {outcome} ({reason}). {message}".strip(), warning)

"""One level-based reconcile step: observed state and time in, status and actions out.

The single writer (one kopf daemon per pool) calls :func:`reconcile` whenever
something changed or a resync is due, writes the returned status first and
only then carries out the actions that take replicas away or back or create
them (`model.writes_first`, `model.needs_record`; publishes and verification
probes go beside the write). Every action is idempotent, so running a step
twice, crashing between the status write and the actions, or a publish whose
status write was refused, is safe.

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

from dataclasses import dataclass, field

from genrm_contract.sidecar import DrainState

from ..api.base import format_time
from ..api.pool import GenRMPoolStatus
from ..api.status import (
    HISTORY_LIMIT,
    AddedPod,
    Condition,
    ConditionStatus,
    ConditionType,
    HistoryEntry,
    Operation,
    OperationType,
    Outcome,
    Phase,
    Reason,
    Victim,
)
from . import placement
from .autoscale import Scaling, autoscale
from .children import template_revision
from .childrenplan import CHILD_FAILED
from .classify import Replica, Role, classify
from .clock import instant, stamp
from .conditions import set_condition
from .model import (
    Action,
    CreatePod,
    DeletePod,
    Drain,
    Event,
    Observed,
    Plan,
    PodView,
    SetPublished,
    Undrain,
    Verify,
)
from .names import drain_id, pod_name, selector
from .victims import choose_victims

BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
NEVER_SERVED_GRACE_SECONDS = 2
PROGRESSING_REASONS = {OperationType.SCALE_OUT: Reason.SCALING_OUT, OperationType.SCALE_IN: Reason.SCALING_IN,
                       OperationType.ROLLOUT: Reason.ROLLING_OUT}
VICTIM_PHASES = [Phase.UNPUBLISHING, Phase.FENCING, Phase.DRAINING, Phase.REMOVING]
"""A victim's phases in order: an operation with several victims is in the least advanced one."""
WARNING_OUTCOMES = (Phase.PARTIAL, Phase.FAILED)
"""Ends the user must see: a Warning event, and the reason stays in Progressing and Degraded."""


def reconcile(obs: Observed) -> Plan:
    """Decide the next status and actions for one pool."""
    return _Step(obs).run()


def ordinal_of(pool: str, name: str) -> int | None:
    """The ordinal encoded in a replica pod name, if it is one of ours."""
    prefix = f"{pool}-"
    tail = name[len(prefix):] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def failure_detail(r: Replica) -> str:
    """What a failed replica showed beyond its reason: a mismatch's verification message (both
    replicas with their nodes and GPU products, and the first answers that differ)."""
    return r.pod.verification_message if r.failure == Reason.REPLICA_INCONSISTENT else ""


def failure_text(reason: str, detail: str) -> str:
    """``ReplicaInconsistent: judge-1 on node ...``, or the reason alone when there is no detail."""
    return f"{reason}: {detail}" if detail else reason


@dataclass(frozen=True)
class BackOff:
    """Creates held back after consecutive failed operations (`back_off`)."""

    failures: int
    """Operations in a row that ended for a reason the user must see."""
    last: HistoryEntry
    """The newest of them: creates wait from its end."""
    delay: float
    """Seconds from its end until creates resume."""

    @property
    def until(self) -> float:
        """When creates resume (seconds since the epoch)."""
        return self.last.finished_at.timestamp() + self.delay

    @property
    def reason(self) -> Reason:
        """``VerificationBackOff`` when the last failure was a replica answering differently, else ``BackOff``."""
        return Reason.VERIFICATION_BACK_OFF if self.last.reason == Reason.REPLICA_INCONSISTENT else Reason.BACK_OFF

    def resumes(self) -> str:
        """When the next replica is created, and why not before."""
        return (f"next replica create at {format_time(stamp(self.until))} ({self.delay:g}s back-off "
                f"after {self.failures} failed operation(s) in a row)")

    def message(self) -> str:
        """`resumes` and the last failure: what a user waiting on the pool needs."""
        return f"{self.resumes()}; last: {self.last.id} {self.last.outcome} ({self.last.reason}): {self.last.message}"


def back_off(history: list[HistoryEntry]) -> BackOff | None:
    """The back-off of new pods after consecutive failed operations, or None when none failed.

    Exponential like CrashLoopBackOff, so a replica that can never start, or that keeps answering
    differently from the serving ones, does not turn into a create/delete loop burning GPU
    scheduling and model loads. It counts the operations that ended for a reason the user must
    see (`WARNING_OUTCOMES`: a replica, verification, the scheduler or a drain failed them), and
    waits from the last of them. A success resets the count. A superseded operation is skipped,
    and so is one that ended Partial only because this back-off held its creates (``BackOff``):
    it saw nothing fail, and counting it would let the back-off feed on itself.
    """
    counted: list[HistoryEntry] = []
    for entry in reversed(history):
        if entry.outcome is Phase.SUCCEEDED:
            break
        if entry.outcome in WARNING_OUTCOMES and entry.reason != Reason.BACK_OFF:
            counted.append(entry)
    if not counted:
        return None
    delay = min(BACKOFF_BASE_SECONDS * 2 ** (len(counted) - 1), BACKOFF_MAX_SECONDS)
    return BackOff(failures=len(counted), last=counted[0], delay=float(delay))


def create_backoff(history: list[HistoryEntry], now: float) -> float:
    """Seconds until new pods may be created (`back_off`); 0 when they may be now."""
    held = back_off(history)
    return max(0.0, held.until - now) if held is not None else 0.0


@dataclass
class _Step:
    """Mutable scratchpad of one pure reconcile step."""

    obs: Observed
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = self.obs.spec
        self.now = self.obs.now
        self.desired = spec.replicas
        self.status = self.obs.status
        self.replicas = classify(
            self.obs.pods, self.obs.sidecars, self.now, float(spec.engine.startup_timeout_seconds)
        )
        self.by_name = {r.pod.name: r for r in self.replicas}
        self.revision = template_revision(self.obs.name, spec)
        """The current pod template's revision: pods with another one are outdated."""
        ordinals = [o for r in self.replicas if (o := ordinal_of(self.obs.name, r.pod.name)) is not None]
        self.next_ordinal = max([self.status.next_ordinal, *(o + 1 for o in ordinals)])
        self.op = self.status.operation
        self.op_count = self.status.operation_count
        self.history = list(self.status.history)
        self.blocked = ""
        """Why a rollout cannot go on (condition RolloutBlocked), or ''."""
        self.carried: list[AddedPod] = []
        """Unobserved creates of a scale-out that finished this step: still counted, retried if resumed."""
        self.products = self.obs.gpu_products
        self.placement = placement.choose(spec, self.replicas, self.products)
        """The GPU product new replicas are required onto, if any (`placement.choose`)."""
        pin = self.placement
        self.misplaced = {r.pod.name for r in self.replicas
                          if pin is not None and placement.misplaced(r, pin, self.products)}
        """Never-served replicas on another GPU product than the pin: replaced, never verified."""

    # ----- bookkeeping -------------------------------------------------------------------------

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def role(self, role: Role) -> list[Replica]:
        return [r for r in self.replicas if r.role is role]

    def victim_names(self) -> set[str]:
        op = self.op
        return {v.name for v in op.victims} if op is not None and op.type is not OperationType.SCALE_OUT else set()

    def pending_creates(self) -> list[AddedPod]:
        """Pods this operation created that the index has not shown yet (create may be lost)."""
        if self.op is None:
            return [a for a in self.carried if a.name not in self.by_name]
        if self.op.type is OperationType.SCALE_IN:
            return []
        return [a for a in self.op.added_pods if not a.observed and a.name not in self.by_name]

    def counts(self) -> tuple[int, int, int]:
        """Serving, starting (incl. pending creates) and draining replicas outside the current scale-in."""
        victims = self.victim_names()
        def n(role: Role) -> int:
            return sum(1 for r in self.role(role) if r.pod.name not in victims)
        return n(Role.SERVING), n(Role.STARTING) + len(self.pending_creates()), n(Role.DRAINING)

    def gpu_holders(self) -> int:
        """Pods counted by the pod-count bound (module docstring), unobserved creates included."""
        return len(self.replicas) - len(self.role(Role.FAILED)) + len(self.pending_creates())

    def delete(self, pod: PodView) -> None:
        """Delete a replica: one that never served at once, any other with its drain period."""
        if pod.published or pod.ever_published:
            self.act(DeletePod(pod.name, pod.uid))
        else:
            self.act(DeletePod(pod.name, pod.uid, NEVER_SERVED_GRACE_SECONDS, pod.resource_version))

    def set_phase(self, op: Operation, phase: Phase, message: str = "") -> Operation:
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
            return op.evolve(phase=phase, message=message, last_transition_time=stamp(self.now))
        return op.evolve(message=message)

    def finish(self, op: Operation, outcome: Outcome, reason: str, message: str) -> None:
        """Move the operation to history and clear it."""
        forced = sum(1 for v in op.victims if v.forced)
        if op.type is not OperationType.SCALE_IN:
            self.carried = [a for a in op.added_pods if not a.observed and a.name not in self.by_name]
        self.history.append(HistoryEntry(
            id=op.id, type=op.type, from_=op.from_, to=op.to, outcome=outcome, reason=reason, message=message,
            started_at=op.started_at, finished_at=stamp(self.now),
            duration_seconds=round(max(0.0, self.now - op.started_at.timestamp()), 3), forced_drains=forced,
        ))
        self.history = self.history[-HISTORY_LIMIT:]
        warning = outcome in WARNING_OUTCOMES
        self.emit(f"{op.type}{outcome}", f"{op.id} {op.type} {op.from_}->{op.to}: {outcome} ({reason}). {message}"
                  .strip(), warning)
        self.op = None

    # ----- the step ----------------------------------------------------------------------------

    def run(self) -> Plan:
        self.note_observed_creates()
        # Supersede first: the victims of a superseded scale-in are ordinary replicas again, so a
        # failed or drained one is cleaned up in this step rather than outliving its replacement.
        self.supersede_if_target_changed()
        self.clean_up_outside_operations()
        if self.op is None:
            self.maybe_start_operation()
        if self.op is not None and self.op.type is OperationType.SCALE_OUT:
            self.advance_scale_out(self.op)
        elif self.op is not None and self.op.type is OperationType.SCALE_IN:
            self.advance_scale_in(self.op)
        elif self.op is not None:
            self.advance_rollout(self.op)
        scaling = autoscale(self.obs, self.replicas)
        return Plan(status=self.next_status(scaling), actions=tuple(self.actions),
                    events=(*self.events, *scaling.events), decision=scaling.decision)

    def note_observed_creates(self) -> None:
        """Mark the operation's creates the index shows, and note those that failed.

        A failure is noted while the pod shows it, before it is deleted: from its deletion on, a
        pod's phase is the kubelet's answer to the deletion (`classify.failure_reason`). The note
        is a decision, written before the delete that retires the failed pod, so it outlives the
        pod and an operator restart, and the operation ends on it (`noted_failures`). A pod the
        operation chose to retire (one of its victims, such as a surge replica a retarget made
        outdated) is never noted: retiring it is no failure of the operation."""
        if self.op is None or self.op.type is OperationType.SCALE_IN:
            return
        victims = self.victim_names()

        def noted(added: AddedPod) -> AddedPod:
            r = self.by_name.get(added.name)
            if r is None:
                return added
            if added.failure or added.name in victims or not r.failure:
                return added.evolve(observed=True)
            return added.evolve(observed=True, failure=r.failure, failure_message=failure_detail(r))
        self.op = self.op.evolve(added_pods=[noted(a) for a in self.op.added_pods])

    def clean_up_outside_operations(self) -> None:
        """Replace failed and misplaced replicas, delete drained leftovers, unpublish pods deleted by others."""
        victims = self.victim_names()
        for r in self.replicas:
            pod = r.pod
            if r.role is Role.TERMINATING and pod.published:
                self.act(SetPublished(pod.name, pod.uid, False))
            if pod.name in victims:
                continue
            if r.role is Role.FAILED:
                self.retire_failed(r)
            elif r.role is Role.DRAINED:
                self.delete(pod)
            elif pod.name in self.misplaced and self.placement is not None:
                # Never served, so it goes at once; the operation's shortfall makes its replacement,
                # pinned. Retiring it is the operator's choice, no failure: it backs nothing off.
                self.emit(Reason.REPLICA_MISPLACED, f"Replacing {placement.describe(r, self.products)}: new replicas "
                          f"go to GPU {self.placement.gpu_product}, the product of {self.placement.replica}'s node")
                self.delete(pod)

    def retire_failed(self, r: Replica) -> None:
        """Replace a failed replica without cutting off requests it still holds.

        A crashed engine may have restarted and admitted new work before we
        noticed, so a once-published replica whose sidecar still answers is
        unpublished and fenced first and deleted once nothing is in flight. A
        replica that never served, or whose sidecar is unreachable, cannot be
        serving anyone and is deleted directly.
        """
        pod, sidecar = r.pod, r.sidecar
        self.emit("ReplicaFailed", f"Replacing {pod.name}: {failure_text(r.failure, failure_detail(r))}", warning=True)
        if pod.published:
            self.act(SetPublished(pod.name, pod.uid, False))
        if sidecar is None or not pod.ever_published or (
                sidecar.inflight == 0 and sidecar.state in (DrainState.FENCED, DrainState.DRAINED)):
            self.delete(pod)
        elif sidecar.state in (DrainState.SERVING, DrainState.SOFT_DRAIN):
            self.act(Drain(pod.name, drain_id(pod.uid), "fence"))

    def supersede_if_target_changed(self) -> None:
        op = self.op
        if op is None:
            return
        if op.to != self.desired:
            self.finish(op, Phase.SUPERSEDED, Reason.TARGET_CHANGED, f"spec.replicas changed to {self.desired}")
        elif op.type is OperationType.ROLLOUT and self.obs.spec.update_strategy.type == "OnDelete":
            self.finish(op, Phase.SUPERSEDED, Reason.STRATEGY_CHANGED, "spec.updateStrategy.type is OnDelete")

    def maybe_start_operation(self) -> None:
        serving, starting, draining = self.counts()
        backoff = create_backoff(self.history, self.now)
        publishable = any(self.awaits_publication(r) for r in self.role(Role.STARTING))
        shortfall = self.desired - serving - starting
        if shortfall > 0 and (draining > 0 or backoff == 0.0 or publishable):
            self.start(OperationType.SCALE_OUT, serving)
        elif serving + starting + draining > self.desired:
            self.start(OperationType.SCALE_IN, serving)
        elif serving < self.desired and publishable:
            self.start(OperationType.SCALE_OUT, serving)
        elif self.outdated() and self.obs.spec.update_strategy.type == "RollingUpdate" and backoff == 0.0:
            self.start(OperationType.ROLLOUT, serving)

    def start(self, type_: OperationType, serving: int) -> None:
        self.op_count += 1
        now = stamp(self.now)
        added = self.carried if type_ is not OperationType.SCALE_IN else []
        if type_ is OperationType.SCALE_OUT:
            added = [*added, *self.adopted({a.name for a in added})]
        self.op = Operation(
            id=f"op-{self.op_count}", type=type_, from_=serving, to=self.desired, phase=Phase.PENDING,
            started_at=now, last_transition_time=now, added_pods=added,
            revision=self.revision if type_ is OperationType.ROLLOUT else "",
        )
        detail = f" to revision {self.revision}" if type_ is OperationType.ROLLOUT else ""
        self.emit(f"{type_}Started", f"op-{self.op_count} {type_} {serving}->{self.desired}{detail}")

    def adopted(self, known: set[str]) -> list[AddedPod]:
        """The starting replicas a new scale-out takes over (observed; ``known``: already its own).

        It verifies and publishes them as its own, so it ends on their failures too: a replacement
        that an earlier operation created and left starting, then failed verification under this
        one, must count for the back-off (`back_off`) like the replica it replaced."""
        return [AddedPod(name=r.pod.name, ordinal=ordinal, observed=True) for r in self.role(Role.STARTING)
                if r.pod.name not in known and (ordinal := ordinal_of(self.obs.name, r.pod.name)) is not None]

    def awaits_publication(self, r: Replica) -> bool:
        """A starting replica whose engine is warm and that is ready."""
        return r.pod.ready and self.verifiable(r)

    @staticmethod
    def verifiable(r: Replica) -> bool:
        """A starting replica whose sidecar reports a warm engine (one that failed verification is
        no longer starting: `classify.failure_reason`).

        Verification starts on the sidecar's own report, not on the pod's Ready condition, which
        only follows it at the next readiness probe: the probes then overlap that wait."""
        sidecar = r.sidecar
        return sidecar is not None and sidecar.state == DrainState.SERVING and sidecar.engine_healthy

    # ----- scale-out ---------------------------------------------------------------------------

    def advance_scale_out(self, op: Operation) -> None:
        serving, starting, _ = self.counts()
        shortfall = self.desired - serving - starting
        rescuing = self.rescue(shortfall)
        shortfall -= rescuing
        op = self.retry_creates(op, self.desired)
        room = max(0, self.desired - self.gpu_holders())
        if min(shortfall, room) > 0 and self.may_create(op):
            op = self.create(op, min(shortfall, room))
        releasing = max(0, shortfall - room)  # replicas held back while leaving pods hold GPUs
        verifying = self.publish_or_verify()

        failure, failed = self.noted_failures(op)
        waiting = self.role(Role.STARTING)
        if serving >= op.to:
            self.finish(op, Phase.SUCCEEDED, Reason.TARGET_REACHED, f"{serving} serving replicas")
        elif failure and not self.pending_creates():
            # Not while a replacement's create is unobserved: once this operation is gone nothing
            # would count that pod, and a lagging index would make the next step create another.
            self.finish(op, Phase.PARTIAL, failure, failed)
        elif waiting and not rescuing and not self.pending_creates() and all(r.pod.unschedulable for r in waiting):
            self.finish(op, Phase.PARTIAL, Reason.UNSCHEDULABLE, waiting[0].pod.unschedulable)
        elif not waiting and not rescuing and not self.pending_creates() and shortfall > 0 and not releasing:
            self.finish(op, Phase.PARTIAL, Reason.BACK_OFF, "waiting before creating replacement replicas")
        else:
            phase = Phase.VERIFYING if verifying and not self.pending_creates() else Phase.PROVISIONING
            waiting_for = f"; {releasing} more once leaving pods release their GPUs" if releasing else ""
            self.op = self.set_phase(op, phase, f"{serving}/{op.to} serving{waiting_for}")

    def may_create(self, op: Operation) -> bool:
        """Whether the running operation may create pods now.

        Not while the back-off after earlier failed operations runs (`back_off`). A replica of
        this operation that failed is replaced at once when it is the first failure in a row;
        after earlier ones its replacement waits for this operation to end Partial and for the
        longer back-off that counts it, so a replica that keeps failing (answering differently on
        every attempt, say) is retried ever more slowly, not once per model load."""
        held = back_off(self.history)
        return held is None or (held.until <= self.now and not self.noted_failures(op)[0])

    @staticmethod
    def noted_failures(op: Operation) -> tuple[str, str]:
        """The reason and detail a Partial gives for the operation's own pods noted failed
        (`note_observed_creates`), or ('', '') when none failed."""
        failed = [a for a in op.added_pods if a.failure]
        return (failed[0].failure if failed else ""), ", ".join(
            f"{a.name}: {failure_text(a.failure, a.failure_message)}" for a in failed)

    def retry_creates(self, op: Operation, limit: int) -> Operation:
        """Repeat the creates the pod index has not shown yet (lost or lagging), within ``limit`` pods.

        Creates carried over from a superseded rollout may be more than a scale-out's bound
        allows; those beyond it are dropped (never retried, their names never reused)."""
        pending = self.pending_creates()
        keep = pending[:max(0, limit - (self.gpu_holders() - len(pending)))]
        for added in keep:
            self.act(CreatePod(added.name, added.ordinal, self.pinned()))
        if len(keep) < len(pending):
            dropped = {a.name for a in pending[len(keep):]}
            op = op.evolve(added_pods=[a for a in op.added_pods if a.name not in dropped])
            self.op = op
        return op

    def rescue(self, shortfall: int) -> int:
        """Undrain draining replicas first: they are warm and verified, unlike a new pod."""
        candidates = [r for r in self.role(Role.DRAINING) if r.sidecar is not None]
        candidates.sort(key=lambda r: (r.sidecar.state != DrainState.SOFT_DRAIN if r.sidecar else True,
                                       -r.pod.created_at))
        chosen = candidates[: max(shortfall, 0)]
        for r in chosen:
            self.act(Undrain(r.pod.name, drain_id(r.pod.uid)))
            self.emit("ReplicaRescued", f"Undraining {r.pod.name} instead of creating a pod")
        return len(chosen)

    def create(self, op: Operation, count: int) -> Operation:
        added = list(op.added_pods)
        for _ in range(count):
            name = pod_name(self.obs.name, self.next_ordinal)
            added.append(AddedPod(name=name, ordinal=self.next_ordinal))
            self.act(CreatePod(name, self.next_ordinal, self.pinned()))
            self.next_ordinal += 1
        self.op = op.evolve(added_pods=added)
        return self.op

    def pinned(self) -> str:
        """The GPU product a pod created now is required onto ('' for none)."""
        return self.placement.gpu_product if self.placement is not None else ""

    def publish_or_verify(self, revision: str | None = None) -> bool:
        """Publish warm, verified replicas (of ``revision`` only, when given); ask for verification of the others.

        Returns True when some replica is past provisioning: being verified, verified and waiting
        for its Ready condition (the kubelet's next readiness probe), or being published. Counting
        the waiting one keeps the operation in Verifying; otherwise it fell back to Provisioning
        between verification and readiness and returned to Verifying at publication, two status
        writes more, the second one holding the publish back until it landed.
        """
        reference = placement.reference(self.replicas)
        verifying = False
        victims = self.victim_names()
        for r in self.role(Role.STARTING):
            if not self.verifiable(r) or r.pod.name in victims | self.misplaced or \
                    revision not in (None, r.pod.revision):
                continue
            pod = r.pod
            verifying = True
            if pod.verification != "passed" and self.obs.spec.verification.enabled:
                self.act(Verify(pod.name, pod.uid, reference.pod.name if reference else None,
                                placement.verification_context(r, reference, self.products)))
            elif pod.ready:
                self.act(SetPublished(pod.name, pod.uid, True))
                self.emit("ReplicaPublished", f"{pod.name} is serving")
        return verifying

    # ----- rollout -----------------------------------------------------------------------------

    def outdated(self) -> list[Replica]:
        """Serving or starting replicas, outside the operation's victims, made from another pod template."""
        victims = self.victim_names()
        return [r for r in self.replicas if r.role in (Role.SERVING, Role.STARTING)
                and r.pod.name not in victims and r.pod.revision != self.revision]

    def advance_rollout(self, op: Operation) -> None:
        """Replace outdated replicas: surge a verified replacement first, then retire an outdated one.

        Level-based like a scale: every step recounts. New-template replicas are created while
        fewer than ``spec.replicas`` exist, within ``replicas + maxSurge`` pods; outdated serving
        replicas are retired (drained exactly like scale-in victims) only while the serving count
        stays at ``spec.replicas``, or at ``replicas - maxUnavailable`` when no surge replica can
        be added (no room, or every one waiting is unschedulable). Outdated replicas that do not
        serve (and draining leftovers of a superseded scale-in) are retired at once. ``spec.paused``
        stops new replacements; the ones under way finish.
        """
        strategy, paused = self.obs.spec.update_strategy.rolling_update, self.obs.spec.paused
        if op.revision != self.revision:
            self.emit("RolloutRetargeted", f"{op.id} continues to revision {self.revision}")
            op = op.evolve(revision=self.revision)
        moved, phases, failure = self.advance_victims(op.victims)
        kept = [v for v, p in zip(moved, phases, strict=True) if p is not None]
        victim_phases = [p for p in phases if p is not None]
        op = op.evolve(victims=kept, replaced=op.replaced + len(moved) - len(kept))
        if failure:
            self.finish(op, Phase.FAILED, Reason.DRAIN_TIMEOUT, failure)
            return
        self.op = op
        op = self.retry_creates(op, self.desired + strategy.max_surge)
        serving, starting, _ = self.counts()
        current = [r for r in self.replicas if r.role in (Role.SERVING, Role.STARTING)
                   and r.pod.revision == self.revision]
        waiting = [r for r in current if r.role is Role.STARTING]
        missing = self.desired - len(current) - len(self.pending_creates())
        if paused:
            missing = min(missing, self.desired - serving - starting)  # only lost capacity is restored
        room = max(0, self.desired + strategy.max_surge - self.gpu_holders())
        if min(missing, room) > 0 and self.may_create(op):
            op = self.create(op, min(missing, room))
        verifying = self.publish_or_verify(self.revision)
        # A surge replica on its way (scheduled, or its create not yet observed) fills the room: not blocked.
        on_its_way = any(not r.pod.unschedulable for r in waiting) or bool(self.pending_creates())
        surge_blocked = (missing > 0 and room == 0 and not on_its_way) or \
            (bool(waiting) and all(r.pod.unschedulable for r in waiting))
        old = self.outdated()
        if not paused:
            floor = self.desired - (strategy.max_unavailable if surge_blocked else 0)
            victims = self.victim_names()
            # Unpublished leftovers (an outdated starting replica, a draining one from a superseded
            # scale-in) serve no one and hold the GPUs a surge replica needs.
            retire = [r for r in old if r.role is Role.STARTING]
            retire += [r for r in self.role(Role.DRAINING) if r.pod.name not in victims]
            retire += choose_victims([r for r in old if r.role is Role.SERVING], serving - floor, self.revision)
            if retire:
                self.emit("ReplicasRetiring", ", ".join(r.pod.name for r in retire))
                op = op.evolve(victims=[*op.victims, *(Victim(name=r.pod.name, uid=r.pod.uid,
                                                               needs_drain=r.pod.ever_published) for r in retire)])
                old = [r for r in old if r not in retire]
                victim_phases += [Phase.UNPUBLISHING] * len(retire)
        self.op = op
        self.finish_or_phase_rollout(op, old, waiting, verifying, surge_blocked, victim_phases)

    def finish_or_phase_rollout(self, op: Operation, old: list[Replica], waiting: list[Replica], verifying: bool,
                                surge_blocked: bool, victim_phases: list[Phase]) -> None:
        """Succeeded once no outdated replica is left; Partial on a failed replacement; else the phase."""
        serving, _, _ = self.counts()
        failure, failed = self.noted_failures(op)
        progress = f"{op.replaced} replaced, {len(old) + len(op.victims)} outdated left, {serving}/{op.to} serving"
        if not old and not op.victims and serving >= op.to and not self.pending_creates():
            self.finish(op, Phase.SUCCEEDED, Reason.TARGET_REACHED,
                        f"{op.replaced} replica(s) replaced; every replica is on revision {self.revision}")
        elif failure and not self.pending_creates():
            self.finish(op, Phase.PARTIAL, failure, failed)
        else:
            if victim_phases:
                phase = min(victim_phases, key=VICTIM_PHASES.index)
            elif verifying:
                phase = Phase.VERIFYING
            elif self.obs.spec.paused and not waiting and not self.pending_creates():
                phase = Phase.PAUSED
            else:
                phase = Phase.PROVISIONING
            if surge_blocked and not op.victims and old and not self.obs.spec.paused:
                unschedulable = next((r.pod.unschedulable for r in waiting if r.pod.unschedulable), "")
                self.blocked = (f"no surge replica can start ({unschedulable or 'no room within maxSurge'}) and "
                                f"maxUnavailable={self.obs.spec.update_strategy.rolling_update.max_unavailable} "
                                "allows no outdated replica to drain first")
                self.emit(ConditionType.ROLLOUT_BLOCKED, self.blocked, warning=True)
            self.op = self.set_phase(op, phase, progress)

    # ----- scale-in ----------------------------------------------------------------------------

    def advance_scale_in(self, op: Operation) -> None:
        if op.phase is Phase.PENDING:
            self.select_victims(op)
            return
        victims, phases, failure = self.advance_victims(op.victims)
        op = op.evolve(victims=victims)
        left = [p for p in phases if p is not None]
        if failure:
            self.finish(op, Phase.FAILED, Reason.DRAIN_TIMEOUT, failure)
        elif not left:
            self.finish(op, Phase.SUCCEEDED, Reason.TARGET_REACHED, f"removed {len(victims)} replica(s)")
        else:
            self.op = self.set_phase(op, min(left, key=VICTIM_PHASES.index), f"{len(left)} victim(s) left")

    def advance_victims(self, victims: list[Victim]) -> tuple[list[Victim], list[Phase | None], str]:
        """Move every victim along: the victims, each one's phase (None when gone) and the first failure."""
        drain = self.obs.spec.drain
        moved: list[Victim] = []
        phases: list[Phase | None] = []
        failure = ""
        for v in victims:
            v, phase, problem = self.advance_victim(v, drain.propagation_seconds, drain.timeout_seconds,
                                                    drain.on_timeout)
            moved.append(v)
            phases.append(phase)
            failure = failure or problem
        return moved, phases, failure

    def select_victims(self, op: Operation) -> None:
        """Fix the victims in status before any side effect touches them."""
        serving, starting, draining = self.counts()
        candidates = [r for r in self.replicas if r.role in (Role.SERVING, Role.STARTING, Role.DRAINING)]
        chosen = choose_victims(candidates, serving + starting + draining - self.desired, self.revision)
        victims = [Victim(name=r.pod.name, uid=r.pod.uid, needs_drain=r.pod.ever_published) for r in chosen]
        self.emit("VictimsSelected", ", ".join(v.name for v in victims) or "none")
        # The message the next step keeps while it unpublishes: that step then has nothing to write
        # before its actions (the victims' names are in the VictimsSelected event).
        self.op = self.set_phase(op.evolve(victims=victims), Phase.UNPUBLISHING, f"{len(victims)} victim(s) left")

    def advance_victim(
        self, v: Victim, propagation: float, timeout: float, on_timeout: str
    ) -> tuple[Victim, Phase | None, str]:
        """Move one victim along; returns it, its phase (None when gone) and a failure message."""
        r = self.by_name.get(v.name)
        if r is None or r.pod.uid != v.uid:
            return v, None, ""
        pod = r.pod
        if r.role is Role.TERMINATING:
            return v, Phase.REMOVING, ""
        if not v.needs_drain and (pod.published or pod.ever_published):
            # Chosen from a pod list that predated its publication: it may be serving, so drain it.
            v = v.evolve(needs_drain=True)
        if r.role is Role.FAILED or not v.needs_drain or v.drained_at is not None or r.role is Role.DRAINED:
            if r.role is Role.DRAINED and v.drained_at is None:
                v = v.evolve(drained_at=stamp(self.now))
            self.delete(pod)
            return v, Phase.REMOVING, ""
        did = drain_id(pod.uid)
        state = r.sidecar.state if r.sidecar is not None else None
        if pod.published or v.unpublished_at is None or self.now - v.unpublished_at.timestamp() < propagation:
            # The propagation window counts from the first step that sees the pod unpublished, which
            # is after the label change reached the API server: counted from when the unpublish was
            # sent, it would lose the patch's own latency, and an unpublish lost to an operator crash
            # must not start it at all. While the pod is seen published nothing is recorded, so the
            # unpublish goes out in the step right after the victims were written, with no write of
            # its own.
            if pod.published:
                v = v.evolve(unpublished_at=None)
                self.act(SetPublished(pod.name, pod.uid, False))
            elif v.unpublished_at is None:
                v = v.evolve(unpublished_at=instant(self.now))
            if state in (None, DrainState.SERVING):
                self.act(Drain(pod.name, did, "soft"))
            return v, Phase.UNPUBLISHING, ""
        fenced_at = v.fenced_at or instant(self.now)
        v = v.evolve(fenced_at=fenced_at)
        if state in (None, DrainState.SERVING, DrainState.SOFT_DRAIN):
            self.act(Drain(pod.name, did, "fence"))
        if self.now - fenced_at.timestamp() <= timeout:
            return v, Phase.FENCING if state != DrainState.FENCED else Phase.DRAINING, ""
        inflight = r.sidecar.inflight if r.sidecar is not None else "unknown"
        message = f"{pod.name} not drained after {timeout:g}s ({inflight} in flight)"
        if on_timeout == "Force":
            self.emit("DrainForced", message, warning=True)
            self.act(DeletePod(pod.name, pod.uid))
            return v.evolve(forced=True, drained_at=stamp(self.now)), Phase.REMOVING, ""
        return v, Phase.DRAINING, message

    # ----- status ------------------------------------------------------------------------------

    def next_status(self, scaling: Scaling) -> GenRMPoolStatus:
        """The whole status: the state machine's counts and conditions, then the autoscaler's."""
        serving, starting, draining = self.counts()
        live = [r for r in self.replicas if r.role is not Role.TERMINATING]
        victims_left = sum(1 for v in self.op.victims if v.name in self.by_name) if self.op and \
            self.op.type is not OperationType.SCALE_OUT else 0
        victims = self.victim_names()
        drained = sum(1 for r in self.role(Role.DRAINED) if r.pod.name not in victims)  # victims are counted above
        held = back_off(self.history)
        if held is not None and (held.until <= self.now or serving + starting >= self.desired):
            held = None  # creates may go, or none is needed: nothing is held back
        conds = [
            self.available(serving),
            self.progressing(serving, starting, draining, held),
            self.degraded(serving, draining + drained + victims_left, held),
        ]
        if self.op is not None and self.op.type is OperationType.ROLLOUT:
            conds.append(self.condition(ConditionType.ROLLOUT_BLOCKED, bool(self.blocked),
                                        Reason.SURGE_BLOCKED if self.blocked else Reason.AS_EXPECTED, self.blocked))
        revisions = {r.pod.revision for r in live}
        return self.status.evolve(
            updated_replicas=sum(1 for r in live if r.pod.revision == self.revision),
            update_revision=self.revision,
            current_revision=self.revision if revisions <= {self.revision} else self.status.current_revision
            or min(revisions - {self.revision}),
            observed_generation=self.obs.generation,
            replicas=len(live),
            ready_replicas=sum(1 for r in live if r.pod.ready),
            serving_replicas=sum(1 for r in self.role(Role.SERVING)),
            draining_replicas=draining + drained + victims_left,
            selector=selector(self.obs.name),
            next_ordinal=self.next_ordinal,
            conditions=[*conds, *scaling.conditions],
            autoscaler=scaling.status,
            placement=self.placement,
            operation=self.op,
            operation_count=self.op_count,
            history=self.history,
        )

    def condition(self, type_: ConditionType, holds: bool, reason: str, message: str) -> Condition:
        """``type_`` as this step sees it, keeping its transition time unless its status flips."""
        status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
        return set_condition(self.status.conditions, type_, status, reason, message, self.now, self.obs.generation)

    def available(self, serving: int) -> Condition:
        if self.desired == 0:
            return self.condition(ConditionType.AVAILABLE, True, Reason.SCALED_TO_ZERO, "no replicas requested")
        if serving > 0:
            return self.condition(ConditionType.AVAILABLE, True, Reason.REPLICAS_SERVING,
                                  f"{serving}/{self.desired} replicas serving")
        return self.condition(ConditionType.AVAILABLE, False, Reason.NO_SERVING_REPLICAS, "no replica is serving")

    def progressing(self, serving: int, starting: int, draining: int, held: BackOff | None) -> Condition:
        op = self.op
        if op is not None:
            if op.phase is Phase.PAUSED:
                return self.condition(ConditionType.PROGRESSING, False, Reason.ROLLOUT_PAUSED,
                                      f"{op.id} paused by spec.paused: {op.message}")
            return self.condition(ConditionType.PROGRESSING, True, PROGRESSING_REASONS[op.type],
                                  f"{op.id} {op.phase}: {op.message}")
        if serving == self.desired and starting == 0 and draining == 0:
            return self.condition(ConditionType.PROGRESSING, False, Reason.AT_TARGET, f"{serving} replicas serving")
        if held is not None:
            return self.condition(ConditionType.PROGRESSING, False, held.reason,
                                  f"{serving}/{self.desired} serving; {starting} starting; {held.resumes()}")
        last = self.history[-1] if self.history else None
        reason = last.reason if last is not None and last.outcome in WARNING_OUTCOMES else ""
        return self.condition(ConditionType.PROGRESSING, False, reason or Reason.WAITING,
                              f"{serving}/{self.desired} serving; {starting} starting")

    def degraded(self, serving: int, surplus: int, held: BackOff | None) -> Condition:
        """Degraded while a replica failed, creates back off after failures (`back_off`, with when
        they resume), or the last operation fell short; False otherwise."""
        failed = self.role(Role.FAILED)
        last = self.history[-1] if self.history else None
        if self.obs.child_errors:
            return self.condition(ConditionType.DEGRADED, True, CHILD_FAILED, "; ".join(self.obs.child_errors))
        if failed:
            inconsistent = all(r.failure == Reason.REPLICA_INCONSISTENT for r in failed)
            detail = "; ".join(f"{r.pod.name}: {failure_text(r.failure, failure_detail(r))}" for r in failed)
            return self.condition(ConditionType.DEGRADED, True,
                                  Reason.REPLICA_INCONSISTENT if inconsistent else Reason.REPLICA_FAILED, detail)
        if held is not None:
            return self.condition(ConditionType.DEGRADED, True, held.reason, held.message())
        if last is not None and last.outcome in WARNING_OUTCOMES and (serving != self.desired or surplus):
            return self.condition(ConditionType.DEGRADED, True, last.reason or Reason.OPERATION_FAILED, last.message)
        return self.condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "")

"""One level-based reconcile step: observed state and time in, status and actions out.

The single writer (one kopf daemon per pool) calls :func:`reconcile` whenever
something changed or a resync is due, writes the returned status first and
only then carries out the actions. Every action is idempotent, so running a
step twice, or crashing between the status write and the actions, is safe.

Scale-out phases: Pending -> Provisioning -> Verifying -> Succeeded | Partial.
Scale-in phases:  Pending -> Unpublishing -> Fencing -> Draining -> Removing
                  -> Succeeded | Failed.
A new ``spec.replicas`` while an operation runs supersedes it; the next
operation undoes the least progressed work first (rescue draining replicas
before creating pods; remove unpublished pods before serving ones).

Pod-count bound (checked by the property tests and the e2e soak): pods that
hold GPUs -- every pod of the pool, Terminating and Drained ones included,
except failed ones (crashed, failed or never ready in time) -- never exceed
``max(spec.replicas, their previous count)``: creates only fill the room that
all those pods leave below ``spec.replicas``, so a scale-out waits for
Terminating pods to go. A failed replica is replaced at once: if it once
served it is fenced before deletion, so its replacement may briefly run beside
it. A replica that never served is deleted with a grace period of
``NEVER_SERVED_GRACE_SECONDS``: its preStop would otherwise hold its GPUs for
the whole drain deadline, waiting for a drain nobody needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genrm_contract.sidecar import DrainState

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
from .autoscale import Scaling, autoscale
from .childrenplan import CHILD_FAILED
from .classify import Replica, Role, classify
from .clock import stamp
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


def reconcile(obs: Observed) -> Plan:
    """Decide the next status and actions for one pool."""
    return _Step(obs).run()


def ordinal_of(pool: str, name: str) -> int | None:
    """The ordinal encoded in a replica pod name, if it is one of ours."""
    prefix = f"{pool}-"
    tail = name[len(prefix):] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def create_backoff(history: list[HistoryEntry], now: float) -> float:
    """Seconds until new pods may be created after consecutive Partial/Failed operations.

    Exponential like CrashLoopBackOff, so a replica that can never start does
    not turn into a create/delete loop burning GPU scheduling.
    """
    failures = 0
    for entry in reversed(history):
        if entry.outcome is Phase.SUPERSEDED:
            continue
        if entry.outcome is Phase.SUCCEEDED:
            break
        failures += 1
    if failures == 0:
        return 0.0
    delay = min(BACKOFF_BASE_SECONDS * 2 ** (failures - 1), BACKOFF_MAX_SECONDS)
    return max(0.0, history[-1].finished_at.timestamp() + float(delay) - now)


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
        ordinals = [o for r in self.replicas if (o := ordinal_of(self.obs.name, r.pod.name)) is not None]
        self.next_ordinal = max([self.status.next_ordinal, *(o + 1 for o in ordinals)])
        self.op = self.status.operation
        self.op_count = self.status.operation_count
        self.history = list(self.status.history)
        self.carried: list[AddedPod] = []
        """Unobserved creates of a scale-out that finished this step: still counted, retried if resumed."""

    # ----- bookkeeping -------------------------------------------------------------------------

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def emit(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def role(self, role: Role) -> list[Replica]:
        return [r for r in self.replicas if r.role is role]

    def victim_names(self) -> set[str]:
        op = self.op
        return {v.name for v in op.victims} if op is not None and op.type is OperationType.SCALE_IN else set()

    def pending_creates(self) -> list[AddedPod]:
        """Pods this operation created that the index has not shown yet (create may be lost)."""
        if self.op is None:
            return [a for a in self.carried if a.name not in self.by_name]
        if self.op.type is not OperationType.SCALE_OUT:
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
        """``op`` in ``phase`` (validated against its type), with an Event when the phase changes."""
        if op.phase == phase and op.message == message:
            return op
        if op.phase != phase:
            self.emit(f"{op.type}{phase}", f"{op.id} {op.type} {op.from_}->{op.to}: {phase}. {message}".strip())
            return op.evolve(phase=phase, message=message, last_transition_time=stamp(self.now))
        return op.evolve(message=message)

    def finish(self, op: Operation, outcome: Outcome, reason: str, message: str) -> None:
        """Move the operation to history and clear it."""
        forced = sum(1 for v in op.victims if v.forced)
        if op.type is OperationType.SCALE_OUT:
            self.carried = [a for a in op.added_pods if not a.observed and a.name not in self.by_name]
        self.history.append(HistoryEntry(
            id=op.id, type=op.type, from_=op.from_, to=op.to, outcome=outcome, reason=reason, message=message,
            started_at=op.started_at, finished_at=stamp(self.now),
            duration_seconds=round(max(0.0, self.now - op.started_at.timestamp()), 3), forced_drains=forced,
        ))
        self.history = self.history[-HISTORY_LIMIT:]
        warning = outcome in (Phase.PARTIAL, Phase.FAILED)
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
        elif self.op is not None:
            self.advance_scale_in(self.op)
        scaling = autoscale(self.obs, self.replicas)
        return Plan(status=self.next_status(scaling), actions=tuple(self.actions),
                    events=(*self.events, *scaling.events), decision=scaling.decision)

    def note_observed_creates(self) -> None:
        if self.op is None or self.op.type is not OperationType.SCALE_OUT:
            return
        added = [a.evolve(observed=True) if a.name in self.by_name else a for a in self.op.added_pods]
        self.op = self.op.evolve(added_pods=added)

    def clean_up_outside_operations(self) -> None:
        """Replace failed replicas, delete drained leftovers, unpublish pods deleted by others."""
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

    def retire_failed(self, r: Replica) -> None:
        """Replace a failed replica without cutting off requests it still holds.

        A crashed engine may have restarted and admitted new work before we
        noticed, so a once-published replica whose sidecar still answers is
        unpublished and fenced first and deleted once nothing is in flight. A
        replica that never served, or whose sidecar is unreachable, cannot be
        serving anyone and is deleted directly.
        """
        pod, sidecar = r.pod, r.sidecar
        self.emit("ReplicaFailed", f"Replacing {pod.name}: {r.failure}", warning=True)
        if pod.published:
            self.act(SetPublished(pod.name, pod.uid, False))
        if sidecar is None or not pod.ever_published or (
                sidecar.inflight == 0 and sidecar.state in (DrainState.FENCED, DrainState.DRAINED)):
            self.delete(pod)
        elif sidecar.state in (DrainState.SERVING, DrainState.SOFT_DRAIN):
            self.act(Drain(pod.name, drain_id(pod.uid), "fence"))

    def supersede_if_target_changed(self) -> None:
        op = self.op
        if op is None or op.to == self.desired:
            return
        self.finish(op, Phase.SUPERSEDED, Reason.TARGET_CHANGED, f"spec.replicas changed to {self.desired}")

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

    def start(self, type_: OperationType, serving: int) -> None:
        self.op_count += 1
        now = stamp(self.now)
        self.op = Operation(
            id=f"op-{self.op_count}", type=type_, from_=serving, to=self.desired, phase=Phase.PENDING,
            started_at=now, last_transition_time=now,
            added_pods=self.carried if type_ is OperationType.SCALE_OUT else [],
        )
        self.emit(f"{type_}Started", f"op-{self.op_count} {type_} {serving}->{self.desired}")

    def awaits_publication(self, r: Replica) -> bool:
        """A starting replica whose engine is warm and that has not failed verification."""
        sidecar = r.sidecar
        return (
            r.pod.ready and sidecar is not None and sidecar.state == DrainState.SERVING
            and sidecar.engine_healthy and r.pod.verification != "failed"
        )

    # ----- scale-out ---------------------------------------------------------------------------

    def advance_scale_out(self, op: Operation) -> None:
        serving, starting, _ = self.counts()
        shortfall = self.desired - serving - starting
        rescuing = self.rescue(shortfall)
        shortfall -= rescuing
        for added in self.pending_creates():
            self.act(CreatePod(added.name, added.ordinal))
        room = max(0, self.desired - self.gpu_holders())
        if min(shortfall, room) > 0 and create_backoff(self.history, self.now) == 0.0:
            op = self.create(op, min(shortfall, room))
        releasing = max(0, shortfall - room)  # replicas held back while leaving pods hold GPUs
        verifying = self.publish_or_verify()

        added_names = {a.name for a in op.added_pods}
        # Failed, or already being deleted for failing (a never-served one goes at once): either way
        # this operation ends Partial once its replacement's create has been seen.
        failed = [r for r in self.replicas if r.pod.name in added_names and r.failure
                  and r.role in (Role.FAILED, Role.TERMINATING)]
        inconsistent = [r for r in self.role(Role.STARTING) if r.pod.verification == "failed"]
        waiting = [r for r in self.role(Role.STARTING) if r.pod.verification != "failed"]
        if serving >= op.to:
            self.finish(op, Phase.SUCCEEDED, Reason.TARGET_REACHED, f"{serving} serving replicas")
        elif failed and not self.pending_creates():
            # Not while a replacement's create is unobserved: once this operation is gone nothing
            # would count that pod, and a lagging index would make the next step create another.
            self.finish(op, Phase.PARTIAL, failed[0].failure,
                        ", ".join(f"{r.pod.name}: {r.failure}" for r in failed))
        elif inconsistent:
            detail = "; ".join(f"{r.pod.name}: {r.pod.verification_message}" for r in inconsistent)
            self.emit(Reason.REPLICA_INCONSISTENT, detail, warning=True)
            self.finish(op, Phase.PARTIAL, Reason.REPLICA_INCONSISTENT, detail)
        elif waiting and not rescuing and not self.pending_creates() and all(r.pod.unschedulable for r in waiting):
            self.finish(op, Phase.PARTIAL, Reason.UNSCHEDULABLE, waiting[0].pod.unschedulable)
        elif not waiting and not rescuing and not self.pending_creates() and shortfall > 0 and not releasing:
            self.finish(op, Phase.PARTIAL, Reason.BACK_OFF, "waiting before creating replacement replicas")
        else:
            phase = Phase.VERIFYING if verifying and not self.pending_creates() else Phase.PROVISIONING
            waiting_for = f"; {releasing} more once leaving pods release their GPUs" if releasing else ""
            self.op = self.set_phase(op, phase, f"{serving}/{op.to} serving{waiting_for}")

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
            self.act(CreatePod(name, self.next_ordinal))
            self.next_ordinal += 1
        self.op = op.evolve(added_pods=added)
        return self.op

    def publish_or_verify(self) -> bool:
        """Publish warm, verified replicas; ask for verification of the others.

        Returns True when some replica is past provisioning (being verified or published).
        """
        reference = min(self.role(Role.SERVING), key=lambda r: r.pod.created_at, default=None)
        verifying = False
        for r in self.role(Role.STARTING):
            if not self.awaits_publication(r):
                continue
            pod = r.pod
            verifying = True
            if pod.verification == "passed" or not self.obs.spec.verification.enabled:
                self.act(SetPublished(pod.name, pod.uid, True))
                self.emit("ReplicaPublished", f"{pod.name} is serving")
            else:
                self.act(Verify(pod.name, pod.uid, reference.pod.name if reference else None))
        return verifying

    # ----- scale-in ----------------------------------------------------------------------------

    def advance_scale_in(self, op: Operation) -> None:
        if op.phase is Phase.PENDING:
            self.select_victims(op)
            return
        drain = self.obs.spec.drain
        victims: list[Victim] = []
        phases: list[Phase] = []
        failure = ""
        for v in op.victims:
            v, phase, problem = self.advance_victim(v, drain.propagation_seconds, drain.timeout_seconds,
                                                    drain.on_timeout)
            victims.append(v)
            if phase is not None:
                phases.append(phase)
            failure = failure or problem
        op = op.evolve(victims=victims)
        order = [Phase.UNPUBLISHING, Phase.FENCING, Phase.DRAINING, Phase.REMOVING]
        if failure:
            self.finish(op, Phase.FAILED, Reason.DRAIN_TIMEOUT, failure)
        elif not phases:
            self.finish(op, Phase.SUCCEEDED, Reason.TARGET_REACHED, f"removed {len(victims)} replica(s)")
        else:
            phase = min(phases, key=order.index)
            self.op = self.set_phase(op, phase, f"{len(phases)} victim(s) left")

    def select_victims(self, op: Operation) -> None:
        """Fix the victims in status before any side effect touches them."""
        serving, starting, draining = self.counts()
        candidates = [r for r in self.replicas if r.role in (Role.SERVING, Role.STARTING, Role.DRAINING)]
        chosen = choose_victims(candidates, serving + starting + draining - self.desired)
        victims = [Victim(name=r.pod.name, uid=r.pod.uid, needs_drain=r.pod.ever_published) for r in chosen]
        self.emit("VictimsSelected", ", ".join(v.name for v in victims) or "none")
        self.op = self.set_phase(op.evolve(victims=victims), Phase.UNPUBLISHING, f"{len(victims)} victim(s) selected")

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
            if pod.published or v.unpublished_at is None:
                # The propagation window counts from the last time the pod was seen published: an
                # unpublish lost to an operator crash must not let the fence come before it.
                v = v.evolve(unpublished_at=stamp(self.now))
            if pod.published:
                self.act(SetPublished(pod.name, pod.uid, False))
            if state in (None, DrainState.SERVING):
                self.act(Drain(pod.name, did, "soft"))
            return v, Phase.UNPUBLISHING, ""
        fenced_at = v.fenced_at or stamp(self.now)
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
            self.op.type is OperationType.SCALE_IN else 0
        drained = len(self.role(Role.DRAINED))
        conds = [
            self.available(serving),
            self.progressing(serving, starting, draining),
            self.degraded(serving, draining + drained + victims_left),
        ]
        return self.status.evolve(
            observed_generation=self.obs.generation,
            replicas=len(live),
            ready_replicas=sum(1 for r in live if r.pod.ready),
            serving_replicas=sum(1 for r in self.role(Role.SERVING)),
            draining_replicas=draining + drained + victims_left,
            selector=selector(self.obs.name),
            next_ordinal=self.next_ordinal,
            conditions=[*conds, *scaling.conditions],
            autoscaler=scaling.status,
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

    def progressing(self, serving: int, starting: int, draining: int) -> Condition:
        op = self.op
        if op is not None:
            scaling = Reason.SCALING_OUT if op.type is OperationType.SCALE_OUT else Reason.SCALING_IN
            return self.condition(ConditionType.PROGRESSING, True, scaling, f"{op.id} {op.phase}: {op.message}")
        if serving == self.desired and starting == 0 and draining == 0:
            return self.condition(ConditionType.PROGRESSING, False, Reason.AT_TARGET, f"{serving} replicas serving")
        last = self.history[-1] if self.history else None
        reason = last.reason if last is not None and last.outcome in (Phase.PARTIAL, Phase.FAILED) else ""
        return self.condition(ConditionType.PROGRESSING, False, reason or Reason.WAITING,
                              f"{serving}/{self.desired} serving; {starting} starting")

    def degraded(self, serving: int, surplus: int) -> Condition:
        inconsistent = [r.pod.name for r in self.role(Role.STARTING) if r.pod.verification == "failed"]
        failed = [r.pod.name for r in self.role(Role.FAILED)]
        last = self.history[-1] if self.history else None
        if self.obs.child_errors:
            return self.condition(ConditionType.DEGRADED, True, CHILD_FAILED, "; ".join(self.obs.child_errors))
        if inconsistent:
            return self.condition(ConditionType.DEGRADED, True, Reason.REPLICA_INCONSISTENT,
                                  f"answers differ from the serving replicas: {', '.join(inconsistent)}")
        if failed:
            return self.condition(ConditionType.DEGRADED, True, Reason.REPLICA_FAILED, ", ".join(failed))
        if last is not None and last.outcome in (Phase.PARTIAL, Phase.FAILED) and (serving != self.desired or surplus):
            return self.condition(ConditionType.DEGRADED, True, last.reason or Reason.OPERATION_FAILED, last.message)
        return self.condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "")

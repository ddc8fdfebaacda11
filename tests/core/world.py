"""A small simulated world around the pure reconcile core (no I/O, no randomness of its own).

The world stands in for the API server, the scheduler, the kubelet and the gateway
sidecars, faithfully enough that the safety properties of the core can be checked
against *ground truth* rather than against the core's own view:

- pods with phase, readiness, published label, ever-published and verification
  annotations, deletion state, scheduler message and restart count; a deleted pod that ran
  is seen Terminating for a step in the terminal phase its kubelet gives it (Succeeded or
  Failed: 1.27+ kubelets and the local node agent end every deleted pod so) before it goes;
- one gateway sidecar per pod running the gateway's own drain state machine (the contract's
  ``genrm_contract.drain.DrainMachine``: Serving -> SoftDrain -> Fenced -> Drained, a fence with no
  soft drain before it soft-drains for ``drain.propagationSeconds`` first) and an in-flight
  request count; fenced and drained sidecars refuse new requests, a fenced sidecar becomes
  Drained once in-flight has been 0 for ``drain.quietSeconds`` (its pod's, as the gateway's flags);
- engine warm-up after scheduling (slow starts possible), engines going unhealthy for a while
  without a restart (NotReady), a GPU capacity limit (pods beyond it stay Pending with the
  scheduler's Unschedulable message);
- the pool Service's EndpointSlices: the published Ready pods, one step behind the labels and the
  probes (`Observed.endpoints`);
- optionally nodes labelled with GPU products (``nodes``): the scheduler spreads a pod over the
  nodes its required product allows (none: Unschedulable), and a replica answers as its GPU
  product computes (replicas on two products differ, as SGLang's deterministic kernels do);
- the shell's contract for every action: the status written first and the actions after or beside
  it by the core's one write-then-act rule (`deliver`, which the shell follows too: written first
  when it records new decisions or a create is due, then the actions that need its record; counts
  alone left for a later write while an operation runs); creates
  idempotent by name (AlreadyExists), deletes bound to the pod UID and completed one step
  later (a short-grace delete of a never-served replica also to its resourceVersion, so it
  fails once the pod was published), drains bound to a drain id, undrain refused once drained, verification
  comparing the candidate's answers with the reference's (perturbed replicas differ);
- disturbances chosen by the caller: requests arriving/finishing, crashes, pod failures,
  slow starts, capacity changes, clock jumps, lost actions (operator crash between the
  status write and the actions), unwritten status (a Conflict or crash refused the write while
  the actions that go beside it were done), a stale spec (the step decides on the spec as it was
  before this step's edits, and its write meets a Conflict when they changed it), index lag
  (stale pod list for one step), unreachable
  sidecars, and an administrator deleting pods by hand.

A scale-in (or a rollout that means to leave replicas serving) never unpublishes a healthy victim
while no other replica is a ready endpoint, and puts a healthy replica that served back at once
when none serves any more (`check_last_out`, `check_rescue`).

Besides the safety checks, an operation that ends Partial or Failed never blames a pod that was
deleted, by the core or by hand, while nothing was wrong with it (`check_blame`).

Every safety check raises :class:`Violation` at the moment the bad thing would happen,
so hypothesis shrinks to the shortest sequence that shows it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from genrm_contract.drain import DrainConflict, DrainMachine
from genrm_contract.sidecar import DrainPhase, DrainState, answers_ready
from genrm_operator.api.pool import GenRMPoolSpec, GenRMPoolStatus
from genrm_operator.core.children import template_revision
from genrm_operator.core.classify import failure_reason
from genrm_operator.core.judge import judge_revision
from genrm_operator.core.model import (
    CreatePod,
    DeletePod,
    Drain,
    LabelJudge,
    Observed,
    Plan,
    PodView,
    SetPublished,
    SidecarView,
    Undrain,
    Verify,
    deliver,
)
from genrm_operator.core.names import drain_id, pod_name
from genrm_operator.core.reconcile import reconcile

POOL = "judge"
START = 1_700_000_000.0
GOOD_ANSWER = "verdict: 7/10"


class Violation(AssertionError):
    """A safety property of the operator was broken in the simulated world."""


@dataclass
class SimSidecar:
    """The gateway sidecar of one pod: the gateway's drain state machine on the world's clock."""

    machine: DrainMachine = field(default_factory=DrainMachine)
    inflight: int = 0
    idle_since: float | None = 0.0
    """When in-flight last became 0 (None while requests are in flight): the machine's quiet fact."""

    @property
    def state(self) -> DrainState:
        return self.machine.state

    @property
    def drain_id(self) -> str | None:
        return self.machine.drain_id


@dataclass
class SimPod:
    """Ground truth about one replica pod."""

    name: str
    uid: str
    ordinal: int
    created_at: float
    phase: str = "Pending"
    scheduled_at: float | None = None
    warm_at: float | None = None
    published: bool = False
    ever_published: bool = False
    verification: str = ""
    verification_message: str = ""
    deleting: bool = False
    deleted_at_step: int = -1
    unschedulable: str = ""
    cannot_start: str = ""
    started_at: float = 0.0
    """When its containers could first be created (0: at scheduling)."""
    restarts: int = 0
    slow: bool = False
    sick: bool = False
    """Its engine reports unhealthy (hung or overloaded, not restarted): the gateway's readiness
    fails, as it does for a dead engine, with no restart to count; until ``sick_until``."""
    sick_until: float = 0.0
    rewarm_at: float = 0.0
    perturbed: bool = False
    revision: str = ""
    judge: str = ""
    """Its judge revision (the spec's when it was created): what it answers."""
    required_product: str = ""
    """The GPU product its node affinity requires (the core's pin when it was created)."""
    node: str = ""
    product: str = ""
    """Its node's GPU product label ('' when unscheduled or unlabelled)."""
    sidecar: SimSidecar = field(default_factory=SimSidecar)

    @property
    def warm(self) -> bool:
        """The engine answers (the sidecar's engine health check passes)."""
        return self.phase == "Running" and self.warm_at is not None and not self.deleting and not self.sick

    @property
    def answer(self) -> str:
        """What this replica answers to the verification probes."""
        if self.perturbed:
            return f"verdict: 3/10 ({self.name})"
        good = f"{GOOD_ANSWER} by {self.judge}"  # another judge answers otherwise
        return f"{good} on {self.product}" if self.product else good

    @property
    def ready(self) -> bool:
        """The sidecar's readiness probe: engine warm, and serving or soft-draining for the operator."""
        return self.warm and answers_ready(self.sidecar.state, self.sidecar.drain_id)

    @property
    def reachable(self) -> bool:
        """The sidecar has a pod IP and is not terminating (the shell's endpoint list)."""
        return self.scheduled_at is not None and not self.deleting and self.phase == "Running"

    @property
    def holds_gpu(self) -> bool:
        return self.scheduled_at is not None

    def view(self) -> PodView:
        return PodView(
            name=self.name, uid=self.uid, created_at=self.created_at, phase=self.phase, ready=self.ready,
            published=self.published, ever_published=self.ever_published,
            verification=self.verification,  # type: ignore[arg-type]
            verification_message=self.verification_message, deleting=self.deleting,
            unschedulable=self.unschedulable, restarts=self.restarts, revision=self.revision, node=self.node,
            cannot_start=self.cannot_start, startup_from=self.started_at, judge=self.judge,
        )


@dataclass(frozen=True)
class Ev:
    """One disturbance. ``a`` and ``b`` are small integers whose meaning depends on ``kind``.

    Kinds: scale (a = replicas), arrive (pod a, b requests), finish (pod a, b requests),
    crash (pod a), fail (pod a), slow (pod a, or the next pod when none is starting),
    template (the pod template changes: engine env V=a), pause (spec.paused = a is odd),
    perturb (the next created pod answers differently), gpus (a = capacity), tick (a = seconds),
    lose (this step's actions are lost), unwritten (this step's status write is refused; the
    actions that go beside it happen, those that wait for it do not), stale (this step decides on
    the spec before this step's edits; its write is refused when they changed it), lag (this step
    sees last step's pod list),
    unreachable (pod a's sidecar does not answer this step), admin_delete (pod a), sick (pod a's engine
    is unhealthy for 4 b seconds, then recovers: NotReady without a restart), none.
    """

    kind: str
    a: int = 0
    b: int = 0


@dataclass
class World:
    """The simulated cluster around one GenRMPool."""

    spec: GenRMPoolSpec
    gpus: int = 1000
    cannot_start: str = ""
    """What the kubelet says of every scheduled pod's containers while they cannot be created as
    specified (a missing Secret); '' when they can: the pods it held start from then."""
    nodes: dict[str, str] = field(default_factory=dict)
    """GPU product label by node name ('' for a node without the label); none: pods run nowhere in particular."""
    now: float = START
    warmup: float = 2.0
    crash_warmup: float = 6.0
    check_bound: bool = True
    status: GenRMPoolStatus = field(default_factory=GenRMPoolStatus)
    generation: int = 1
    pods: dict[str, SimPod] = field(default_factory=dict)
    names_ever: set[str] = field(default_factory=set)
    names_seen: set[str] = field(default_factory=set)
    names_deleted: set[str] = field(default_factory=set)
    """Pods the core deleted: whatever its writes, it never creates one of these names again."""
    deleted_healthy: set[str] = field(default_factory=set)
    """Pods deleted (by the core or by hand) while nothing was wrong with them: never to blame."""
    step_no: int = 0
    uid_counter: int = 0
    perturb_next: int = 0
    slow_next: int = 0
    last_views: tuple[PodView, ...] | None = None
    forced_deletes: int = 0
    plans: list[Plan] = field(default_factory=list)
    keep_plans: bool = False
    lagged: bool = False
    """This step's core saw last step's pod list."""
    stale: bool = False
    """This step's core saw the spec as it was before this step's edits."""
    chosen_before: set[str] = field(default_factory=set)
    """Victims of the operation before this step (a repeated unpublish is no new choice)."""
    unwritten_since: float | None = None
    """Since when the status has had counts the shell did not write (`report_waits`)."""
    endpoints: frozenset[str] = frozenset()
    """The pods the pool Service's EndpointSlices list as ready endpoints: the published Ready pods as
    the EndpointSlice controller last saw them, one step behind the labels and probes."""
    promote: str = ""
    """The pool's genrm.io/promote annotation."""
    emptied_steps: int = 0
    """Undisturbed steps in a row that ended with no replica serving while a healthy one that served
    before was kept out of the Service (`check_rescue`)."""

    # ----- disturbances ------------------------------------------------------------------------

    def pod_at(self, index: int) -> SimPod | None:
        names = sorted(self.pods, key=lambda n: self.pods[n].ordinal)
        return self.pods[names[index % len(names)]] if names else None

    def scale(self, replicas: int) -> None:
        if replicas != self.spec.replicas:
            self.spec = self.spec.model_copy(update={"replicas": replicas})
            self.generation += 1

    def edit(self, **wire: object) -> None:
        """A spec change through the API (validated like the API server would)."""
        doc = {**self.spec.to_wire(), **wire}
        self.spec = GenRMPoolSpec.model_validate(doc)
        self.generation += 1

    @property
    def revision(self) -> str:
        """The pod template revision a pod created now gets."""
        return template_revision(POOL, self.spec)

    def accepts_requests(self, pod: SimPod) -> bool:
        """Requests reach published ready replicas and soft-drained ones (endpoint propagation)."""
        if not pod.warm or not pod.reachable:
            return False
        state, pin = pod.sidecar.state, self.pinned()
        return state == DrainState.SOFT_DRAIN or (state == DrainState.SERVING and pod.published
                                                  and pin in (None, pod.judge))

    def arrive(self, pod: SimPod, count: int) -> None:
        if self.accepts_requests(pod):
            pod.sidecar.inflight += count
            pod.sidecar.idle_since = None

    def finish(self, pod: SimPod, count: int) -> None:
        pod.sidecar.inflight = max(0, pod.sidecar.inflight - count)
        if pod.sidecar.inflight == 0 and pod.sidecar.idle_since is None:
            pod.sidecar.idle_since = self.now

    def crash(self, pod: SimPod) -> None:
        """The engine container restarts: in-flight requests are lost, warm-up starts again."""
        if pod.phase != "Running" or pod.deleting:
            return
        pod.restarts += 1
        if pod.sidecar.inflight:
            pod.sidecar.inflight, pod.sidecar.idle_since = 0, self.now  # the lost requests end now
        pod.warm_at = None
        pod.rewarm_at = self.now + self.crash_warmup

    def fail(self, pod: SimPod) -> None:
        """The pod dies for good (phase Failed): in-flight requests are lost."""
        if pod.deleting:
            return
        pod.phase = "Failed"
        pod.sidecar.inflight = 0
        pod.warm_at = None

    def apply_event(self, ev: Ev, flags: dict[str, object]) -> float:
        """Apply one disturbance; returns the clock step it asks for (0 for none)."""
        pod = self.pod_at(ev.a)
        match ev.kind:
            case "scale":
                self.scale(ev.a)
            case "template":
                self.edit(engine={**self.spec.engine.to_wire(), "env": [{"name": "V", "value": str(ev.a)}]})
            case "pause":
                self.edit(paused=ev.a % 2 == 1)
            case "arrive" if pod is not None:
                self.arrive(pod, max(ev.b, 1))
            case "finish" if pod is not None:
                self.finish(pod, max(ev.b, 1))
            case "crash" if pod is not None:
                self.crash(pod)
            case "sick" if pod is not None:
                pod.sick, pod.sick_until = True, max(pod.sick_until, self.now + 4 * max(ev.b, 1))
            case "fail" if pod is not None:
                self.fail(pod)
            case "slow":
                starting = [p for p in self.pods.values() if p.warm_at is None and not p.deleting]
                if starting:
                    starting[ev.a % len(starting)].slow = True
                else:
                    self.slow_next += 1
            case "perturb":
                self.perturb_next += 1
            case "gpus":
                self.gpus = ev.a
            case "tick":
                return float(ev.a)
            case "lose":
                flags["lose"] = True
            case "unwritten":
                flags["unwritten"] = True
            case "stale":
                flags["stale"] = True
            case "lag":
                flags["lag"] = True
            case "unreachable" if pod is not None:
                unreachable = flags.setdefault("unreachable", set())
                assert isinstance(unreachable, set)
                unreachable.add(pod.name)
            case "admin_delete" if pod is not None:
                self.admin_delete(pod)
            case _:
                pass
        return 0.0

    def admin_delete(self, pod: SimPod) -> None:
        """Someone deletes a pod by hand (the preStop hook drains it; not the operator's doing)."""
        if not pod.deleting:
            self.begin_deletion(pod, pod.view(), self.now)

    def begin_deletion(self, pod: SimPod, judged: PodView, at: float) -> None:
        """The API server marks the pod deleted. Whether something was wrong with it is judged
        now, on ``judged`` as it was at ``at`` (the true pod for a deletion by hand, the core's own
        view for the core's delete: a pod it saw fail, even on a lagging list, it deletes for that
        failure); from here on its phase is the kubelet's answer to the deletion."""
        if not failure_reason(judged, at, float(self.spec.engine.startup_timeout_seconds)):
            self.deleted_healthy.add(pod.name)
        pod.deleting = True
        pod.deleted_at_step = self.step_no

    # ----- the world moving on its own ---------------------------------------------------------

    def progress(self) -> None:
        """Time passed: terminations complete, the scheduler places pods, engines warm up, drains end."""
        for name, pod in list(self.pods.items()):
            if not pod.deleting or pod.deleted_at_step >= self.step_no:
                continue
            if pod.holds_gpu and pod.phase not in ("Succeeded", "Failed"):
                # The kubelet stops the containers and reports a terminal phase before the object
                # goes: Succeeded when every container exited 0, else Failed. Which one depends on
                # how the engine takes SIGTERM, so the world has both, by ordinal.
                pod.phase = "Failed" if pod.ordinal % 2 else "Succeeded"
            else:
                del self.pods[name]
        used = sum(1 for p in self.pods.values() if p.holds_gpu)
        for pod in sorted(self.pods.values(), key=lambda p: p.ordinal):
            if pod.scheduled_at is not None or pod.deleting:
                continue
            fits = sorted(n for n, product in self.nodes.items() if pod.required_product in ("", product))
            if self.nodes and not fits:
                pod.unschedulable = (f"0/{len(self.nodes)} nodes are available: {len(self.nodes)} node(s) "
                                     "didn't match Pod's node affinity/selector.")
            elif used < self.gpus:
                used += 1
                pod.scheduled_at, pod.phase, pod.unschedulable = self.now, "Running", ""
                if fits:  # spread by ordinal, so unpinned replicas land on every product
                    pod.node = fits[pod.ordinal % len(fits)]
                    pod.product = self.nodes[pod.node]
            else:
                pod.unschedulable = (f"0/{self.gpus} nodes are available: "
                                     f"{self.gpus} Insufficient nvidia.com/gpu.")
        for pod in self.pods.values():
            if pod.scheduled_at is None or pod.deleting or pod.warm_at is not None:
                continue
            if self.cannot_start:
                pod.cannot_start, pod.phase = self.cannot_start, "Pending"
            elif pod.cannot_start:
                pod.cannot_start, pod.phase, pod.started_at = "", "Running", self.now
        startup = float(self.spec.engine.startup_timeout_seconds)
        for pod in self.pods.values():
            if pod.phase != "Running" or pod.warm_at is not None or pod.scheduled_at is None:
                continue
            delay = startup + 10.0 if pod.slow else self.warmup
            if self.now >= max(max(pod.scheduled_at, pod.started_at) + delay, pod.rewarm_at):
                pod.warm_at = self.now
        for pod in self.pods.values():
            pod.sick = pod.sick and self.now < pod.sick_until
            sc = pod.sidecar
            if sc.inflight == 0 and sc.idle_since is None:
                sc.idle_since = self.now
            sc.machine = sc.machine.at(self.now, sc.idle_since)
        self.endpoints = self.in_service_now()

    def in_service_now(self) -> frozenset[str]:
        """The pods a client reaches through the Service's selector: published and Ready, not deleted,
        and of the pinned judge revision while the written status pins one (`pinned`)."""
        pin = self.pinned()
        return frozenset(p.name for p in self.pods.values() if p.published and p.ready and not p.deleting
                         and (pin is None or p.judge == pin))

    def pinned(self) -> str | None:
        """The judge revision the Service selects alone, as the shell applies it from the written
        status (the world has no Service object: the selector takes effect at once)."""
        judge, op = self.status.judge, self.status.operation
        if judge is None:
            return None
        if (op is not None and op.type == "JudgeSwitch") or any(
                p.judge != judge.active for p in self.pods.values() if not p.deleting):
            return judge.active
        return None

    # ----- observation -------------------------------------------------------------------------

    def sidecar_view(self, pod: SimPod) -> SidecarView | None:
        if not pod.reachable:
            return None
        sc = pod.sidecar
        return SidecarView(state=sc.state, inflight=sc.inflight, engine_healthy=pod.warm,
                           idle_from=sc.idle_since if sc.inflight == 0 else None, reason=sc.machine.reason)

    def observe(self, lag: bool, unreachable: Iterable[str], spec: tuple[GenRMPoolSpec, int] | None = None) -> Observed:
        """What a step sees; ``spec`` (with its generation) stands in for the pool's when the
        watch has not caught up with an edit."""
        views = tuple(p.view() for p in sorted(self.pods.values(), key=lambda p: p.ordinal))
        pods = self.last_views if lag and self.last_views is not None else views
        self.last_views = views
        down = set(unreachable)
        sidecars = {p.name: (None if p.name in down else self.sidecar_view(p)) for p in self.pods.values()}
        seen, generation = spec or (self.spec, self.generation)
        return Observed(name=POOL, generation=generation, spec=seen, status=self.status,
                        pods=pods, sidecars=sidecars, now=self.now,
                        gpu_products={n: product for n, product in self.nodes.items() if product},
                        endpoints=self.endpoints, promote=self.promote)

    # ----- one step ----------------------------------------------------------------------------

    def step(self, events: Iterable[Ev] = (), dt: float = 1.0) -> Plan:
        """Disturbances, time passing, one reconcile, status write, actions; checks throughout."""
        self.step_no += 1
        events = list(events)
        flags: dict[str, object] = {}
        extra = 0.0
        before_edits = (self.spec, self.generation)
        for ev in events:
            extra += self.apply_event(ev, flags)
        self.now += dt + extra
        self.progress()
        self.lagged = bool(flags.get("lag"))
        self.stale = bool(flags.get("stale"))
        stale = before_edits if flags.get("stale") else None
        obs = self.observe(self.lagged, flags.get("unreachable", set()), stale)  # type: ignore[arg-type]
        plan = reconcile(obs)
        if self.keep_plans:
            self.plans.append(plan)
        before = self.live_count()
        surge = self.surge_allowance(plan)
        self.chosen_before = {v.name for v in self.status.operation.victims} if self.status.operation else set()
        # The status is written first, through its wire form, by the rule the shell follows
        # (`deliver`); when the write is refused, the actions held back for it are never sent, and
        # the others (sent beside the write) are done all the same. A stale step is refused only
        # when the shell writes at all: with no write there is no Conflict to stop it.
        delivery = deliver(self.status, plan, self.unwritten_since, self.now)
        self.unwritten_since = delivery.unwritten_since
        writes = delivery.write
        unwritten = bool(flags.get("unwritten")) or (writes and stale is not None and stale[1] != self.generation)
        if not unwritten:
            self.names_seen.update(p.name for p in obs.pods)
        self.check_status(plan)
        self.check_blame(plan)
        if writes and not unwritten:
            self.status = GenRMPoolStatus.model_validate(plan.status.to_wire())
        if not flags.get("lose"):
            for action in delivery.sent(not unwritten):
                self.carry_out(action, obs, plan)
        self.check_after(before, surge)
        self.check_one_judge()
        self.check_rescue(plan, any(flags.get(f) for f in ("lose", "unwritten", "stale", "lag", "unreachable")),
                          any(ev.kind in ("crash", "sick", "fail", "admin_delete") for ev in events))
        return plan

    def live_count(self) -> int:
        """Pods holding GPUs, Terminating and Drained ones included, except failed ones (crashed,
        failed or never ready in time, judged on the true pod): what the core's pod-count bound
        is about. A pod being deleted is judged on its state as if nobody deleted it: a terminal
        phase frees its GPUs whatever brought it, though the kubelet's answer to a deletion is
        no failure of an operation."""
        timeout = float(self.spec.engine.startup_timeout_seconds)
        return sum(1 for p in self.pods.values()
                   if not failure_reason(replace(p.view(), deleting=False), self.now, timeout))

    # ----- actions (the shell's contract) ------------------------------------------------------

    def carry_out(self, action: object, obs: Observed, plan: Plan) -> None:
        match action:
            case CreatePod(name=name, ordinal=ordinal, gpu_product=product):
                self.create(name, ordinal, product)
            case DeletePod(name=name, uid=uid, grace_seconds=grace):
                pod = self.pods.get(name)
                if grace is not None and pod is not None and pod.ever_published:
                    return  # the resourceVersion precondition fails: publishing changed the pod
                if pod is not None and pod.uid == uid and not pod.deleting:
                    self.check_delete(pod, plan)
                    self.names_deleted.add(name)
                    seen = next((v for v in obs.pods if v.name == name and v.uid == uid), pod.view())
                    self.begin_deletion(pod, seen, obs.now)
                    pod.published = False
            case SetPublished(name=name, uid=uid, published=published):
                pod = self.pods.get(name)
                if pod is None or pod.uid != uid:
                    return
                if published:
                    self.check_publish(pod, obs, plan)
                    pod.ever_published = True
                elif pod.published:
                    self.check_rollout_floor(pod, plan)
                    self.check_last_out(pod, plan)
                pod.published = published
            case Verify(name=name, uid=uid, reference=reference, context=context):
                self.verify(name, uid, reference, context)
            case Drain(name=name, drain_id=did, phase=phase, reason=reason, active=active):
                pod = self.pods.get(name)
                if pod is None or not pod.reachable or did != drain_id(pod.uid):
                    return
                sc = pod.sidecar
                try:
                    sc.machine = sc.machine.drain(did, DrainPhase(phase), None, self.now, sc.idle_since, reason,
                                                  active or None)
                except DrainConflict:
                    return  # 409: another drain is in progress
            case LabelJudge(name=name, uid=uid, judge=judge):
                pod = self.pods.get(name)
                if pod is not None and pod.uid == uid:
                    pod.judge = judge
            case Undrain(name=name, drain_id=did):
                pod = self.pods.get(name)
                if pod is None or not pod.reachable:
                    return
                sc = pod.sidecar
                try:
                    sc.machine = sc.machine.undrain(did, self.now, sc.idle_since)
                except DrainConflict:
                    return  # 409: drained, or another drain is in progress
            case _:
                raise Violation(f"unknown action {action!r}")

    def create(self, name: str, ordinal: int, product: str = "") -> None:
        if name != pod_name(POOL, ordinal):
            raise Violation(f"CreatePod {name} does not carry its ordinal {ordinal}")
        if name in self.pods:
            return  # AlreadyExists: success, nothing new
        if name in self.names_deleted:
            raise Violation(f"pod name {name} created again after the core deleted its pod")
        if name in self.names_seen:
            # A pod deleted by someone else before the core ever listed it is indistinguishable from
            # a lost create, so retrying that name is allowed; reusing a name the core saw is not.
            # The status is the core's only memory: a pod counts as seen once a step that listed it
            # had its status written (a refused write leaves the core as if it never looked; one
            # that `report_waits` leaves for later carries no new record of a pod: a create seen
            # is a decision).
            raise Violation(f"pod name {name} reused after its pod was seen and deleted")
        self.names_ever.add(name)
        # A create retried after its pod was deleted by hand before the core listed it: the new pod's
        # own failures are its to blame.
        self.deleted_healthy.discard(name)
        self.uid_counter += 1
        drain = self.spec.drain  # the gateway's --quiet-seconds and --propagation-seconds
        sidecar = SimSidecar(DrainMachine(quiet_seconds=float(drain.quiet_seconds),
                                          propagation_seconds=float(drain.propagation_seconds)),
                             idle_since=self.now)
        pod = SimPod(name=name, uid=f"uid-{self.uid_counter}", ordinal=ordinal, created_at=self.now,
                     revision=self.revision, judge=judge_revision(self.spec), required_product=product, sidecar=sidecar)
        if self.perturb_next:
            self.perturb_next -= 1
            pod.perturbed = True
        if self.slow_next:
            self.slow_next -= 1
            pod.slow = True
        self.pods[name] = pod

    def verify(self, name: str, uid: str, reference: str | None, context: str = "") -> None:
        """Probe the candidate and the reference through their sidecars; record the verdict on the
        pod, after the core's ``context`` as the shell writes it."""
        pod = self.pods.get(name)
        if pod is None or pod.uid != uid or not pod.reachable or not pod.warm:
            return  # probes fail: nothing recorded, the core asks again
        if reference is None:
            pod.verification, pod.verification_message = "passed", f"{context}: no reference"
            return
        ref = self.pods.get(reference)
        if ref is None or not ref.reachable or not ref.warm:
            return  # the reference cannot answer: nothing recorded
        same = pod.answer == ref.answer
        pod.verification = "passed" if same else "failed"
        pod.verification_message = f"{context}: " + ("identical" if same else
                                                     f"new={pod.answer!r} reference={ref.answer!r}")

    # ----- safety checks -----------------------------------------------------------------------

    def check_delete(self, pod: SimPod, plan: Plan) -> None:
        """In-flight requests are only ever dropped by a drain that timed out under Force."""
        op = plan.status.operation
        victim = next((v for v in op.victims if v.name == pod.name and v.uid == pod.uid), None) if op else None
        forced = victim is not None and victim.forced
        if forced:
            if self.spec.drain.on_timeout != "Force":
                raise Violation(f"{pod.name} forced although drain.onTimeout is {self.spec.drain.on_timeout}")
            self.forced_deletes += 1
        if pod.sidecar.inflight > 0 and not forced:
            raise Violation(f"{pod.name} deleted with {pod.sidecar.inflight} request(s) in flight "
                            f"(sidecar {pod.sidecar.state}, victim {victim})")
        failed = pod.phase == "Failed" or pod.restarts > 0
        if pod.ever_published and not failed and not forced and pod.sidecar.state != DrainState.DRAINED:
            raise Violation(f"{pod.name} was published and is deleted while its sidecar is "
                            f"{pod.sidecar.state}, not Drained")

    def check_publish(self, pod: SimPod, obs: Observed, plan: Plan) -> None:
        """Published only when the core saw it ready and warm, and its verification passed; a victim
        put back into the Service (`scale_in.keep`) as soon as the core saw its engine warm and its
        sidecar not Drained: it served before, and the Service routes to it only once Ready."""
        seen = next((p for p in obs.pods if p.name == pod.name and p.uid == pod.uid), None)
        sidecar = obs.sidecars.get(pod.name)
        op = plan.status.operation
        held = op is not None and any(v.name == pod.name and v.held_at is not None for v in op.victims)
        put_back = held and seen is not None and seen.ever_published and sidecar is not None \
            and sidecar.engine_healthy and sidecar.state != DrainState.DRAINED
        if not put_back and (seen is None or not seen.ready or sidecar is None or not sidecar.engine_healthy
                             or sidecar.state != DrainState.SERVING):
            raise Violation(f"{pod.name} published without being seen ready and warm ({seen}, {sidecar})")
        if self.spec.verification.enabled and (seen.verification != "passed" or pod.verification != "passed"):
            raise Violation(f"{pod.name} published with verification {pod.verification!r}")

    def check_rollout_floor(self, pod: SimPod, plan: Plan) -> None:
        """A rollout chooses a healthy replica to unpublish only while ``replicas - maxUnavailable``
        others serve.

        Judged on ground truth when the victim is chosen, except in a step whose core saw a stale
        pod list (it may count a pod deleted by hand since as serving; the next step corrects it).
        A victim chosen earlier is unpublished again if it is still published (an unpublish lost
        to a crash), whatever happened to the others since."""
        op = plan.status.operation
        healthy = pod.phase == "Running" and pod.restarts == 0 and not pod.deleting
        if op is None or op.type != "Rollout" or pod.name not in {v.name for v in op.victims} or not healthy \
                or self.lagged or pod.name in self.chosen_before:
            return
        others = [p for p in self.pods.values() if p is not pod and p.published and not p.deleting
                  and p.phase == "Running" and p.restarts == 0]
        floor = self.spec.replicas - self.spec.update_strategy.rolling_update.max_unavailable
        if len(others) < floor:
            raise Violation(f"rollout unpublished {pod.name} leaving {len(others)} serving < {floor} "
                            f"(replicas {self.spec.replicas} - maxUnavailable)")

    def holds_a_survivor(self, plan: Plan) -> bool:
        """Whether the plan's operation means to leave replicas serving: a scale-in to one or more, or
        a rollout whose maxUnavailable does not allow the whole pool to be unavailable."""
        op, spec = plan.status.operation, self.spec
        if op is None or op.type == "ScaleOut":
            return False
        return spec.replicas > (spec.update_strategy.rolling_update.max_unavailable if op.type == "Rollout" else 0)

    def check_last_out(self, pod: SimPod, plan: Plan) -> None:
        """A healthy victim leaves the Service only while a replica outside the victims is a ready
        endpoint of it (as the step saw the EndpointSlices) and still serves: otherwise its unpublish
        would leave the Service empty while it could serve. Not judged in a step whose core saw a
        stale pod list."""
        op = plan.status.operation
        if op is None or not self.holds_a_survivor(plan) or self.lagged or self.stale or not pod.ready:
            return
        victims = {v.name for v in op.victims}
        if pod.name not in victims:
            return
        others = [n for n in self.endpoints if n not in victims and n in self.pods
                  and self.pods[n].published and self.pods[n].ready]
        if not others:
            raise Violation(f"{op.id} {op.type} unpublished healthy victim {pod.name} while no other replica "
                            f"served (ready endpoints {sorted(self.endpoints)})")

    def check_rescue(self, plan: Plan, disturbed: bool, fault: bool) -> None:
        """While a scale-in or rollout means to leave replicas serving, the Service is never left with
        no published Ready replica while a healthy replica that served before is kept out of it for
        more than one undisturbed step (the core undrains and republishes it in one step; a replica
        that never served is verified first, one step more) (steps
        whose actions were lost or refused, or whose core saw a stale list or spec or an unreachable
        sidecar, are not counted). A replica failing or going NotReady in the step (``fault``) starts
        the count again: the core may have been putting back the very replica that just failed."""
        if not self.holds_a_survivor(plan) or self.in_service_now():
            self.emptied_steps = 0
            return
        kept_out = [p.name for p in self.pods.values()
                    if p.ever_published and p.warm and p.restarts == 0 and p.reachable
                    and p.sidecar.state != DrainState.DRAINED]
        if not kept_out:
            self.emptied_steps = 0
            return
        if fault:
            self.emptied_steps = 1
        elif not disturbed:
            self.emptied_steps += 1
        if self.emptied_steps > 1:
            op = plan.status.operation
            raise Violation(f"no replica serves for {self.emptied_steps} steps while {kept_out} could "
                            f"({op and (op.type, op.phase, op.message)})")

    def check_status(self, plan: Plan) -> None:
        status = plan.status
        if status.operation is not None and status.operation.phase in ("Succeeded", "Partial", "Failed"):
            raise Violation(f"a finished operation is still active: {status.operation}")
        created = [p.ordinal for p in self.pods.values()]
        if created and status.next_ordinal <= max(created):
            raise Violation(f"nextOrdinal {status.next_ordinal} would reuse ordinal {max(created)}")
        types = [c.type for c in status.conditions]
        rollout = status.operation is not None and status.operation.type == "Rollout"
        if types != ["Available", "Progressing", "Degraded", *(["RolloutBlocked"] if rollout else [])]:
            raise Violation(f"conditions {types}")

    def check_blame(self, plan: Plan) -> None:
        """An operation that ends Partial or Failed never blames a pod deleted while nothing was
        wrong with it: retiring a replica is no failure of the operation that retires it, and the
        terminal phase of a deleted pod is the kubelet's answer to the deletion."""
        known = {h.id for h in self.status.history}
        for entry in plan.status.history:
            if entry.id in known or entry.outcome not in ("Partial", "Failed"):
                continue
            blamed = set(re.findall(rf"\b({POOL}-\d+): ", entry.message))
            if blamed & self.deleted_healthy:
                raise Violation(f"{entry.id} {entry.type} ended {entry.outcome} ({entry.reason}) blaming "
                                f"{sorted(blamed & self.deleted_healthy)}, deleted while healthy: {entry.message}")

    def check_one_judge(self) -> None:
        """The pool's clients never reach two judge revisions at once: whatever the Service lists, and
        whatever admits requests kept alive on a connection (a soft-draining replica), is one judge."""
        reached = {self.pods[n].judge for n in self.in_service_now()}
        reached |= {p.judge for p in self.pods.values() if self.accepts_requests(p)}
        if len(reached) > 1:
            raise Violation(f"clients reach judge revisions {sorted(reached)} at once")

    def surge_allowance(self, plan: Plan) -> int:
        """maxSurge while a rollout runs (before or after this step), the preview's size while a judge
        switch runs, else 0."""
        ops = (self.status.operation, plan.status.operation)
        if any(op is not None and op.type == "JudgeSwitch" for op in ops):  # two judges up at once, by design
            preview = self.spec.judge_update.blue_green.preview_replicas
            return self.spec.replicas if preview is None else preview
        rolling = any(op is not None and op.type == "Rollout" for op in ops)
        return self.spec.update_strategy.rolling_update.max_surge if rolling else 0

    def check_after(self, before: int, surge: int) -> None:
        """The pod-count bound; during a judge switch, the active revision's pods (which nothing scales
        while it runs: more than spec.replicas when a count was lowered with the judge) plus the preview."""
        after = self.live_count()
        judge = self.status.judge
        active = sum(1 for p in self.pods.values() if judge is not None and p.judge == judge.active
                     and not failure_reason(replace(p.view(), deleting=False), self.now,
                                            float(self.spec.engine.startup_timeout_seconds)))
        switching = self.status.operation is not None and self.status.operation.type == "JudgeSwitch"
        if self.check_bound and after > max(self.spec.replicas + surge, before, active + surge if switching else 0):
            raise Violation(f"{after} live pods > max(spec.replicas={self.spec.replicas} + maxSurge {surge}, "
                            f"before={before})")

    # ----- convergence -------------------------------------------------------------------------

    def serving(self) -> list[SimPod]:
        """Replicas that really take traffic: published, warm, sidecar Serving."""
        return [p for p in self.pods.values() if p.published and p.ready and not p.deleting]

    def converged(self) -> bool:
        n = self.spec.replicas
        live = [p for p in self.pods.values() if not p.deleting]
        rolled = self.spec.update_strategy.type == "OnDelete" or all(p.revision == self.revision for p in live)
        return (
            self.status.operation is None and len(self.serving()) == n and len(live) == n
            and self.status.serving_replicas == n and self.status.replicas == n and rolled
        )

    def heal(self) -> None:
        """Inputs stop changing and the world is healthy: capacity suffices, no new disturbances,
        requests finish, and an administrator removes the serving replicas that answer
        differently (nothing tells which of two answers is right, so every new replica fails
        verification against such a reference). A new replica answering differently is the
        core's to replace."""
        self.gpus = max(self.gpus, 4 * max(self.spec.replicas, len(self.pods)) + 4)
        self.perturb_next = self.slow_next = 0
        if self.spec.paused:
            self.edit(paused=False)  # the user resumes the rollout
        for pod in list(self.pods.values()):
            pod.sidecar.inflight = 0
            pod.sick = False
            if pod.perturbed and pod.ever_published:
                self.admin_delete(pod)


def replace(pod: PodView, **changes: object) -> PodView:
    """A changed copy of a pod view (for example-based tests)."""
    return dataclasses.replace(pod, **changes)  # type: ignore[arg-type]

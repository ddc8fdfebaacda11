"""What the core sees and what it asks for.

The kopf shell turns Kubernetes objects and sidecar answers into these plain
values, calls :func:`genrm_operator.core.reconcile.reconcile`, and carries out
the returned actions. Keeping them as small frozen dataclasses makes the core
testable with generated sequences of events and clock steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from genrm_contract.demand import DemandHint
from genrm_contract.sidecar import DrainPhase, DrainReason, DrainState

from ..api.pool import GenRMPoolSpec, GenRMPoolStatus
from ..api.status import EventReason
from ..autoscaling import Decision

if TYPE_CHECKING:  # children imports placement, which imports this module
    from .children import Manifest
    from .childrenplan import ChildAction

Verification = Literal["", "passed", "failed"]


@dataclass(frozen=True)
class PodView:
    """The facts about one replica pod that decisions depend on."""

    name: str
    uid: str
    created_at: float
    phase: str = "Pending"
    ready: bool = False
    published: bool = False
    ever_published: bool = False
    verification: Verification = ""
    verification_message: str = ""
    deleting: bool = False
    unschedulable: str = ""
    """Scheduler message when the pod cannot be placed (e.g. not enough nvidia.com/gpu)."""
    cannot_start: str = ""
    """The kubelet's reason and message when a container cannot be created as specified (a missing
    Secret or key, an invalid image name): nothing the operator does, a replacement included, changes that."""
    startup_from: float = 0.0
    """When the startup timeout began to count, if later than creation: the pod was scheduled, or
    its containers started, only then (after an Unschedulable spell or a configuration error)."""
    restarts: int = 0
    resource_version: str = ""
    revision: str = ""
    """The pod template revision it was made from (empty: made before revisions, so outdated)."""
    node: str = ""
    """The node it is scheduled on (spec.nodeName; empty until scheduled)."""
    judge: str = ""
    """Its judge revision (label genrm.io/judge-revision; empty: made before judge revisions, counted
    as the active one's)."""

    @property
    def blocked(self) -> str:
        """Why the pod cannot start until something outside the operator changes, or ''."""
        return self.unschedulable or self.cannot_start


@dataclass(frozen=True)
class SidecarView:
    """A gateway sidecar's own report (GET /v1/state)."""

    state: DrainState
    inflight: int = 0
    engine_healthy: bool = False
    idle_from: float | None = None
    """Since when (seconds since the epoch, by the operator's clock) nothing has been in flight, as
    of the report; None while the replica is busy or was not idle long enough to say so."""
    demand: tuple[DemandHint, ...] = ()
    """The demand hints the gateway was sent and holds."""
    reason: DrainReason | None = None
    """Why it is fenced when it is not leaving: a judge switch's held fence (`judgeswitch`)."""


@dataclass(frozen=True)
class MetricSamples:
    """What the shell scraped for the autoscaler this step (taken only when a decision is due)."""

    per_replica: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Metric values by pod name and metric key, for the published replicas that answered."""
    pool: Mapping[str, float] = field(default_factory=dict)
    """Pool-level query values by metric key (Prometheus queries)."""
    throughput: Mapping[str, float] = field(default_factory=dict)
    """Requests per second each replica answered between its last two direct scrapes (`demand`'s measure)."""


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile step decides from."""

    name: str
    generation: int
    spec: GenRMPoolSpec
    status: GenRMPoolStatus
    pods: tuple[PodView, ...]
    sidecars: Mapping[str, SidecarView | None] = field(default_factory=dict)
    """Sidecar reports by pod name; None or absent means unreachable (never 'drained')."""
    now: float = 0.0
    child_errors: tuple[str, ...] = ()
    """The API server's messages for writes of the pool's children that failed (the last attempt of each)."""
    metrics: MetricSamples | None = None
    """The autoscaler's samples; None between its decisions (or when it is off)."""
    gpu_products: Mapping[str, str] = field(default_factory=dict)
    """GPU product by node name (the node label nvidia.com/gpu.product), for the nodes of the pool's
    pods that carry it (`placement`)."""
    held: int = 0
    """Requests the activators hold for the pool (it is at zero or waking)."""
    relayed_hints: tuple[DemandHint, ...] = ()
    """Demand hints sent to the pool through the activators."""
    demand_annotation: str | None = None
    """The pool's ``genrm.io/demand`` annotation, as written (a hint as JSON, `genrm_contract.demand`)."""
    children: ObservedChildren | None = None
    """The pool's Secret, Service and PodDisruptionBudget as watched; None: the step plans no
    children (the core tests' world has none)."""
    promote: str = ""
    """The pool's ``genrm.io/promote`` annotation: the judge revision a person promotes (`judgeswitch`)."""
    endpoints: frozenset[str] | None = None
    """The pods the pool Service's EndpointSlices list as ready endpoints (by their ``targetRef``), which
    is what kube-proxy and every client follow (`activation.ready_pods`); None: not watched, and a
    published Ready pod counts as one."""


@dataclass(frozen=True)
class ActivatorView:
    """The activator's pods, as its Service's EndpointSlices show them (`activation`)."""

    addresses: tuple[str, ...]
    """Ready pod IPs."""
    port: int
    """Their traffic port."""


@dataclass(frozen=True)
class ObservedChildren:
    """What the children's decisions need from the shell: the watched objects and the token."""

    pool_uid: str
    namespace: str
    token: str
    """The pool's control token: the Secret's, or the one the shell made while none is watched."""
    objects: Mapping[str, Manifest] = field(default_factory=dict)
    """The pool's children by kind (`childrenplan.select_observed`)."""
    slices: tuple[Manifest, ...] = ()
    """Every watched EndpointSlice of the pool's Service, the controller's included (`activation`)."""
    activator: ActivatorView | None = None
    """The activator, when the operator runs with one; None: scale to zero has nothing to hold requests."""


@dataclass(frozen=True)
class CreatePod:
    """Create the replica pod with this deterministic name and ordinal, required onto nodes of
    ``gpu_product`` when one is pinned (`placement.choose`)."""

    name: str
    ordinal: int
    gpu_product: str = ""


@dataclass(frozen=True)
class DeletePod:
    """Delete a pod, bound to its UID by a precondition.

    `grace_seconds` (when set) replaces the pod's terminationGracePeriodSeconds; it is only used
    for a replica that never served, together with `resource_version` as a second precondition,
    so a pod published after the observation makes the delete fail instead of being cut short.
    """

    name: str
    uid: str
    grace_seconds: int | None = None
    resource_version: str = ""


@dataclass(frozen=True)
class SetPublished:
    """Add or remove the label the pool's Service selects."""

    name: str
    uid: str
    published: bool
    rescue: bool = False
    """A scale-in's victim put back (`scale_in.keep`): it waits for the record like its undrain."""


@dataclass(frozen=True)
class Verify:
    """Run the probe requests on a new replica and compare with a serving reference (if any).

    ``context`` names both replicas with their nodes and GPU products (`placement.verification_context`):
    the verdict's message starts with it, so a mismatch says where each answer came from. It
    describes the probe and is no part of what the probe is (equality, the shell's expectations)."""

    name: str
    uid: str
    reference: str | None
    context: str = field(default="", compare=False)


@dataclass(frozen=True)
class Drain:
    """Ask a sidecar to soft-drain (still admits, not ready) or fence (refuses new requests).

    A fence after a judge switch says so (``reason``, and the revision that serves now: ``active``),
    so the gateway's refusals tell clients the judge changed rather than that a replica is leaving."""

    name: str
    drain_id: str
    phase: DrainPhase
    reason: DrainReason | None = None
    active: str = ""


@dataclass(frozen=True)
class Undrain:
    """Return a draining (not yet drained) sidecar to Serving: the cheapest way to add capacity."""

    name: str
    drain_id: str


@dataclass(frozen=True)
class LabelJudge:
    """Label a pod made before judge revisions with the one it answers (`judgeswitch.label_unlabelled`)."""

    name: str
    uid: str
    judge: str


Action = CreatePod | DeletePod | SetPublished | Verify | Drain | Undrain | LabelJudge


def needs_record(action: Action) -> bool:
    """Whether ``action`` must wait until the step's status write has landed (see `writes_first`).

    Taking a replica away (unpublish, drain, delete) or back (undrain) acts on a decision a crash
    must find: the victims are fixed in status before anything touches them. Every create waits
    too, for another reason: the write is bound to the pool's resourceVersion, so a create decided
    on a spec the watch had not caught up with (replicas 2 -> 6 -> 2, or a template edit racing the
    step) is cancelled by the write's Conflict instead of starting GPU pods the spec no longer
    wants. That holds for a retry as much as for a new create: a retry is decided again, on this
    step's spec (the write that recorded the name landed under an older one). Two actions never
    wait, because the pod itself is theirs: a publish is decided from what the pod shows (ready,
    verified, not a victim) and leaves its label and ever-published annotation on it, so the next
    step counts it as serving whatever the status says (on a stale spec it publishes a replica the
    next step may remove: churn, never a loss); a verification probe decides nothing. Sending these
    beside the write takes the write's round trip out of the wait between a replica's readiness and
    its publication. A victim's publish when a scale-in puts it back (``rescue``) is no such
    publish: it undoes a drain the status recorded, and waits with its undrain."""
    match action:
        case Verify() | SetPublished(published=True, rescue=False) | LabelJudge():
            return False
    return True


def writes_first(before: GenRMPoolStatus, after: GenRMPoolStatus, due: Sequence[Action]) -> bool:
    """Whether the step writes its status before the actions that `needs_record` (``due``: the
    actions it will send).

    It does when the status records new decisions, and when a create is due even if nothing in
    the status changed (a retried create): then the write carries the status as it is, bound to the
    resourceVersion the step decided on, which changes nothing on the API server and exists only
    for its Conflict. Without it a retry decided on a stale spec would go out unchecked. Otherwise
    every action goes beside the write, if any, as it would with no write at all."""
    return after.decisions() != before.decisions() or any(isinstance(a, CreatePod) for a in due)


REPORT_DELAY_SECONDS = 10.0
"""How long counts may go unwritten while an operation runs (`report_waits`)."""


def report_waits(before: GenRMPoolStatus, after: GenRMPoolStatus, waited: float) -> bool:
    """Whether a status that differs from ``before`` (the pool's) only in what it counts can wait
    for the operation's next write instead of being written now; ``waited``: seconds since a step
    first found it unwritten.

    Every write of the pool is decoded, patched, validated, stored, decoded again and sent to each
    watcher by the API server, one event after another, so the watch that brings the next scale
    request to the operator queues behind it. In a scale storm many writes only moved a count
    (figures: docs/performance.md#measurements-behind-the-code): a victim's readiness going as it
    drains, a pod leaving the Current count as it terminates. The operation's next write (its next
    phase, or its end) carries such counts; they get a write of their own once they have waited
    ``REPORT_DELAY_SECONDS``. Nothing else waits: decisions (a crash must find them), a condition's
    status or reason (what alerts and ``kubectl wait`` watch), a new observedGeneration, and
    everything outside an operation, where a count changes because something went wrong."""
    def flags(status: GenRMPoolStatus) -> list[tuple[str, str, str]]:
        return [(c.type, c.status, c.reason) for c in status.conditions]
    return (after.operation is not None and waited < REPORT_DELAY_SECONDS
            and after.decisions() == before.decisions()
            and after.observed_generation == before.observed_generation and flags(after) == flags(before))


def unwritten_since(before: GenRMPoolStatus, after: GenRMPoolStatus, first: bool, since: float | None,
                    now: float) -> float | None:
    """Since when the counts a step leaves unwritten (`report_waits`) have waited, or None when the
    step writes its status (``first``: it `writes_first`) or has nothing to write; ``since`` is the
    last step's answer. The shell keeps it between steps, and so does the core world."""
    start = now if since is None else since
    if after != before and not first and report_waits(before, after, now - start):
        return start
    return None


@dataclass(frozen=True)
class Delivery:
    """How one step's status write and actions go out (`deliver`): the one write-then-act rule,
    followed by the shell and by the core tests' simulated world alike."""

    write: bool
    """Write the status this step (bound to the resourceVersion the step decided on)."""
    beside: tuple[Action, ...]
    """Actions sent beside the write, and sent even when the write is refused."""
    after: tuple[Action, ...]
    """Actions sent only once the write landed (none when nothing waits for a record)."""
    unwritten_since: float | None
    """The `unwritten_since` to keep for the next step."""
    actions: tuple[Action, ...] = ()
    """All of the plan's actions, in its order."""
    gates: bool = False
    """Actions wait for the write (`gates_actions`): the shell sends it before other pools' records."""

    def sent(self, written: bool) -> tuple[Action, ...]:
        """Every action that goes out, in the plan's order: all of them once the write landed (or
        when there was none to land), only those `beside` it when it was refused."""
        return self.actions if written else self.beside


def deliver(before: GenRMPoolStatus, plan: Plan, since: float | None, now: float,
            due: Sequence[Action] | None = None) -> Delivery:
    """The write-then-act rule of one step: whether its status is written, and which of its actions
    wait for that write.

    The status is written first when it records new decisions or a create is due (`writes_first`,
    judged on ``due``: the actions that will actually be sent, all of ``plan.actions`` unless the
    caller holds some back as just done), and then the actions that `needs_record` wait for it;
    every other action goes beside the write. A changed status is written too, unless it only
    moved counts that can wait for the operation's next write (`report_waits`, tracked by
    ``since``: the last step's `Delivery.unwritten_since`)."""
    first = writes_first(before, plan.status, plan.actions if due is None else due)
    waiting = unwritten_since(before, plan.status, first, since, now)
    beside = tuple(a for a in plan.actions if not (first and needs_record(a)))
    after = tuple(a for a in plan.actions if first and needs_record(a))
    return Delivery(write=(plan.status != before or first) and waiting is None, beside=beside, after=after,
                    unwritten_since=waiting, actions=tuple(plan.actions),
                    gates=gates_actions(before, plan.status, after))


def gates_actions(before: GenRMPoolStatus, after: GenRMPoolStatus, waiting: Sequence[Action]) -> bool:
    """Whether actions wait for a status write: this step's (``waiting``), or the next step's, which
    acts on what the write records first: a new operation, new victims (unpublished once recorded),
    new creates or a promoted judge revision (the Service's move and the fence). The operation's other
    writes (a create seen, a phase, its end) record what was done; nothing waits for them
    (`shell.writeorder` sends them after the writes that gate)."""
    if waiting:
        return True
    if (before.judge and before.judge.active) != (after.judge and after.judge.active):
        return True
    old, new = before.operation, after.operation
    if new is None:
        return False
    if old is None or old.id != new.id:
        return True
    return bool({v.name for v in new.victims} - {v.name for v in old.victims}
                or {a.name for a in new.added_pods} - {a.name for a in old.added_pods})


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: Literal["Normal", "Warning"]
    reason: EventReason
    message: str


@dataclass(frozen=True)
class Plan:
    """The result of one reconcile step: write ``status`` first, then run ``actions`` (those that
    `needs_record` after the write when it `writes_first`, the others beside it).

    ``decision`` is the autoscaler's, when one was due: after the status write the shell
    writes its count through the scale subresource when ``decision.apply`` says so."""

    status: GenRMPoolStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    decision: Decision | None = None
    children: tuple[ChildAction, ...] = ()
    """The children's decisions, in the order Secret, Service, PodDisruptionBudget (KubeRay's ordered
    ``reconcileFuncs``): carried out before the pod actions, beside the status write (they record
    nothing), their refusals reported by the next step like refused pod actions."""

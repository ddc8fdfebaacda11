"""The per-pool single writer: observe, decide (pure core), write status, act.

One :class:`PoolReconciler` runs inside one kopf daemon per pool: the loop
(scheduling, echo suppression, back-off of failed steps) around four parts, the
observer (`observer.PoolObserver`), the children applier
(`children_apply.ChildrenApplier`), the pure core and the executor
(`executor.Executor`). Each step
reads the pool and its pods as the watch shows them (`PoolObserver.read_pool`) and the
sidecars' latest drain states from their long polls (`sidecarwatch`), calls
:func:`reconcile`, writes the status with optimistic concurrency and, when that
write records decisions or a create is due, only then carries out the actions that
take replicas away or back or create them (otherwise they run beside it, as
publishes and verification probes always do: see `core.model.deliver`).
A crash anywhere is safe: the next step (or the next operator process) recomputes
from observations and repeats idempotent actions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from genrm_contract.activator import pool_key
from genrm_contract.demand import DEMAND_ANNOTATION
from kubernetes.client.exceptions import ApiException

from ..api.pool import GenRMPoolStatus
from ..autoscaling.demand import is_new
from ..core import activation
from ..core.autoscale import reported_hints
from ..core.childrenplan import CHILD_FAILED
from ..core.judgeswitch import pinned_judge, told_revisions
from ..core.model import REPORT_DELAY_SECONDS, Event, Observed, deliver
from ..core.names import PROMOTE_ANNOTATION
from ..core.peers import peer_lists
from ..core.reconcile import reconcile
from ..core.retry import Failure, Failures, failed_status
from . import metrics
from .activators import ActivatorFleet
from .autoscaler import PoolAutoscaler
from .balancer import PoolBalancer
from .children_apply import ChildrenApplier, ChildSource
from .executor import EventPoster, Executor
from .kube import Conflict, Kube, api_message
from .observe import pod_ip
from .observer import PodSource, PoolObserver, PoolSource, ProductSource, no_products
from .peers import PeerPusher
from .revisions import RevisionTeller
from .sidecar import Endpoint, SidecarClient
from .sidecarwatch import SidecarWatch

log = logging.getLogger(__name__)
ACTIVE_RESYNC_SECONDS = 1.0
IDLE_RESYNC_SECONDS = 10.0
REPORTED_CHILD_ERRORS = 10
"""At most this many refusals go into the Degraded message and events: many pods refused for one
reason would otherwise repeat it past the condition's message limit."""


class PoolReconciler:
    """Reconciles one pool until its daemon is stopped."""

    def __init__(self, kube: Kube, sidecars: SidecarClient, post_event: EventPoster,
                 namespace: str, name: str, pods: PodSource, children: ChildSource, watched: PoolSource,
                 products: ProductSource = no_products, activators: ActivatorFleet | None = None) -> None:
        self.kube, self.sidecars, self.post_event = kube, sidecars, post_event
        self.activators = activators
        """The operator's activators, when it runs with them (scale from zero)."""
        self.observer = PoolObserver(kube, namespace, name, pods, watched, products)
        self.applier = ChildrenApplier(kube, namespace, name, children)
        self._rewritten = False
        """The last step wrote the status and had nothing else to do."""
        self._wake_on_echo = False
        """The watch showing the last status write wakes the next step (see `run`)."""
        self.namespace, self.name = namespace, name
        self.wake = asyncio.Event()
        self.autoscaler = PoolAutoscaler(kube, namespace, name)
        self.balancer = PoolBalancer(sidecars, namespace, name)
        self.watch = SidecarWatch(sidecars, self.wake.set)
        self.peers = PeerPusher(sidecars)
        self.revisions = RevisionTeller(sidecars)
        self.executor = Executor(kube, sidecars, post_event, namespace, name,
                                 lambda pod, document: self.watch.offer(pod, document))
        self._unwritten_since: float | None = None
        """Since when (monotonic) the status has had counts no write carried (`report_waits`)."""
        self.failures = Failures()
        """The steps that failed in a row (`core.retry`): their back-off, log lines and condition."""
        self._stage = "read"
        """The part of the running step, for a failure's log line and condition."""

    async def run(self, stopped: Callable[[], bool]) -> None:
        """Step until stopped; woken early by pool and pod events."""
        metrics.start_pool(self.namespace, self.name)
        metrics.ACTIVE_POOLS.inc()
        try:
            again = False
            while not stopped():
                # Cleared before the step: an event during it (the echo of this step's pod patch,
                # another writer's change) runs the next step at once instead of after the resync.
                self.wake.clear()
                busy = await self.guarded_step()
                # A step that only wrote the status (the victims of a scale-in, say) is followed at
                # once by the step its write enables, on the write's answer, instead of after the
                # watch's echo of that write. Once per wake: a status that changed at every step
                # must not turn into a loop of writes.
                again = not again and self._rewritten
                if again:
                    continue
                if self._rewritten:
                    self._await_echo()
                try:
                    resync = ACTIVE_RESYNC_SECONDS if busy else IDLE_RESYNC_SECONDS
                    due = min(resync, self.autoscaler.seconds_until_due(), self.report_due())
                    # A failed step is retried after its back-off, whatever else seemed due; an event
                    # still wakes the next step at once.
                    await asyncio.wait_for(self.wake.wait(), self.failures.delay if self.failures.count else due)
                except TimeoutError:
                    pass
        finally:
            metrics.ACTIVE_POOLS.dec()
            await self.balancer.close()
            await self.peers.close()
            await self.revisions.close()
            await self.watch.close()
            await self.autoscaler.close()

    def report_due(self) -> float:
        """Seconds until the counts no write has carried must be written (`report_waits`)."""
        if self._unwritten_since is None:
            return math.inf
        return max(0.0, self._unwritten_since + REPORT_DELAY_SECONDS - time.monotonic())

    def pool_changed(self, version: str) -> None:
        """The watch shows the pool at ``version``: wake, unless that is this process's own last status
        write coming back.

        The step that made that write already decided on its answer (`read_pool`), and what it
        set going wakes the reconciler by itself: pod events for creates and label patches, the
        sidecars' long polls for drains, the resync for time passing. In a scale storm these
        echoes were a large share of all steps (figures: docs/performance.md#measurements-behind-the-code).
        The exception is a write no step followed (`_await_echo`)."""
        written = self.observer.written
        if (written is None or not version or self._wake_on_echo
                or written["metadata"].get("resourceVersion") != version):
            self.wake.set()

    def _await_echo(self) -> None:
        """A second step in a row that only wrote the status (an operation finished, the next one's
        victims recorded) gets no immediate follow-up: the watch's echo of its write wakes the next
        step instead, so a status that changes at every step loops no faster than the watch, and a
        real second decision waits for the echo, not for the resync. The echo may have come in
        while the step ran; then the next step runs at once."""
        self._wake_on_echo = True
        seen, written = self.observer.watched(), self.observer.written
        if seen is not None and written is not None and \
                seen["metadata"].get("resourceVersion") == written["metadata"].get("resourceVersion"):
            self.wake.set()

    async def guarded_step(self) -> bool:
        """One step with metrics; a failure is logged in one line and retried after its back-off
        (`core.retry`), and a repeated one shows in the status."""
        started = time.monotonic()
        result = "success"
        self._rewritten = self._wake_on_echo = False
        self._stage = "read"
        try:
            busy = await self.step()
            self.failures = Failures()
            return busy
        except Conflict:
            result = "conflict"
            self.observer.refresh = True
            self.wake.set()
            return True
        except Exception as exc:
            result = "error"
            # Counts left for later are not overdue for a step that failed: with them due, `run`
            # would step again at once, not after the back-off, for as long as the error lasts.
            self._unwritten_since = None
            metrics.RECONCILE_ERRORS.labels(self.namespace, self.name).inc()
            await self.failed(exc)
            return True
        finally:
            metrics.RECONCILE_TOTAL.labels(self.namespace, self.name, result).inc()
            metrics.RECONCILE_SECONDS.labels(self.namespace, self.name).observe(time.monotonic() - started)

    async def failed(self, exc: Exception) -> None:
        """Log a failed step in one line with its context, its traceback only the first time that stage
        fails with that error in a row (else at debug), and from the `REPEATED_FAILURES`-th failure on
        write condition ReconcileFailed (best effort: the failure may be the status write itself)."""
        text = api_message(exc) if isinstance(exc, ApiException) else str(exc)
        failure = Failure(self._stage, type(exc).__name__, " ".join(text.split()))
        new = self.failures.is_new(failure)
        self.failures = self.failures.failed(failure, time.time())
        log.warning("reconcile of %s/%s failed in stage %s (%d in a row, retry in %gs): %s: %s", self.namespace,
                    self.name, failure.stage, self.failures.count, self.failures.delay, failure.error,
                    failure.message, exc_info=exc if new else None)
        if not new:
            log.debug("reconcile of %s/%s: traceback", self.namespace, self.name, exc_info=exc)
        pool = self.observer.latest()
        if pool is None or not self.failures.repeated:
            return
        try:
            status = GenRMPoolStatus.model_validate(pool.get("status") or {})
            shown = failed_status(status, self.failures, int(pool["metadata"].get("generation", 0)), time.time())
            if shown is not status:
                self.observer.written = await self.kube.write_status(pool, shown.to_wire())
        except Exception as write_exc:  # the step's own failure is what was reported
            log.debug("condition ReconcileFailed of %s/%s not written: %s", self.namespace, self.name, write_exc)

    async def step(self) -> bool:
        """Observe, decide, write status, act. Returns True while work is in progress."""
        pool = await self.observer.read_pool()
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            self._unwritten_since = None
            self.balancer.follow({}, {})  # nothing published any more: the balancer goes idle
            return False
        meta = pool["metadata"]
        spec, status = self.observer.parse(pool)
        self._stage = "observe"
        children = self.applier.observe(meta["uid"])
        child_errors = (*self.applier.errors, *self.executor.errors.values())[:REPORTED_CHILD_ERRORS]
        pods = self.observer.pods()
        endpoints = {
            p["metadata"]["name"]: Endpoint(ip, spec.gateway.control_port, self.applier.token or "")
            for p in pods if (ip := pod_ip(p)) and not p["metadata"].get("deletionTimestamp")
        }
        views = self.observer.pod_views(pods)
        sidecars = await self.watch.views(endpoints)
        annotations = meta.get("annotations") or {}
        annotation = annotations.get(DEMAND_ANNOTATION)
        key = pool_key(self.namespace, self.name)
        held = self.activators.held(key) if self.activators is not None else 0
        relayed = self.activators.hints(key) if self.activators is not None else ()
        if self.activators is not None:
            children = dataclasses.replace(children, activator=self.activators.view(key))
        observed = Observed(
            name=self.name, generation=int(meta.get("generation", 0)), spec=spec, status=status,
            pods=views, sidecars=sidecars, now=time.time(), child_errors=child_errors, demand_annotation=annotation,
            gpu_products=self.observer.products({v.node for v in views if v.node}), children=children, held=held,
            relayed_hints=relayed, endpoints=activation.ready_pods(self.name, children.slices),
            promote=str(annotations.get(PROMOTE_ANNOTATION, "")),
        )
        # What the pool's clients reach: a preview's published replicas are not theirs to balance or scale.
        pin = pinned_judge(observed)
        published = [v.name for v in views if v.published and not v.deleting and pin in (None, v.judge)]
        # A hint not seen before, or a request held at zero, makes the decision due now: the load is
        # on its way, or already here.
        due = is_new(status.autoscaler, reported_hints(observed)[0]) or (held > 0 and spec.replicas == 0)
        samples = await self.autoscaler.sample(spec.autoscaling, published, endpoints, now=due)
        observed = dataclasses.replace(observed, metrics=samples)
        if self.activators is not None:
            await self.activators.push(key, activation.pool_route(observed))
        self._stage = "decide"
        plan = reconcile(observed)
        self.balancer.follow({n: endpoints[n] for n in published if n in endpoints}, self.watch.documents())
        self.peers.follow(peer_lists(observed, {n: e.ip for n, e in endpoints.items()}), endpoints,
                          self.watch.documents())
        self.revisions.follow(told_revisions(observed), endpoints, self.watch.documents())
        version = str(meta.get("resourceVersion", ""))
        # The write-then-act rule is the core's (`deliver`), the one the core tests' world follows.
        now = time.monotonic()
        delivery = deliver(status, plan, self._unwritten_since, now,
                           due=[a for a in plan.actions if self.executor.expected.due(a, now)])
        # The children first, in their order (the Secret holds the token pods start with), then the
        # pod actions beside and after the status write. The last step's refusals are in this
        # status; this step's are collected anew.
        self._stage = "children"
        await self.applier.carry_out(plan.children, meta["uid"])
        self._stage = "write"
        self._unwritten_since = delivery.unwritten_since
        self.executor.errors = {}
        acting = asyncio.gather(*(self.executor.carry_out(a, meta["uid"], spec, endpoints) for a in delivery.beside))
        try:
            if delivery.write:
                self.observer.written = await self.kube.write_status(pool, plan.status.to_wire(),
                                                                     gating=delivery.gates)
                version = str(self.observer.written["metadata"]["resourceVersion"])
                self._rewritten = not plan.actions
        finally:
            await acting  # never raises: carry_out logs failures
        self._stage = "events"
        self.autoscaler.committed(plan.decision)
        metrics.observe_finished(self.namespace, self.name,
                                 [h for h in plan.status.history if h not in status.history])
        metrics.observe_status(self.namespace, self.name, spec, plan.status)
        failures = tuple(Event("Warning", CHILD_FAILED, message) for message in child_errors)
        for event in (*plan.events, *failures, *await self.autoscaler.actuate(plan.decision, version)):
            await self.executor.emit(pool, event)
        self._stage = "act"
        await asyncio.gather(*(self.executor.carry_out(a, meta["uid"], spec, endpoints) for a in delivery.after))
        return plan.status.operation is not None or bool(plan.actions)

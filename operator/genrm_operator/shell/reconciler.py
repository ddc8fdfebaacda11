"""The per-pool single writer: observe, decide (pure core), write status, act.

One :class:`PoolReconciler` runs inside one kopf daemon per pool. Each step
reads the pool and its pods fresh from the API server, asks the sidecars for
their drain state, calls :func:`reconcile`, writes the status with optimistic
concurrency and only then carries out the actions. A crash anywhere is safe:
the next step (or the next operator process) recomputes from observations and
repeats idempotent actions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from genrm_contract.sidecar import DrainRequest, Phase, UndrainRequest

from ..api.pool import GenRMPoolSpec, GenRMPoolStatus
from ..core import children
from ..core.model import (
    Action,
    CreatePod,
    DeletePod,
    Drain,
    Event,
    Observed,
    SetPublished,
    Undrain,
    Verify,
)
from ..core.names import (
    EVER_PUBLISHED_ANNOTATION,
    PUBLISHED_LABEL,
    VERIFICATION_ANNOTATION,
    VERIFICATION_MESSAGE_ANNOTATION,
    secret_name,
)
from ..core.reconcile import reconcile
from . import metrics
from .autoscaler import PoolAutoscaler
from .kube import Conflict, Kube, Manifest
from .observe import pod_ip, pod_view
from .sidecar import Endpoint, SidecarClient, compare

log = logging.getLogger(__name__)
ACTIVE_RESYNC_SECONDS = 1.0
IDLE_RESYNC_SECONDS = 10.0
EVENT_DEDUP_SECONDS = 60.0
EventPoster = Callable[[Manifest, Event], Awaitable[None]]
PodSource = Callable[[], list[Manifest]]
"""The pool's pods as the watch last showed them (kopf's pod index): no LIST per step.

The index may lag the operator's own writes by an event; that is safe because pod
names are deterministic (a repeated create is AlreadyExists) and every action is
idempotent and bound to a pod UID."""


class PoolReconciler:
    """Reconciles one pool until its daemon is stopped."""

    def __init__(self, kube: Kube, sidecars: SidecarClient, post_event: EventPoster,
                 namespace: str, name: str, pods: PodSource) -> None:
        self.kube, self.sidecars, self.post_event, self.pods = kube, sidecars, post_event, pods
        self.namespace, self.name = namespace, name
        self.wake = asyncio.Event()
        self._recent_events: dict[tuple[str, str], float] = {}
        self._token: str | None = None
        self.autoscaler = PoolAutoscaler(kube, namespace, name)

    async def run(self, stopped: Callable[[], bool]) -> None:
        """Step until stopped; woken early by pool and pod events."""
        metrics.start_pool(self.namespace, self.name)
        metrics.ACTIVE_POOLS.inc()
        try:
            while not stopped():
                busy = await self.guarded_step()
                self.wake.clear()
                try:
                    resync = ACTIVE_RESYNC_SECONDS if busy else IDLE_RESYNC_SECONDS
                    await asyncio.wait_for(self.wake.wait(), min(resync, self.autoscaler.seconds_until_due()))
                except TimeoutError:
                    pass
        finally:
            metrics.ACTIVE_POOLS.dec()
            await self.autoscaler.close()

    async def guarded_step(self) -> bool:
        """One step with metrics; errors are logged and retried at the next resync."""
        started = time.monotonic()
        result = "success"
        try:
            return await self.step()
        except Conflict:
            result = "conflict"
            self.wake.set()
            return True
        except Exception:
            result = "error"
            metrics.RECONCILE_ERRORS.labels(self.namespace, self.name).inc()
            log.exception("reconcile of %s/%s failed", self.namespace, self.name)
            return True
        finally:
            metrics.RECONCILE_TOTAL.labels(self.namespace, self.name, result).inc()
            metrics.RECONCILE_SECONDS.labels(self.namespace, self.name).observe(time.monotonic() - started)

    async def step(self) -> bool:
        """Observe, decide, write status, act. Returns True while work is in progress."""
        pool = await self.kube.get_pool(self.namespace, self.name)
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            return False
        meta = pool["metadata"]
        spec = GenRMPoolSpec.model_validate(pool.get("spec") or {})
        status = GenRMPoolStatus.model_validate(pool.get("status") or {})
        await self.ensure_children(meta["uid"], spec)
        pods = self.pods()
        endpoints = {
            p["metadata"]["name"]: Endpoint(ip, spec.gateway.port, spec.gateway.control_port, self._token or "")
            for p in pods if (ip := pod_ip(p)) and not p["metadata"].get("deletionTimestamp")
        }
        observed = Observed(
            name=self.name, generation=int(meta.get("generation", 0)), spec=spec, status=status,
            pods=tuple(pod_view(p) for p in pods), sidecars=await self.sidecars.states(endpoints),
            now=time.time(),
        )
        plan = reconcile(observed)
        scaling = await self.autoscaler.turn(observed, endpoints)
        plan = replace(plan, status=scaling.applied_to(plan.status))
        version = str(meta.get("resourceVersion", ""))
        if plan.status != status:
            version = await self.kube.replace_status(pool, plan.status.to_wire())
        self.autoscaler.committed(scaling)
        metrics.observe_finished(self.namespace, self.name,
                                 [h for h in plan.status.history if h not in status.history])
        metrics.observe_status(self.namespace, self.name, spec, plan.status)
        for event in (*plan.events, *await self.autoscaler.actuate(scaling, version)):
            await self.emit(pool, event)
        await asyncio.gather(*(self.carry_out(a, meta["uid"], spec, endpoints) for a in plan.actions))
        return plan.status.operation is not None or bool(plan.actions)

    async def ensure_children(self, pool_uid: str, spec: GenRMPoolSpec) -> None:
        """Secret (token), Service and PDB: created once, owned by the pool."""
        ns, name = self.namespace, self.name
        if self._token is None:
            self._token = await self.kube.control_token(
                ns, secret_name(name), lambda token: children.secret_manifest(name, pool_uid, ns, token))
            await self.kube.create(children.service_manifest(name, pool_uid, ns, spec))
            if spec.disruption_budget.enabled:
                await self.kube.create(children.pdb_manifest(name, pool_uid, ns, spec))

    async def emit(self, pool: Manifest, event: Event) -> None:
        """Post an event unless the same one was posted within the dedup window."""
        key, now = (event.reason, event.message), time.monotonic()
        if now - self._recent_events.get(key, -EVENT_DEDUP_SECONDS) < EVENT_DEDUP_SECONDS:
            return
        self._recent_events = {k: t for k, t in self._recent_events.items() if now - t < EVENT_DEDUP_SECONDS}
        self._recent_events[key] = now
        await self.post_event(pool, event)

    async def carry_out(self, action: Action, pool_uid: str, spec: GenRMPoolSpec,
                        endpoints: dict[str, Endpoint]) -> None:
        """Run one idempotent action; failures are logged and the next step retries."""
        ns = self.namespace
        try:
            match action:
                case CreatePod(name=name, ordinal=ordinal):
                    await self.kube.create(children.pod_manifest(self.name, pool_uid, ns, spec, name, ordinal))
                case DeletePod(name=name, uid=uid, grace_seconds=grace, resource_version=rv):
                    await self.kube.delete_pod(ns, name, uid, grace, rv)
                case SetPublished(name=name, uid=uid, published=published):
                    annotations = {EVER_PUBLISHED_ANNOTATION: "true"} if published else {}
                    await self.kube.patch_pod_meta(ns, name, uid, {PUBLISHED_LABEL: str(published).lower()},
                                                   annotations)
                case Drain(name=name, drain_id=drain_id, phase=phase) if name in endpoints:
                    await self.sidecars.drain(endpoints[name], DrainRequest(
                        drain_id=drain_id, phase=Phase(phase), quiet_seconds=spec.drain.quiet_seconds))
                case Undrain(name=name, drain_id=drain_id) if name in endpoints:
                    await self.sidecars.undrain(endpoints[name], UndrainRequest(drain_id=drain_id))
                case Verify(name=name, uid=uid, reference=reference) if name in endpoints and (
                        reference is None or reference in endpoints):
                    await self.verify(spec, name, uid, endpoints[name],
                                      endpoints.get(reference) if reference else None)
                case _:
                    log.debug("skipped %s: no endpoint yet (retried next step)", action)
        except Exception:
            log.exception("action %s on %s/%s failed", action, ns, self.name)

    async def verify(self, spec: GenRMPoolSpec, name: str, uid: str, candidate: Endpoint,
                     reference: Endpoint | None) -> None:
        """Probe the new replica (and the reference) and record the verdict on the pod."""
        mine = await self.sidecars.answers(candidate, spec.verification)
        theirs = await self.sidecars.answers(reference, spec.verification) if reference else None
        passed, message = compare(mine, theirs)
        if not passed:
            metrics.VERIFICATION_FAILURES.labels(self.namespace, self.name).inc()
        await self.kube.patch_pod_meta(self.namespace, name, uid, {}, {
            VERIFICATION_ANNOTATION: "passed" if passed else "failed",
            VERIFICATION_MESSAGE_ANNOTATION: message,
        })

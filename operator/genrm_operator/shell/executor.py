"""The executor of one pool's decisions: pod actions and events, carried out for the reconcile loop.

Every action is idempotent and bound to a pod UID; one the watch has not shown done yet is not
sent again for a while (`expectations`). The API server's refusals are kept for the next step,
which reports them in the pool's status (`Observed.child_errors`) like a refused child write.
Events are posted once per reason and message within ``EVENT_DEDUP_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from genrm_contract.sidecar import DrainPhase, DrainRequest, StateDocument, UndrainRequest
from kubernetes.client.exceptions import ApiException

from ..api.pool import GenRMPoolSpec
from ..core import children
from ..core.childrenplan import ChildAction, CreateChild, DeleteChild, ForeignChild, PatchChild
from ..core.model import Action, CreatePod, DeletePod, Drain, Event, LabelJudge, SetPublished, Undrain, Verify
from ..core.names import (
    EVER_PUBLISHED_ANNOTATION,
    JUDGE_REVISION_LABEL,
    PUBLISHED_LABEL,
    VERIFICATION_ANNOTATION,
    VERIFICATION_MESSAGE_ANNOTATION,
)
from . import metrics
from .expectations import Expectations
from .kube import Kube, Manifest, api_message
from .sidecar import Endpoint, SidecarClient, compare

log = logging.getLogger(__name__)
EVENT_DEDUP_SECONDS = 60.0
EventPoster = Callable[[Manifest, Event], Awaitable[None]]
Offer = Callable[[str, StateDocument], None]
"""Hands a sidecar's answer to the pool's sidecar watch (`SidecarWatch.offer`)."""


class Executor:
    """Carries out one pool's pod actions and posts its events."""

    def __init__(self, kube: Kube, sidecars: SidecarClient, post_event: EventPoster, namespace: str, name: str,
                 offer: Offer) -> None:
        self.kube, self.sidecars, self.post_event, self.offer = kube, sidecars, post_event, offer
        self.namespace, self.name = namespace, name
        self.expected = Expectations()
        self.errors: dict[Action, str] = {}
        """The API server's refusals of the last step's actions, reported by the next step."""
        self._recent_events: dict[tuple[str, str], float] = {}

    async def carry_out(self, action: Action, pool_uid: str, spec: GenRMPoolSpec,
                        endpoints: dict[str, Endpoint]) -> None:
        """Run one idempotent action unless it was just done (`expectations`); failures are logged
        and the next step retries."""
        ns = self.namespace
        if not self.expected.due(action, time.monotonic()):
            return
        try:
            match action:
                case CreatePod(name=name, ordinal=ordinal, gpu_product=product):
                    await self.kube.create(children.pod_manifest(self.name, pool_uid, ns, spec, name, ordinal, product))
                case DeletePod(name=name, uid=uid, grace_seconds=grace, resource_version=rv):
                    await self.kube.delete_pod(ns, name, uid, grace, rv)
                case SetPublished(name=name, uid=uid, published=published):
                    annotations = {EVER_PUBLISHED_ANNOTATION: "true"} if published else {}
                    await self.kube.patch_pod_meta(ns, name, uid, {PUBLISHED_LABEL: str(published).lower()},
                                                   annotations)
                case LabelJudge(name=name, uid=uid, judge=judge):
                    await self.kube.patch_pod_meta(ns, name, uid, {JUDGE_REVISION_LABEL: judge}, {})
                case Drain(name=name, drain_id=drain_id, phase=phase, reason=reason,
                           active=active) if name in endpoints:
                    self.reported(name, await self.sidecars.drain(endpoints[name], DrainRequest(
                        drain_id=drain_id, phase=DrainPhase(phase), quiet_seconds=spec.drain.quiet_seconds,
                        reason=reason, active_revision=active or None)))
                case Undrain(name=name, drain_id=drain_id) if name in endpoints:
                    self.reported(name, await self.sidecars.undrain(endpoints[name], UndrainRequest(drain_id=drain_id)))
                case Verify(name=name, uid=uid, reference=reference, context=context) if name in endpoints and (
                        reference is None or reference in endpoints):
                    await self.verify(spec, name, uid, endpoints[name],
                                      endpoints.get(reference) if reference else None, context)
                case _:
                    log.debug("skipped %s: no endpoint yet (retried next step)", action)
                    return
            self.expected.done(action, time.monotonic())
        except ApiException as exc:
            self.errors[action] = f"{target(action)}: {api_message(exc)}"
            log.warning("action %s on %s/%s refused: %s", action, ns, self.name, api_message(exc))
        except Exception:
            log.exception("action %s on %s/%s failed", action, ns, self.name)

    def reported(self, name: str, document: StateDocument | None) -> None:
        """A drain call's answer is the sidecar's newest state: the next step must not act on an older one."""
        if document is not None:
            self.offer(name, document)

    async def verify(self, spec: GenRMPoolSpec, name: str, uid: str, candidate: Endpoint,
                     reference: Endpoint | None, context: str) -> None:
        """Probe the new replica (and the reference) and record the verdict on the pod, after
        ``context`` (both replicas' nodes and GPU products)."""
        if reference is None:
            mine, theirs = await self.sidecars.answers(candidate, spec.verification), None
        else:
            mine, theirs = await asyncio.gather(self.sidecars.answers(candidate, spec.verification),
                                                self.sidecars.answers(reference, spec.verification))
        passed, message = compare(mine, theirs)
        if not passed:
            metrics.VERIFICATION_FAILURES.labels(self.namespace, self.name).inc()
        await self.kube.patch_pod_meta(self.namespace, name, uid, {}, {
            VERIFICATION_ANNOTATION: "passed" if passed else "failed",
            VERIFICATION_MESSAGE_ANNOTATION: f"{context}: {message}" if context else message,
        })

    async def emit(self, pool: Manifest, event: Event) -> None:
        """Post an event unless the same one was posted within the dedup window."""
        key, now = (event.reason, event.message), time.monotonic()
        if now - self._recent_events.get(key, -EVENT_DEDUP_SECONDS) < EVENT_DEDUP_SECONDS:
            return
        self._recent_events = {k: t for k, t in self._recent_events.items() if now - t < EVENT_DEDUP_SECONDS}
        self._recent_events[key] = now
        await self.post_event(pool, event)


def target(action: Action | ChildAction) -> str:
    """``Pod judge-3`` or ``Service judge``: which child an error message is about."""
    match action:
        case CreateChild(manifest=manifest):
            return f"{manifest['kind']} {manifest['metadata']['name']}"
        case PatchChild(kind=kind, name=name) | DeleteChild(kind=kind, name=name) | ForeignChild(kind=kind, name=name):
            return f"{kind} {name}"
        case _:
            return f"Pod {action.name}"

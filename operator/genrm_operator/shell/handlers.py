"""kopf wiring: one daemon per pool as the only writer, woken by pool and pod events.

Nothing here decides anything: decisions live in ``genrm_operator.core``.
Scale operations never use on.create/on.update (edge-based); the daemon
reconciles levels and a periodic resync catches anything a watch missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf

from ..api.pool import GROUP, PLURAL, VERSION
from ..core.model import Event
from ..core.names import POOL_LABEL
from ..core.placement import GPU_PRODUCT_LABEL
from . import metrics
from .activators import ActivatorFleet
from .kube import Kube, Manifest, load_config
from .reconciler import PoolReconciler
from .sidecar import SidecarClient

log = logging.getLogger(__name__)
RECONCILERS: dict[tuple[str, str], PoolReconciler] = {}
ENDPOINT_SLICES = ("discovery.k8s.io", "v1", "endpointslices")
CHILD_RESOURCES = [("", "v1", "pods"), ("", "v1", "services"), ("", "v1", "secrets"),
                   ("policy", "v1", "poddisruptionbudgets"), ENDPOINT_SLICES]
"""(group, version, plural) of the children the operator watches. The EndpointSlice controller copies a
Service's labels onto its slices, so the pool label selects the pools' slices too."""
NODES = ("", "v1", "nodes")


@dataclass(frozen=True)
class ActivatorConfig:
    """``--activator-service``: the activator's Service and the token of its control port."""

    namespace: str
    service: str
    token: str


ACTIVATOR: list[ActivatorConfig] = []
"""Set once by `use_activator` before kopf starts; empty: no activator (pools at zero refuse)."""


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: the operator has no create/update/delete handlers, the only ones that use it.

    kopf builds the "essence" of every watched object at every event (a deep copy of the whole
    body) to diff it against the stored one; profiled in a scale storm, that was a sizeable share of
    the operator's CPU, for diffs nothing read (figures: docs/performance.md#measurements-behind-the-code).
    Old and new essence are both empty here, so kopf sees no change in any object and stores
    nothing on it."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Operator-wide settings and shared clients."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.reporting_component = "genrm-operator"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.peering.standalone = True
    settings.scanning.disabled = True
    # kopf filters handlers by labels on its side: without a selector the API server would stream
    # every pod and Secret in scope to the operator. Children carry the pool label; ask for it there.
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = POOL_LABEL
    # Only nodes GPU feature discovery labelled matter to placement: the others are never streamed.
    settings.watching.label_selectors[NODES] = GPU_PRODUCT_LABEL
    load_config()
    memo.kube = Kube()
    memo.sidecars = SidecarClient()
    memo.activators = None
    memo.activator_task = None
    if ACTIVATOR:
        config = ACTIVATOR[0]
        memo.activators = ActivatorFleet(memo.kube, config.namespace, config.service, config.token, _wake_pool)
        memo.activator_task = asyncio.ensure_future(memo.activators.run())


def _wake_pool(key: str | None) -> None:
    """Wake one pool's reconciler (``namespace/name``), or every one's (None)."""
    for (namespace, name), reconciler in RECONCILERS.items():
        if key is None or key == f"{namespace}/{name}":
            reconciler.wake.set()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    """Close the shared HTTP clients."""
    if memo.activator_task is not None:
        memo.activator_task.cancel()
    await memo.sidecars.close()
    await memo.kube.close()


async def post_event(pool: Manifest, event: Event) -> None:
    """A Kubernetes Event on the pool (kubectl describe shows them)."""
    kopf.event(cast(kopf.Body, pool), type=event.type, reason=event.reason, message=event.message.replace("\n", " "))


def _metadata(body: kopf.Body) -> Manifest:
    """An object's metadata without ``managedFields``, which nothing here reads and which is most of
    the metadata's objects: the indexes hold every pod of every pool, and Python's full garbage
    collections walk all of them."""
    return {key: value for key, value in (body.get("metadata") or {}).items() if key != "managedFields"}


@kopf.index("", "v1", "pods", labels={POOL_LABEL: kopf.PRESENT})
async def pods_by_pool(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                       **_: Any) -> dict[tuple[str, str], Manifest]:
    """The pods of each pool, kept current by the pod watch (metadata and status only)."""
    return {(namespace or "default", labels[POOL_LABEL]): {
        "metadata": _metadata(body), "spec": {"nodeName": (body.get("spec") or {}).get("nodeName")},
        "status": dict(body.get("status") or {}),
    }}


async def gpu_products(name: str, labels: Mapping[str, str], **_: Any) -> dict[str, str]:
    """Each labelled node's GPU product (GPU feature discovery's nvidia.com/gpu.product), for placement."""
    return {name: labels[GPU_PRODUCT_LABEL]}


def watch_gpu_products() -> None:
    """Register the node index placement reads (`gpu_products`).

    Not a decorator: kopf starts no handler before every index has listed its objects, so a
    ServiceAccount that may not list nodes would stop the whole operator. ``--no-gpu-placement``
    leaves the index out (placement then pins nothing, as on nodes without the label)."""
    kopf.index(*NODES, labels={GPU_PRODUCT_LABEL: kopf.PRESENT})(gpu_products)


def use_activator(namespace: str, service: str, token: str) -> None:
    """Serve pools at zero through the activator behind ``namespace/service`` (`activators`): the
    operator then also writes an EndpointSlice of its own into a pool's Service, which needs RBAC to
    create, patch and delete them."""
    ACTIVATOR.append(ActivatorConfig(namespace, service, token))


@kopf.index(*ENDPOINT_SLICES, labels={POOL_LABEL: kopf.PRESENT})
async def slices_by_pool(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                         **_: Any) -> dict[tuple[str, str], Manifest]:
    """The EndpointSlices of each pool's Service: the controller's (labels copied from the Service), whose
    ready endpoints are the replicas that serve (`Observed.endpoints`), and the activator's."""
    return _child_entry("EndpointSlice", namespace, labels, body, "addressType", "endpoints", "ports")


def _child_entry(kind: str, namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                 *fields: str) -> dict[tuple[str, str], Manifest]:
    """One pool-level child in its pool's index entry: metadata plus the fields the operator owns."""
    return {(namespace or "default", labels[POOL_LABEL]): {
        "kind": kind, "metadata": _metadata(body), **{f: body.get(f) for f in fields},
    }}


@kopf.index("", "v1", "services", labels={POOL_LABEL: kopf.PRESENT})
async def services_by_pool(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                           **_: Any) -> dict[tuple[str, str], Manifest]:
    """Each pool's Service as the watch shows it: a deleted or edited one is repaired next step."""
    return _child_entry("Service", namespace, labels, body, "spec")


@kopf.index("", "v1", "secrets", labels={POOL_LABEL: kopf.PRESENT})
async def secrets_by_pool(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                          **_: Any) -> dict[tuple[str, str], Manifest]:
    """Each pool's control Secret (only secrets labelled with a pool are watched)."""
    return _child_entry("Secret", namespace, labels, body, "data")


@kopf.index("policy", "v1", "poddisruptionbudgets", labels={POOL_LABEL: kopf.PRESENT})
async def pdbs_by_pool(namespace: str | None, labels: Mapping[str, str], body: kopf.Body,
                       **_: Any) -> dict[tuple[str, str], Manifest]:
    """Each pool's PodDisruptionBudget."""
    return _child_entry("PodDisruptionBudget", namespace, labels, body, "spec")


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def reconcile_pool(name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                         body: kopf.Body, **kwargs: Any) -> None:
    """The single writer of one pool."""
    ns = namespace or "default"
    def indexed(index_name: str) -> list[Manifest]:
        index = cast(kopf.Index[tuple[str, str], Manifest], kwargs[index_name])  # kopf passes indices by name
        return list(index.get((ns, name), []))

    def children() -> list[Manifest]:
        return [*indexed("secrets_by_pool"), *indexed("services_by_pool"), *indexed("pdbs_by_pool"),
                *indexed("slices_by_pool")]

    def products(nodes: Iterable[str]) -> dict[str, str]:
        index = cast(kopf.Index[str, str] | None, kwargs.get("gpu_products"))  # None: --no-gpu-placement
        return {node: next(iter(index[node])) for node in nodes if node in index} if index is not None else {}

    def watched() -> Manifest:
        # A daemon's body is kopf's live view: each watch event swaps in the new object whole, so
        # a shallow copy is one consistent version.
        return dict(body)

    reconciler = PoolReconciler(memo.kube, memo.sidecars, post_event, ns, name,
                                lambda: indexed("pods_by_pool"), children, watched, products, memo.activators)
    RECONCILERS[(ns, name)] = reconciler
    try:
        await reconciler.run(lambda: bool(stopped))
    finally:
        RECONCILERS.pop((ns, name), None)
        # The daemon stops when its pool is deleted (children go with owner references) or the
        # operator exits: either way the pool's series go. No on.delete handler for this: any
        # create/update/delete handler makes kopf patch its last-handled configuration into the
        # pool at every spec change, and each such patch made the step's status write a Conflict.
        metrics.forget_pool(ns, name)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def pool_changed(name: str, namespace: str | None, body: kopf.Body, **_: Any) -> None:
    """Wake the pool's reconciler on any change (e.g. kubectl scale) but its own status writes."""
    if (reconciler := RECONCILERS.get((namespace or "default", name))) is not None:
        reconciler.pool_changed(str(body.get("metadata", {}).get("resourceVersion", "")))


@kopf.on.event("", "v1", "pods", labels={POOL_LABEL: kopf.PRESENT})
@kopf.on.event("", "v1", "services", labels={POOL_LABEL: kopf.PRESENT})
@kopf.on.event("", "v1", "secrets", labels={POOL_LABEL: kopf.PRESENT})
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels={POOL_LABEL: kopf.PRESENT})
@kopf.on.event(*ENDPOINT_SLICES, labels={POOL_LABEL: kopf.PRESENT})
async def child_changed(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
    """Wake the owning pool's reconciler when one of its pods or other children changes or goes."""
    if (reconciler := RECONCILERS.get((namespace or "default", labels[POOL_LABEL]))) is not None:
        reconciler.wake.set()

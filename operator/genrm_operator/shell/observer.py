"""The observer of one pool: which copy of the pool a step decides on, and its parsed views.

No request in the usual case: the pool as the watch shows it (the kopf daemon's live body) or as
this process's own last status write left it, whichever is newer by resourceVersion (a GET at
start, after a Conflict, or when resourceVersions are not integers); the pods and the GPU products
of their nodes from kopf indexes. The spec, the status and each pod's view are parsed again only
when their resourceVersion changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

from ..api.pool import GenRMPoolSpec, GenRMPoolStatus
from ..core.model import PodView
from .kube import Kube, Manifest
from .observe import pod_view

PodSource = Callable[[], list[Manifest]]
"""The pool's pods as the watch last showed them (kopf's pod index): no LIST per step.

The index may lag the operator's own writes by an event; that is safe because pod
names are deterministic (a repeated create is AlreadyExists) and every action is
idempotent and bound to a pod UID."""
PoolSource = Callable[[], Manifest | None]
"""The pool as the watch last showed it (the kopf daemon's live body): no GET per step."""
ProductSource = Callable[[Iterable[str]], Mapping[str, str]]
"""The GPU products of these nodes, for those the node watch shows labelled (kopf index): placement."""


def no_products(nodes: Iterable[str]) -> Mapping[str, str]:
    """No node is labelled: placement pins nothing (a reconciler without a node watch)."""
    return {}


class PoolObserver:
    """What one pool's steps see, and the caches that keep seeing it cheap."""

    def __init__(self, kube: Kube, namespace: str, name: str, pods: PodSource, watched: PoolSource,
                 products: ProductSource = no_products) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.pods, self.watched, self.products = pods, watched, products
        self.written: Manifest | None = None
        """The pool as this process's last status write left it (the API server's answer)."""
        self.refresh = True
        """Read the pool from the API server at the next step (at start, and after a Conflict)."""
        self._parsed: tuple[str, GenRMPoolSpec, GenRMPoolStatus] | None = None
        """The pool's spec and status as last parsed, with the resourceVersion they were parsed from."""
        self._views: dict[tuple[str, str], PodView] = {}
        """Each pod's view by (UID, resourceVersion), as the last step made it."""

    async def read_pool(self) -> Manifest | None:
        """The newest copy of the pool: the watch's, or the answer to this process's own last status write
        while the watch has not shown that write yet (deciding on an older status would only repeat
        the last step and meet a Conflict). A GET at start, after a Conflict, and whenever the two
        cannot be ordered by their resourceVersions (integers on every etcd-backed API server; the
        API conventions call them opaque, so anything else falls back to reading).

        Either copy may lag another writer's latest change by a watch event, as a GET may lag by a
        round trip: the status write is bound to the copy's resourceVersion, so a decision on an old
        spec is refused (Conflict) and made again on a fresh read."""
        seen, written = self.watched(), self.written
        if not self.refresh and seen is not None and (newest := _newest(seen, written)) is not None:
            return newest
        self.refresh = False
        return await self.kube.get_pool(self.namespace, self.name)

    def latest(self) -> Manifest | None:
        """The newest copy of the pool this process has without a request (`read_pool`, no GET)."""
        seen, written = self.watched(), self.written
        return written if seen is None else (_newest(seen, written) or seen)

    def parse(self, pool: Manifest) -> tuple[GenRMPoolSpec, GenRMPoolStatus]:
        """The pool's spec and status, parsed again only when the pool changed.

        An object's content is fixed by its resourceVersion, and most steps (woken by a pod or a
        sidecar) see the pool unchanged: parsing both at every step was most of a step's own
        validation cost in a scale storm."""
        version = str(pool["metadata"].get("resourceVersion", ""))
        if self._parsed is None or not version or self._parsed[0] != version:
            self._parsed = (version, GenRMPoolSpec.model_validate(pool.get("spec") or {}),
                            GenRMPoolStatus.model_validate(pool.get("status") or {}))
        return self._parsed[1], self._parsed[2]

    def pod_views(self, pods: list[Manifest]) -> tuple[PodView, ...]:
        """The pods' views, each made again only when its pod changed (resourceVersion).

        A step sees most pods as the last one did; making every view anew was a sizeable share of
        the operator's CPU in a scale storm (figures: docs/performance.md#measurements-behind-the-code)."""
        views, kept = [], {}
        for pod in pods:
            meta = pod["metadata"]
            key = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
            view = self._views.get(key) or pod_view(pod)
            if key[1]:
                kept[key] = view
            views.append(view)
        self._views = kept
        return tuple(views)


def _newest(seen: Manifest, written: Manifest | None) -> Manifest | None:
    """The newer of the watch's copy and this process's last write (by resourceVersion), or None when
    they cannot be ordered (resourceVersions that are not integers)."""
    if written is None:
        return seen
    with contextlib.suppress(KeyError, TypeError, ValueError):
        newer = int(written["metadata"]["resourceVersion"]) > int(seen["metadata"]["resourceVersion"])
        return written if newer else seen
    return None

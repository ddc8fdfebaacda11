"""The pool-level children reconciled per concern: desired against observed.

Like KubeRay's ordered ``reconcileFuncs``, every step walks the Secret, the Service and the
PodDisruptionBudget in this order and decides, for each, one of create, patch, delete or nothing.
Desired objects come from the pure builders in :mod:`.children`; observed ones from the shell's
watch-fed indexes. A deleted child is therefore recreated and a changed ``spec.service`` or
``spec.disruptionBudget`` reaches the existing object, in any operator process, not only the first.

Only the fields the operator owns are compared and patched (a JSON merge patch), so what the API
server or other controllers fill in (clusterIP, nodePort, extra labels and annotations) is left
alone; maps the operator owns (selectors) are replaced whole, so a key added by hand is removed.
An object of the same name that this pool does not control is never touched: it is reported.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.pool import GenRMPoolSpec
from ..api.status import EventReason
from .children import Manifest, pdb_manifest, secret_manifest, service_manifest
from .names import TOKEN_KEY, activator_slice_name, pdb_name, secret_name, service_name

KINDS = ("Secret", "Service", "PodDisruptionBudget", "EndpointSlice")
"""The order of the concerns: the Secret first, because pods and the operator need its token; the
activator's EndpointSlice (`activation`) last, after the Service it belongs to."""

OWNED_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Secret": (),
    "Service": (("spec", "type"), ("spec", "selector"), ("spec", "ports")),
    "PodDisruptionBudget": (("spec", "maxUnavailable"), ("spec", "selector")),
    "EndpointSlice": (("endpoints",), ("ports",)),
}
"""Per kind, the paths the operator writes on an existing object besides its labels.

The Secret's token is written at creation only: replicas read it once, at container start."""


@dataclass(frozen=True)
class CreateChild:
    """Create this child (AlreadyExists means another writer won: the next step compares)."""

    manifest: Manifest


@dataclass(frozen=True)
class PatchChild:
    """Merge-patch an existing child back to the desired values of the fields the operator owns."""

    kind: str
    name: str
    patch: Manifest


@dataclass(frozen=True)
class DeleteChild:
    """Delete a child that is no longer wanted (the PDB once disabled), bound to its UID."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class ForeignChild:
    """An object of the child's name exists but another owner controls it: report, never touch."""

    kind: str
    name: str

    @property
    def message(self) -> str:
        """The Degraded message: the user must rename or remove the other object."""
        return f"{self.kind} {self.name} exists and is not controlled by this pool"


ChildAction = CreateChild | PatchChild | DeleteChild | ForeignChild
CHILD_FAILED = EventReason.CHILD_FAILED
"""Reason of the Degraded condition and of the Warning event when the API server refuses a child write."""
NAMES = {"Secret": secret_name, "Service": service_name, "PodDisruptionBudget": pdb_name,
         "EndpointSlice": activator_slice_name}


def select_observed(pool: str, objects: Iterable[Manifest]) -> dict[str, Manifest]:
    """The pool's children by kind among watched objects labelled with the pool: those of the child's name."""
    return {kind: obj for obj in objects if (kind := obj.get("kind", "")) in NAMES
            and (obj.get("metadata") or {}).get("name") == NAMES[kind](pool)}


def desired_children(pool: str, pool_uid: str, namespace: str, spec: GenRMPoolSpec,
                     token: str, judge: str | None = None) -> dict[str, Manifest]:
    """The children the spec asks for, by kind (no PodDisruptionBudget when it is disabled); the
    Service selects judge revision ``judge`` alone when one is given."""
    wanted = {
        "Secret": secret_manifest(pool, pool_uid, namespace, token),
        "Service": service_manifest(pool, pool_uid, namespace, spec, judge),
    }
    if spec.disruption_budget.enabled:
        wanted["PodDisruptionBudget"] = pdb_manifest(pool, pool_uid, namespace, spec)
    return wanted


def observed_token(secret: Manifest | None) -> str | None:
    """The control token held by an observed Secret, if it holds a readable one."""
    encoded = ((secret or {}).get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def plan_children(desired: Mapping[str, Manifest], observed: Mapping[str, Manifest],
                  pool_uid: str) -> tuple[ChildAction, ...]:
    """What to do with each child, in :data:`KINDS` order; children already as desired need nothing."""
    actions: list[ChildAction] = []
    for kind in KINDS:
        want, have = desired.get(kind), observed.get(kind)
        if have is not None and not controlled_by(have, pool_uid):
            if want is not None:
                actions.append(ForeignChild(kind, have["metadata"]["name"]))
        elif want is None:
            if have is not None:
                actions.append(DeleteChild(kind, have["metadata"]["name"], have["metadata"]["uid"]))
        elif have is None:
            actions.append(CreateChild(want))
        elif patch := merge_patch(kind, want, have):
            actions.append(PatchChild(kind, want["metadata"]["name"], patch))
    return tuple(actions)


def controlled_by(obj: Manifest, pool_uid: str) -> bool:
    """True when the pool with this UID is the object's controller."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") == pool_uid for ref in refs)


def merge_patch(kind: str, want: Manifest, have: Manifest) -> Manifest:
    """The JSON merge patch bringing ``have``'s owned fields to ``want``'s; empty when they agree."""
    patch: Manifest = {}
    have_labels = (have.get("metadata") or {}).get("labels") or {}
    labels = {k: v for k, v in want["metadata"]["labels"].items() if have_labels.get(k) != v}
    if labels:
        patch["metadata"] = {"labels": labels}
    for path in OWNED_FIELDS[kind]:
        wanted, current = _get(want, path), _get(have, path)
        if _project(current, wanted) != wanted:
            _put(patch, path, _replacing(current, wanted))
    return patch


def _get(obj: Manifest, path: tuple[str, ...]) -> Any:
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _put(obj: Manifest, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value


def _project(current: Any, wanted: Any) -> Any:
    """``current`` seen through ``wanted``'s list items: keys the API server adds (nodePort) are ignored."""
    if isinstance(wanted, list) and isinstance(current, list) and len(current) == len(wanted):
        return [{k: c.get(k) for k in w} if isinstance(w, dict) and isinstance(c, dict) else c
                for c, w in zip(current, wanted, strict=True)]
    return current


def _replacing(current: Any, wanted: Any) -> Any:
    """``wanted`` as a merge-patch value that also removes map keys ``current`` has beyond it."""
    if not isinstance(wanted, dict):
        return wanted
    old = current if isinstance(current, dict) else {}
    return {**{k: None for k in old if k not in wanted}, **{k: _replacing(old.get(k), v) for k, v in wanted.items()}}

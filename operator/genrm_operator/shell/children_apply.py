"""The children applier of one pool: its token Secret, Service and PodDisruptionBudget brought to the spec.

The core decides them in the step's `Plan` (`Plan.children`, from `core.childrenplan`: create,
merge-patch of the owned fields, delete or nothing, in the order Secret, Service,
PodDisruptionBudget: KubeRay's ordered ``reconcileFuncs``) from what this observes; this carries
the decisions out and keeps the API server's refusals, which the next step reports in the pool's
status (`Observed.child_errors`) exactly as it reports refused pod actions.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable

from kubernetes.client.exceptions import ApiException

from ..core.childrenplan import (
    ChildAction,
    CreateChild,
    DeleteChild,
    ForeignChild,
    PatchChild,
    observed_token,
    plan_children,
    select_observed,
)
from ..core.model import ObservedChildren
from .executor import target
from .kube import Kube, Manifest, api_message

ChildSource = Callable[[], list[Manifest]]
"""The pool's Secret, Service and PodDisruptionBudget as the watches last showed them (kopf indexes)."""


class ChildrenApplier:
    """Applies one pool's child objects; keeps the pool's control token."""

    def __init__(self, kube: Kube, namespace: str, name: str, children: ChildSource) -> None:
        self.kube, self.namespace, self.name, self.children = kube, namespace, name, children
        self.token: str | None = None
        """The pool's control token: the Secret's, or one this process made while the watch has not
        shown the Secret yet."""
        self.errors: list[str] = []
        """The API server's refusals of the last step's child writes, reported by the next step."""

    def observe(self, pool_uid: str) -> ObservedChildren:
        """The pool's children as the watches show them, and its token, for the core to decide on.

        The token is the one the Secret holds; one this process made before stands in while the
        watch has not shown the Secret yet, so a deleted Secret comes back with the token the
        running replicas were started with.
        """
        watched = self.children()
        observed = select_observed(self.name, watched)
        self.token = observed_token(observed.get("Secret")) or self.token or secrets.token_urlsafe(32)
        return ObservedChildren(pool_uid=pool_uid, namespace=self.namespace, token=self.token, objects=observed,
                                slices=tuple(o for o in watched if o.get("kind") == "EndpointSlice"))

    async def carry_out(self, actions: Iterable[ChildAction], pool_uid: str) -> None:
        """Carry out the children's decisions of a `Plan`, in order; the API server's refusals are kept
        in `errors` for the next step to report."""
        refused = [await self.child_action(action, pool_uid) for action in actions]
        self.errors = [message for message in refused if message]

    async def child_action(self, action: ChildAction, pool_uid: str) -> str | None:
        """Carry out one child decision; returns why it could not be done (the API server's message).

        A create that meets an object the watch did not show (its labels removed by hand) compares
        against a fresh read instead."""
        ns = self.namespace
        try:
            match action:
                case CreateChild(manifest=manifest):
                    kind, name = manifest["kind"], manifest["metadata"]["name"]
                    created = await self.kube.create(manifest)
                    if created or (found := await self.kube.read_child(kind, ns, name)) is None:
                        return None
                    if kind == "Secret":
                        self.token = observed_token(found) or self.token
                    for retry in plan_children({kind: manifest}, {kind: found}, pool_uid):
                        if message := await self.child_action(retry, pool_uid):
                            return message
                case PatchChild(kind=kind, name=name, patch=patch):
                    await self.kube.patch_child(kind, ns, name, patch)
                case DeleteChild(kind=kind, name=name, uid=uid):
                    await self.kube.delete_child(kind, ns, name, uid)
                case ForeignChild():
                    return action.message
        except ApiException as exc:
            return f"{target(action)}: {api_message(exc)}"
        return None

"""The children applier of one pool: its token Secret, Service and PodDisruptionBudget brought to the spec.

`core.childrenplan` decides (create, merge-patch of the owned fields, delete or nothing, in the
order Secret, Service, PodDisruptionBudget: KubeRay's ordered ``reconcileFuncs``); this carries
the decisions out and returns the API server's refusals, which the step reports in the pool's
status (`Observed.child_errors`) as it reports refused pod actions.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from ..api.pool import GenRMPoolSpec
from ..core.childrenplan import (
    ChildAction,
    CreateChild,
    DeleteChild,
    ForeignChild,
    PatchChild,
    desired_children,
    observed_token,
    plan_children,
    select_observed,
)
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

    async def apply(self, pool_uid: str, spec: GenRMPoolSpec) -> list[str]:
        """Bring the Secret, Service and PDB to the spec, in order; returns the API server's refusals.

        The token is the one the Secret holds; one this process made before stands in while the
        watch has not shown the Secret yet, so a deleted Secret comes back with the token the
        running replicas were started with.
        """
        observed = select_observed(self.name, self.children())
        self.token = observed_token(observed.get("Secret")) or self.token or secrets.token_urlsafe(32)
        desired = desired_children(self.name, pool_uid, self.namespace, spec, self.token)
        refused = [await self.child_action(action, desired, pool_uid)
                   for action in plan_children(desired, observed, pool_uid)]
        return [message for message in refused if message]

    async def child_action(self, action: ChildAction, desired: dict[str, Manifest], pool_uid: str) -> str | None:
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
                    for retry in plan_children({kind: desired[kind]}, {kind: found}, pool_uid):
                        if message := await self.child_action(retry, desired, pool_uid):
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

"""Idempotent Kubernetes calls, run in threads because the official client is synchronous.

Idempotence rules: AlreadyExists on create and NotFound on delete are success;
deletes and label patches carry the pod UID as a precondition, so an action
decided for one pod incarnation can never hit a recreated pod of the same name.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..core.names import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")
Manifest = dict[str, Any]


def load_config() -> None:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


class Conflict(Exception):
    """The object changed since it was read; the step is retried with fresh state."""


class Kube:
    """The handful of API calls the operator makes."""

    def __init__(self) -> None:
        api = client.ApiClient()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.policy = client.PolicyV1Api(api)

    @staticmethod
    async def _call(fn: Callable[..., T], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> T | None:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            if exc.status in ok:
                return None
            raise

    async def get_pool(self, namespace: str, name: str) -> Manifest | None:
        pool = await self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
                                ok=(404,))
        return pool if isinstance(pool, dict) else None

    async def replace_status(self, pool: Manifest, status: Manifest) -> str:
        """PUT the status with the read resourceVersion (a concurrent change yields Conflict).

        Returns the new resourceVersion, so a write that must follow this one can be bound to it.
        """
        meta = pool["metadata"]
        body = {**pool, "status": status}
        try:
            written = await asyncio.to_thread(
                self.custom.replace_namespaced_custom_object_status, GROUP, VERSION, meta["namespace"], PLURAL,
                meta["name"], body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(meta["name"]) from exc
            raise
        return str(cast(Manifest, written)["metadata"]["resourceVersion"])

    async def create(self, manifest: Manifest) -> None:
        """Create a Pod, Service or PodDisruptionBudget; AlreadyExists is success."""
        ns, kind = manifest["metadata"]["namespace"], manifest["kind"]
        creators: dict[str, Callable[..., Any]] = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Secret": self.core.create_namespaced_secret,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }
        await self._call(creators[kind], ns, manifest, ok=(409,))

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None,
                         resource_version: str = "") -> None:
        """Delete bound to the UID (and the resourceVersion, if given); NotFound and a precondition
        mismatch (409) are success: the next reconcile step decides again from a fresh view."""
        options = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version or None))
        await self._call(self.core.delete_namespaced_pod, name, namespace, body=options, ok=(404, 409))

    async def patch_pod_meta(self, namespace: str, name: str, uid: str, labels: dict[str, str],
                             annotations: dict[str, str]) -> None:
        """Merge-patch labels/annotations of one pod incarnation (UID precondition in the body)."""
        body = {"metadata": {"uid": uid, "labels": labels, "annotations": annotations}}
        await self._call(self.core.patch_namespaced_pod, name, namespace, body, ok=(404, 409, 422))

    async def control_token(self, namespace: str, secret: str, build: Callable[[str], Manifest]) -> str:
        """The pool's sidecar token, creating the Secret with a random one the first time."""
        found = await self._call(self.core.read_namespaced_secret, secret, namespace, ok=(404,))
        if found is None:
            await self.create(build(secrets.token_urlsafe(32)))
            found = await asyncio.to_thread(self.core.read_namespaced_secret, secret, namespace)

        data = found.data or {}
        return base64.b64decode(data.get("token", "")).decode()

    async def scale(self, namespace: str, name: str, replicas: int, resource_version: str) -> None:
        """Write spec.replicas through the scale subresource, the same path as kubectl scale and HPA.

        Bound to the resourceVersion the decision was made on: if another writer changed the pool
        in between, the API server answers Conflict instead of letting us overwrite its count.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
        try:
            await asyncio.to_thread(self.custom.patch_namespaced_custom_object_scale, GROUP, VERSION, namespace,
                                    PLURAL, name, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            raise

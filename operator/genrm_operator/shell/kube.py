"""Idempotent Kubernetes calls, run in threads because the official client is synchronous.

Idempotence rules: AlreadyExists on create and NotFound on delete are success;
deletes and label patches carry the pod UID as a precondition, so an action
decided for one pod incarnation can never hit a recreated pod of the same name.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..core.names import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
T = TypeVar("T")
USER_AGENT = "genrm-operator"
"""What the API server's audit log names the operator's own calls by (kopf's are ``kopf/<version>``)."""
Manifest = dict[str, Any]
THREADS = 32
"""Threads (and pooled API connections) for the synchronous client. asyncio's default executor has
cores + 4 (six on 2 cores), shared by every pool's calls, and the client's default connection pool
holds cores x 5: with many pools, steps waited for a thread and connections were reopened."""


def load_config() -> None:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


MESSAGE_LIMIT = 1024
"""Characters of an API server message kept for a condition or event (an Event's note is 1 KiB)."""


def api_message(exc: ApiException) -> str:
    """The API server's own message (the Status body), as users see it in kubectl."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{exc.status} {exc.reason}")[:MESSAGE_LIMIT]


class Conflict(Exception):
    """The object changed since it was read; the step is retried with fresh state."""


class Kube:
    """The handful of API calls the operator makes."""

    def __init__(self) -> None:
        configuration = client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = THREADS
        self.api = client.ApiClient(configuration)
        self.api.user_agent = USER_AGENT
        self._executor = ThreadPoolExecutor(THREADS, thread_name_prefix="kube")
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.policy = client.PolicyV1Api(self.api)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One blocking client call on the operator's own threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def _call(self, fn: Callable[..., T], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> T | None:
        try:
            return await self._run(fn, *args, **kwargs)
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
            written = await self._run(
                self.custom.replace_namespaced_custom_object_status, GROUP, VERSION, meta["namespace"], PLURAL,
                meta["name"], body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(meta["name"]) from exc
            raise
        return str(cast(Manifest, written)["metadata"]["resourceVersion"])

    async def create(self, manifest: Manifest) -> bool:
        """Create a Pod, Secret, Service or PodDisruptionBudget; False when it already exists."""
        ns, kind = manifest["metadata"]["namespace"], manifest["kind"]
        creators: dict[str, Callable[..., Any]] = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "Secret": self.core.create_namespaced_secret,
            "PodDisruptionBudget": self.policy.create_namespaced_pod_disruption_budget,
        }
        try:
            await self._run(creators[kind], ns, manifest)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _child_calls(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        """Read, patch and delete of a pool-level child kind."""
        return {
            "Service": (self.core.read_namespaced_service, self.core.patch_namespaced_service,
                        self.core.delete_namespaced_service),
            "Secret": (self.core.read_namespaced_secret, self.core.patch_namespaced_secret,
                       self.core.delete_namespaced_secret),
            "PodDisruptionBudget": (self.policy.read_namespaced_pod_disruption_budget,
                                    self.policy.patch_namespaced_pod_disruption_budget,
                                    self.policy.delete_namespaced_pod_disruption_budget),
        }[kind]

    async def read_child(self, kind: str, namespace: str, name: str) -> Manifest | None:
        """One child as a wire-format manifest (kind included), or None when it does not exist."""
        found = await self._call(self._child_calls(kind)[0], name, namespace, ok=(404,))
        if found is None:
            return None
        wire = self.api.sanitize_for_serialization(found)  # type: ignore[no-untyped-call]
        return {**cast(Manifest, wire), "kind": kind}

    async def patch_child(self, kind: str, namespace: str, name: str, patch: Manifest) -> None:
        """JSON merge patch (RFC 7386): lists such as Service ports are replaced, not merged by key."""
        await self._run(self._child_calls(kind)[1], name, namespace, patch,
                                _content_type="application/merge-patch+json")

    async def delete_child(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete bound to the UID; NotFound and a precondition mismatch mean it is already gone."""
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        await self._call(self._child_calls(kind)[2], name, namespace, body=options, ok=(404, 409))

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

    async def scale(self, namespace: str, name: str, replicas: int, resource_version: str) -> None:
        """Write spec.replicas through the scale subresource, the same path as kubectl scale and HPA.

        Bound to the resourceVersion the decision was made on: if another writer changed the pool
        in between, the API server answers Conflict instead of letting us overwrite its count.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
        try:
            await self._run(self.custom.patch_namespaced_custom_object_scale, GROUP, VERSION, namespace,
                                    PLURAL, name, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            raise

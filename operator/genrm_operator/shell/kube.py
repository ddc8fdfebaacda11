"""Idempotent Kubernetes calls, made on the operator's event loop.

The official client's configuration (kubeconfig or in-cluster, with its token refresh) says where
the API server is and how to authenticate; the requests themselves go out through one aiohttp
session (the HTTP library kopf already uses) as JSON built here, and answers come back as JSON
dicts. Why not the official client's own calls: they are synchronous, so they ran in threads, and
in a scale storm a status write waited between the step deciding it and the request leaving
(thread hand-offs and the GIL shared with the event loop); and its generated per-kind methods
validate every body into pydantic models and build model objects from every answer, CPU spent on
objects the operator never looks at (figures: docs/performance.md#measurements-behind-the-code).

Idempotence rules: AlreadyExists on create and NotFound on delete are success;
deletes and label patches carry the pod UID as a precondition, so an action
decided for one pod incarnation can never hit a recreated pod of the same name.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..api.pool import GROUP, KIND, PLURAL, VERSION
from .writeorder import WriteOrder

MERGE_PATCH = "application/merge-patch+json"
POOLS = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}"
COLLECTIONS = {
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "Secret": "/api/v1/namespaces/{namespace}/secrets",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
}
"""Where each kind the operator writes lives (namespaced collections)."""

log = logging.getLogger(__name__)
USER_AGENT = "genrm-operator"
"""What the API server's audit log names the operator's own calls by (kopf's are ``kopf/<version>``)."""
Manifest = dict[str, Any]
CONNECTIONS = 32
"""Connections to the API server at most (every pool's calls share them)."""
TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
"""A call that hangs must not hold its pool's step for good: it fails, and the next step repeats it."""


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


def tls_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The API server's CA (or none checked, when the kubeconfig says so) and the client certificate."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


class Kube:
    """The handful of API calls the operator makes."""

    def __init__(self, configuration: client.Configuration | None = None) -> None:
        self._config = configuration or client.Configuration.get_default_copy()
        self._session: aiohttp.ClientSession | None = None
        self.order = WriteOrder()
        """Every pool's status writes, decisions first (`writeorder`)."""

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use (aiohttp sessions belong to the running event loop)."""
        if self._session is None:
            https = self._config.host.startswith("https:")
            connector = aiohttp.TCPConnector(limit=CONNECTIONS, ssl=tls_context(self._config) if https else False)
            self._session = aiohttp.ClientSession(connector=connector, timeout=TIMEOUT,
                                                  headers={"User-Agent": USER_AGENT, "Accept": "application/json"})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: Manifest | None = None, *,
                       ok: Sequence[int] = (), content_type: str = "application/json") -> Manifest | None:
        """One API call; the answer as JSON, ``None`` when the API server answered a status in ``ok``
        (NotFound on a read, AlreadyExists or a failed precondition that means "done"), any other
        refusal as ``ApiException`` (its body the API server's Status, for `api_message`)."""
        headers = {"Content-Type": content_type}
        # The bearer token, if any, through the client's own hook: an in-cluster token is re-read
        # as it rotates, an exec plugin's is renewed before it expires.
        if token := self._config.get_api_key_with_prefix("BearerToken", alias="authorization"):
            headers["Authorization"] = token
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        async with self._open().request(method, f"{self._config.host}{path}", data=data, headers=headers,
                                        proxy=self._config.proxy or None,
                                        server_hostname=self._config.tls_server_name or None) as response:
            answer = await response.read()
            status, reason = response.status, response.reason
        if status in ok:
            return None
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=reason, body=answer.decode(errors="replace"))
        document = json.loads(answer) if answer else {}
        return document if isinstance(document, dict) else {}

    async def get_pool(self, namespace: str, name: str) -> Manifest | None:
        return await self._request("GET", _path(POOLS, namespace, name), ok=(404,))

    async def write_status(self, pool: Manifest, status: Manifest, gating: bool = False) -> Manifest:
        """Replace the status (``status``: all of it), bound to the read resourceVersion: a concurrent
        change yields Conflict, and a write that changes nothing is accepted without a new version.
        A write that actions wait for (``gating``) goes at once; any other after the gating writes of
        every pool (`writeorder`).

        Returns the pool as written, whose resourceVersion a write that must follow this one is bound to.
        """
        meta = pool["metadata"]
        path, body = _path(POOLS, meta["namespace"], meta["name"], "status"), status_update(pool, status)
        try:
            if gating:
                async with self.order.gating():
                    written = await self._request("PUT", path, body)
            else:
                await self.order.recording()
                written = await self._request("PUT", path, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(meta["name"]) from exc
            raise
        assert written is not None, "no status is accepted with a NotFound"
        return written

    async def create(self, manifest: Manifest) -> bool:
        """Create a Pod, Secret, Service or PodDisruptionBudget; False when it already exists."""
        collection = COLLECTIONS[manifest["kind"]].format(namespace=quote(manifest["metadata"]["namespace"], safe=""))
        return await self._request("POST", collection, manifest, ok=(409,)) is not None

    async def endpoint_slices(self, namespace: str, service: str) -> list[Manifest]:
        """The EndpointSlices of one Service (the activator's, `activators`)."""
        selector = quote(f"kubernetes.io/service-name={service}", safe="")
        found = await self._request("GET", f"{COLLECTIONS['EndpointSlice'].format(namespace=quote(namespace, safe=''))}"
                                           f"?labelSelector={selector}")
        return list((found or {}).get("items") or [])

    async def read_child(self, kind: str, namespace: str, name: str) -> Manifest | None:
        """One child as a wire-format manifest (kind included), or None when it does not exist."""
        found = await self._request("GET", _path(COLLECTIONS[kind], namespace, name), ok=(404,))
        return None if found is None else {**found, "kind": kind}

    async def patch_child(self, kind: str, namespace: str, name: str, patch: Manifest) -> None:
        """JSON merge patch (RFC 7386): lists such as Service ports are replaced, not merged by key."""
        await self._request("PATCH", _path(COLLECTIONS[kind], namespace, name), patch, content_type=MERGE_PATCH)

    async def delete_child(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete bound to the UID; NotFound and a precondition mismatch mean it is already gone."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._request("DELETE", _path(COLLECTIONS[kind], namespace, name), options, ok=(404, 409))

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None,
                         resource_version: str = "") -> None:
        """Delete bound to the UID (and the resourceVersion, if given); NotFound and a precondition
        mismatch (409) are success: the next reconcile step decides again from a fresh view."""
        preconditions = {"uid": uid, **({"resourceVersion": resource_version} if resource_version else {})}
        options: Manifest = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        await self._request("DELETE", _path(COLLECTIONS["Pod"], namespace, name), options, ok=(404, 409))

    async def patch_pod_meta(self, namespace: str, name: str, uid: str, labels: dict[str, str],
                             annotations: dict[str, str]) -> None:
        """Merge-patch labels/annotations of one pod incarnation (UID precondition in the body)."""
        body = {"metadata": {"uid": uid, "labels": labels, "annotations": annotations}}
        await self._request("PATCH", _path(COLLECTIONS["Pod"], namespace, name), body, ok=(404, 409, 422),
                            content_type=MERGE_PATCH)

    async def scale(self, namespace: str, name: str, replicas: int, resource_version: str) -> None:
        """Write spec.replicas through the scale subresource, the same path as kubectl scale and HPA.

        Bound to the resourceVersion the decision was made on: if another writer changed the pool
        in between, the API server answers Conflict instead of letting us overwrite its count.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
        try:
            await self._request("PATCH", _path(POOLS, namespace, name, "scale"), body, content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            raise


def _path(collection: str, namespace: str, name: str, subresource: str = "") -> str:
    """One object's (or subresource's) path; names are quoted although the API server's rules leave
    nothing to quote, so no value can ever add a path segment."""
    path = f"{collection.format(namespace=quote(namespace, safe=''))}/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path


def status_update(pool: Manifest, status: Manifest) -> Manifest:
    """The body of a status write (`Kube.write_status`): the pool's name and read resourceVersion, and
    the new status; nothing else.

    The API server keeps everything but the status from the stored pool (a write to the status
    subresource cannot change the rest) and takes managed fields from it too, so the rest of the
    copy would only be decoded and dropped. A PUT, not a merge patch of what changed: on a patch
    the API server encodes the whole stored pool, merges and decodes the whole result again, and
    `make bench-operator` measures that as more of its CPU per write than decoding this small body
    (`operator-bench-write`). In a scale storm the pools' status writes are the API server's largest
    cost."""
    meta = pool["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "resourceVersion": meta["resourceVersion"]},
            "status": status}

"""``genrm_operator.shell.kube.Kube`` against a stand-in API server on loopback.

Aspects under test: each call's method, path, content type and JSON body; the user agent the audit
log names the operator by; the bearer token taken through the client configuration's refresh hook
at every call (a rotated token is used at once); answers as JSON; the statuses that mean "done"
(AlreadyExists on create, NotFound on delete); a Conflict on a status write; any other refusal as
``ApiException`` carrying the API server's message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from genrm_operator.shell.kube import USER_AGENT, Conflict, Kube, api_message
from kubernetes import client
from kubernetes.client.exceptions import ApiException


class StandIn:
    """Answers each request with the next queued (status, body) and records what came in."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.seen: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append({"method": request.method, "path": request.path, "type": request.content_type,
                          "agent": request.headers.get("User-Agent"), "auth": request.headers.get("Authorization"),
                          "body": json.loads(raw) if raw else None})
        status, body = self.answers.pop(0)
        return web.json_response(body, status=status)


@pytest.fixture
async def api() -> AsyncIterator[tuple[StandIn, Kube]]:
    stand_in = StandIn()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stand_in.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tokens = ["rotated", "first"]  # the hook takes one per call; the last stays
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.api_key_prefix["authorization"] = "Bearer"
    configuration.refresh_api_key_hook = lambda c: c.api_key.update(
        authorization=tokens.pop() if len(tokens) > 1 else tokens[0])
    kube = Kube(configuration)
    try:
        yield stand_in, kube
    finally:
        await kube.close()
        await runner.cleanup()


def pool() -> dict[str, Any]:
    return {"apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool",
            "metadata": {"name": "judge", "namespace": "ml", "resourceVersion": "7", "uid": "u-1",
                         "labels": {"team": "rl"}, "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 2}, "status": {"replicas": 1, "operation": {"phase": "Verifying"}}}


async def test_a_status_write_puts_the_whole_status_bound_to_the_version_and_returns_the_answer(
        api: tuple[StandIn, Kube]) -> None:
    stand_in, kube = api
    stand_in.answers = [(200, {"metadata": {"resourceVersion": "8"}, "status": {"replicas": 2}})]
    written = await kube.write_status(pool(), {"replicas": 2})
    assert written == {"metadata": {"resourceVersion": "8"}, "status": {"replicas": 2}}
    # The pool's name and version and the new status, nothing else of the copy read (its spec,
    # labels and managed fields are the API server's to keep: e2e/test_api_contract.py).
    assert stand_in.seen == [{
        "method": "PUT", "path": "/apis/genrm.io/v1alpha1/namespaces/ml/genrmpools/judge/status",
        "type": "application/json", "agent": USER_AGENT, "auth": "Bearer first",
        "body": {"apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool",
                 "metadata": {"name": "judge", "namespace": "ml", "resourceVersion": "7"},
                 "status": {"replicas": 2}},
    }]


async def test_a_conflicting_status_write_raises_conflict_and_the_rotated_token_is_used(
        api: tuple[StandIn, Kube]) -> None:
    stand_in, kube = api
    stand_in.answers = [(409, {"kind": "Status", "reason": "Conflict"})] * 2
    for _ in range(2):
        with pytest.raises(Conflict):
            await kube.write_status(pool(), {"replicas": 2})
    assert [s["auth"] for s in stand_in.seen] == ["Bearer first", "Bearer rotated"]


async def test_already_exists_and_not_found_mean_done(api: tuple[StandIn, Kube]) -> None:
    stand_in, kube = api
    stand_in.answers = [(201, {"kind": "Pod"}), (409, {"reason": "AlreadyExists"}), (404, {"reason": "NotFound"}),
                        (404, {"reason": "NotFound"})]
    pod = {"kind": "Pod", "metadata": {"name": "judge-0", "namespace": "ml"}}
    assert await kube.create(pod) is True
    assert await kube.create(pod) is False
    await kube.delete_pod("ml", "judge-0", "uid-0", 2, "41")
    assert await kube.get_pool("ml", "judge") is None
    assert [(s["method"], s["path"]) for s in stand_in.seen] == [
        ("POST", "/api/v1/namespaces/ml/pods"), ("POST", "/api/v1/namespaces/ml/pods"),
        ("DELETE", "/api/v1/namespaces/ml/pods/judge-0"),
        ("GET", "/apis/genrm.io/v1alpha1/namespaces/ml/genrmpools/judge")]
    assert stand_in.seen[0]["body"] == pod and stand_in.seen[2]["body"] == {
        "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 2,
        "preconditions": {"uid": "uid-0", "resourceVersion": "41"}}


async def test_a_refusal_carries_the_api_servers_message(api: tuple[StandIn, Kube]) -> None:
    stand_in, kube = api
    stand_in.answers = [(422, {"kind": "Status", "message": "metadata.labels: Invalid value"})]
    with pytest.raises(ApiException) as refused:
        await kube.patch_child("Service", "ml", "judge", {"spec": {"ports": []}})
    assert refused.value.status == 422 and api_message(refused.value) == "metadata.labels: Invalid value"
    assert stand_in.seen[0]["type"] == "application/merge-patch+json"

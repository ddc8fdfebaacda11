"""What the operator's safety rests on in the API server's answers, checked against the real one.

A status write (`shell.kube.Kube.write_status`) is a PUT of the status subresource whose body
carries only the pool's name, its read resourceVersion and the new status. Through the operator's
own client:

- A step that retries a create writes its status first even when nothing in it changed, bound to
  the resourceVersion the step decided on (`core.model.writes_first`). That write is only worth its
  round trip if the API server checks the precondition of a write that changes nothing: it must be
  refused with a Conflict when the pool moved on, and accepted without a new resourceVersion (so
  no watch event, no etcd write) when it did not.
- The body's missing spec, labels, annotations and managed fields must mean "keep them": the
  API server takes them from the stored pool, so the user's spec, kubectl's last-applied
  annotation and the other managers' fields survive every status write.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from genrm_operator.shell.kube import Conflict, Kube
from kubernetes import client, config

from .harness import Cluster, pool_manifest


def with_message(status: dict[str, Any], message: str) -> dict[str, Any]:
    """``status`` with its first condition's message replaced: a write a step that only reports makes."""
    first, *rest = status["conditions"]
    return {**status, "conditions": [{**first, "message": message}, *rest]}


def managers(pool: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """Each manager's fields, keyed by manager and subresource (the time of a write left out)."""
    return {(e["manager"], e.get("subresource", "")): e["fieldsV1"] for e in pool["metadata"]["managedFields"]}


async def test_a_status_write_keeps_everything_else_and_is_refused_on_a_stale_version(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("guard", namespace, replicas=0))
    cluster.kubectl("label", "genrmpool", "guard", "-n", namespace, "team=rl")
    cluster.wait_serving(namespace, "guard", 0)
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    kube = Kube(configuration)
    try:
        for _ in range(5):  # the operator may still be writing its last conditions: read again then
            settled = await kube.get_pool(namespace, "guard")
            assert settled is not None
            try:
                written = await kube.write_status(settled, settled["status"])
                break
            except Conflict:
                await asyncio.sleep(1.0)
        else:
            raise AssertionError("a status write on the version just read was refused five times")
        assert written["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"], \
            "a status write that changes nothing writes nothing"
        assert written["status"] == settled["status"]

        changed = with_message(settled["status"], "written by the contract test")
        try:
            written = await kube.write_status(settled, changed)
        except Conflict:  # the operator wrote in between: the same write on what it wrote
            settled = await kube.get_pool(namespace, "guard")
            assert settled is not None
            changed = with_message(settled["status"], "written by the contract test")
            written = await kube.write_status(settled, changed)
        assert written["status"] == changed
        assert written["metadata"]["resourceVersion"] != settled["metadata"]["resourceVersion"]
        assert written["spec"] == settled["spec"]
        assert written["metadata"]["labels"] == settled["metadata"]["labels"] == {"team": "rl"}
        assert written["metadata"]["annotations"] == settled["metadata"]["annotations"]
        assert "kubectl.kubernetes.io/last-applied-configuration" in written["metadata"]["annotations"]
        before, after = managers(settled), managers(written)
        assert {k: v for k, v in after.items() if k[1] != "status"} == \
            {k: v for k, v in before.items() if k[1] != "status"}, "a status write changed other managers' fields"

        patch = json.dumps({"spec": {"replicas": 1}})  # the user's change the stale copy does not show
        cluster.kubectl("patch", "genrmpool", "guard", "-n", namespace, "--type=merge", "-p", patch)
        try:
            await kube.write_status(written, written["status"])
        except Conflict:
            pass
        else:
            raise AssertionError("a status write bound to a stale resourceVersion was accepted")
    finally:
        await kube.close()
    cluster.wait_serving(namespace, "guard", 1)

"""What the operator's safety rests on in the API server's answers, checked against the real one.

A step that retries a create writes its status first even when nothing in it changed: an empty
merge patch bound to the resourceVersion the step decided on (`core.model.writes_first`). That
write is only worth its round trip if the API server checks the precondition of a patch that
changes nothing: here, through the operator's own client, it must be refused with a Conflict when
the pool moved on, and accepted without a new resourceVersion (so no watch event, no etcd write)
when it did not.
"""

from __future__ import annotations

import asyncio
import json

from genrm_operator.shell.kube import Conflict, Kube
from kubernetes import client, config

from .harness import Cluster, pool_manifest


async def test_an_empty_status_patch_is_refused_on_a_stale_version_and_changes_nothing_on_the_current_one(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("guard", namespace, replicas=0))
    cluster.wait_serving(namespace, "guard", 0)
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    kube = Kube(configuration)
    try:
        for _ in range(5):  # the operator may still be writing its last conditions: read again then
            settled = cluster.pool(namespace, "guard")
            try:
                written = await kube.write_status(settled, settled["status"])
                break
            except Conflict:
                await asyncio.sleep(1.0)
        else:
            raise AssertionError("an empty status patch on the version just read was refused five times")
        assert written["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"], \
            "an empty patch on the current version writes nothing"
        assert written["status"] == settled["status"]

        patch = json.dumps({"spec": {"replicas": 1}})  # the user's change the stale copy does not show
        cluster.kubectl("patch", "genrmpool", "guard", "-n", namespace, "--type=merge", "-p", patch)
        try:
            await kube.write_status(settled, settled["status"])
        except Conflict:
            pass
        else:
            raise AssertionError("an empty status patch bound to a stale resourceVersion was accepted")
    finally:
        await kube.close()
    cluster.wait_serving(namespace, "guard", 1)

"""A pool's life through kubectl: apply, get, explain, describe, serve, delete.

Aspects: the pool becomes Available with the requested serving replicas;
printer columns like `kubectl get deploy`; `kubectl explain` shows field docs;
operation events in `kubectl describe`; a judge request through a published
replica works, and every answer through the Service names the pods' judge
revision; deleting the pool removes every child object.
"""

from __future__ import annotations

import json

import httpx

from .harness import Cluster, pool_manifest, wait_for


def test_apply_makes_an_available_pool_with_the_requested_serving_replicas(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("demo", namespace, replicas=2))
    cluster.kubectl("wait", "genrmpool/demo", "-n", namespace, "--for=condition=Available", "--timeout=120s")
    pool = cluster.wait_serving(namespace, "demo", 2)

    status = pool["status"]
    assert status["replicas"] == 2 and status["readyReplicas"] == 2
    assert status["selector"] == "genrm.io/pool=demo"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Available": "True", "Progressing": "False", "Degraded": "False"}
    assert status["history"][-1]["type"] == "ScaleOut" and status["history"][-1]["outcome"] == "Succeeded"

    table = cluster.kubectl("get", "genrmpools", "-n", namespace).splitlines()
    assert table[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "SERVING", "UP-TO-DATE", "OPERATION",
                                "PHASE", "AGE"]
    assert table[1].split()[:6] == ["demo", "2", "2", "2", "2", "2"]
    assert status["updatedReplicas"] == 2 and status["currentRevision"] == status["updateRevision"]
    assert {p["metadata"]["labels"]["genrm.io/revision"] for p in cluster.pods(namespace, "demo")} == {
        status["updateRevision"]}
    assert "grp" in cluster.kubectl("api-resources", "--api-group=genrm.io")

    explained = cluster.kubectl("explain", "genrmpool.spec.drain")
    assert "onTimeout" in explained and "Fail keeps the victim fenced" in explained

    described = cluster.kubectl("describe", "genrmpool", "demo", "-n", namespace)
    assert "ScaleOutStarted" in described and "ScaleOutSucceeded" in described

    pods = cluster.pods(namespace, "demo")
    assert sorted(p["metadata"]["name"] for p in pods) == ["demo-0", "demo-1"]
    ip = pods[0]["status"]["podIP"]
    assert not ip.startswith("127."), "pods need routable addresses for EndpointSlices"
    answer = httpx.post(f"http://{ip}:8000/generate", json={"text": "Is 2+2=4?"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["text"]
    models = httpx.get(f"http://{ip}:8000/v1/models", timeout=10).json()
    assert models["data"], models

    # Provenance through the Service: the judge revision on the pods, in the header, in the engine's answer.
    [revision] = {p["metadata"]["labels"]["genrm.io/judge-revision"] for p in pods}
    url = cluster.service_answering(namespace, "demo")
    native = httpx.post(f"{url}/generate", json={"text": "Is 2+2=4?"}, timeout=10)
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
        "model": models["data"][0]["id"], "messages": [{"role": "user", "content": "Is 2+2=4?"}]})
    refused = httpx.get(f"{url}/no/such/route", timeout=10)
    assert native.status_code == chat.status_code == 200 and refused.status_code == 404
    assert [a.headers.get_list("x-genrm-revision") for a in (native, chat, refused)] == [[revision]] * 3
    assert native.json()["meta_info"]["weight_version"] == chat.json()["metadata"]["weight_version"] == revision


def test_deleting_the_pool_removes_every_child(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("gone", namespace, replicas=1))
    cluster.wait_serving(namespace, "gone", 1)
    owned = "pods,services,secrets,poddisruptionbudgets"
    assert cluster.kubectl("get", owned, "-n", namespace, "-l", "genrm.io/pool=gone", "-o", "name").split()

    cluster.kubectl("delete", "genrmpool", "gone", "-n", namespace, "--timeout=120s")

    def children_gone() -> bool:
        left = cluster.kubectl("get", owned, "-n", namespace, "-o", "json")
        return not [i for i in json.loads(left)["items"]
                    if i["metadata"].get("labels", {}).get("genrm.io/pool") == "gone"]
    wait_for("children of the deleted pool to be garbage-collected", children_gone, timeout=120)

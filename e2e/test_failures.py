"""Replicas that crash, never get ready, cannot be scheduled or answer differently.

Aspects: an engine crash gets the replica replaced; a replica that never
becomes ready ends the operation Partial(StartupTimeout); a replica that never
served is gone within seconds of a scale-in (no drain to wait for); more GPUs
than the nodes have ends Partial(Unschedulable) and completes once capacity
appears; a replica whose answers differ from the serving ones is never published, but replaced,
each replacement after the first backing off (condition VerificationBackOff with the next attempt).
"""

from __future__ import annotations

import json
import re
import time

import httpx

from .harness import Cluster, pool_manifest, wait_for


def _last(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    history = (cluster.pool(namespace, name).get("status") or {}).get("history") or []
    return history[-1] if history else {}


def test_an_engine_crash_gets_the_replica_replaced(cluster: Cluster, namespace: str) -> None:
    crash = {"env": [{"name": "GENRM_SIM_CRASH_AFTER", "value": "8"}]}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("boom", namespace, replicas=1, engine=crash))
    cluster.wait_serving(namespace, "boom", 1)
    ip = cluster.pods(namespace, "boom")[0]["status"]["podIP"]
    with httpx.Client(timeout=5) as http:
        for _ in range(12):
            try:
                http.post(f"http://{ip}:8000/generate", json={"text": "crash me"})
            except httpx.HTTPError:
                pass

    def replaced() -> bool:
        names = {p["metadata"]["name"] for p in cluster.pods(namespace, "boom")
                 if not p["metadata"].get("deletionTimestamp")}
        return "boom-0" not in names and len(names) == 1
    wait_for("the crashed replica to be replaced", replaced, timeout=120)
    cluster.wait_serving(namespace, "boom", 1)
    assert "ReplicaFailed" in cluster.kubectl("describe", "genrmpool", "boom", "-n", namespace)


def test_a_replica_that_never_gets_ready_ends_the_operation_partial(cluster: Cluster, namespace: str) -> None:
    slow = {"extraArgs": ["--sim-startup-seconds", "3600"], "startupTimeoutSeconds": 6}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("slow", namespace, replicas=1, engine=slow))
    entry = wait_for("a Partial outcome", lambda: (e := _last(cluster, namespace, "slow")) and
                     e.get("outcome") == "Partial" and e, timeout=60)
    assert entry["reason"] == "StartupTimeout"
    conditions = {c["type"]: c for c in cluster.pool(namespace, "slow")["status"]["conditions"]}
    assert conditions["Available"]["status"] == "False"


def test_a_replica_that_never_served_is_gone_within_seconds_of_a_scale_in(cluster: Cluster, namespace: str) -> None:
    loading = {"extraArgs": ["--sim-startup-seconds", "15"], "startupTimeoutSeconds": 120}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("late", namespace, replicas=1, engine=loading))
    cluster.wait_serving(namespace, "late", 1)
    cluster.scale(namespace, "late", 2)
    wait_for("late-1 running, still loading", lambda: any(
        p["metadata"]["name"] == "late-1" and p["status"].get("phase") == "Running"
        for p in cluster.pods(namespace, "late")), timeout=60, interval=0.2)
    started = time.monotonic()
    cluster.scale(namespace, "late", 1)
    wait_for("late-1 gone", lambda: "late-1" not in {p["metadata"]["name"] for p in cluster.pods(namespace, "late")},
             timeout=60, interval=0.2)
    gone_after = time.monotonic() - started
    assert gone_after < 10, f"a replica that never served took {gone_after:.1f}s to go"
    cluster.wait_serving(namespace, "late", 1)


def test_too_few_gpus_is_partial_unschedulable_then_completes_when_capacity_appears(
    cluster: Cluster, namespace: str
) -> None:
    hog = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-hog", "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "hog", "image": "busybox", "command": ["sleep", "3600"],
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }
    def others_gone() -> bool:
        """No other test's pod holds a GPU (the activator's pods, which hold none, stay for the suite)."""
        pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
        return not [p for p in pods if p["metadata"]["namespace"] != namespace and any(
            "nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {}) for c in p["spec"]["containers"])]
    wait_for("earlier tests' pods to release their GPUs", others_gone, timeout=120)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(hog))
    cluster.kubectl("wait", "pod/gpu-hog", "-n", namespace, "--for=condition=Ready", "--timeout=60s")
    # 16 GPUs in the cluster, 8 taken by the hog: 3 replicas x 4 GPUs cannot all fit.
    big = {"gpusPerReplica": 4}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("big", namespace, replicas=3, engine=big))
    entry = wait_for("Partial(Unschedulable)", lambda: (e := _last(cluster, namespace, "big")) and
                     e.get("outcome") == "Partial" and e, timeout=90)
    assert entry["reason"] == "Unschedulable", entry
    assert "nvidia.com/gpu" in entry["message"]
    cluster.kubectl("delete", "pod", "gpu-hog", "-n", namespace, "--wait=true", "--timeout=60s")
    cluster.wait_serving(namespace, "big", 3, timeout=120)
    assert _last(cluster, namespace, "big")["outcome"] == "Succeeded"


def test_a_replica_whose_answers_differ_is_never_published_and_replaced_with_back_off(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("odd", namespace, replicas=1))
    cluster.wait_serving(namespace, "odd", 1)
    # env is not an answer-changing field of the API, so new replicas pick it up: exactly the kind of
    # silent drift verification exists to catch. Every replacement answers differently too.
    patch = {"spec": {"engine": {"env": [{"name": "GENRM_SIM_PERTURB", "value": "1"}]}}}
    cluster.kubectl("patch", "genrmpool", "odd", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    cluster.scale(namespace, "odd", 2)

    def backing_off() -> dict[str, str] | None:
        assert cluster.published(namespace, "odd") == ["odd-0"], "only the replica that answers as before serves"
        conditions = {c["type"]: c for c in cluster.pool(namespace, "odd")["status"]["conditions"]}
        return conditions["Degraded"] if conditions["Degraded"]["reason"] == "VerificationBackOff" else None
    degraded = wait_for("Degraded(VerificationBackOff)", backing_off, timeout=90)
    assert degraded["status"] == "True" and degraded["message"].startswith("next replica create at "), degraded
    assert re.search(r"\(ReplicaInconsistent\): odd-\d+: ReplicaInconsistent: odd-\d+ on node node-\d \(no GPU "
                     r"product label\) against odd-0 on node node-\d", degraded["message"]), degraded
    status = cluster.pool(namespace, "odd")["status"]
    assert status["servingReplicas"] == 1
    assert [h["reason"] for h in status["history"][-2:]] == ["ReplicaInconsistent"] * 2, status["history"]
    pods = {p["metadata"]["name"] for p in cluster.pods(namespace, "odd")}
    time.sleep(5)  # well inside the 20 s back-off
    assert {p["metadata"]["name"] for p in cluster.pods(namespace, "odd")} <= pods, "no attempt before the back-off"
    assert "reference=" in cluster.kubectl("describe", "genrmpool", "odd", "-n", namespace)

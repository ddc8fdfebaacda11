"""Scaling under continuous load with kubectl scale: the zero-loss promise.

Aspects: 1 -> 4 -> 1 loses nothing, neither for a client that follows
EndpointSlices and retries a 503 draining once elsewhere, nor for unmodified
clients (openai, httpx, requests) through the Service ClusterIP; a reversal
(4 -> 1, then back to 4 while victims drain) rescues the draining replicas
before any pod is created, again without loss for either kind of client.
"""

from __future__ import annotations

import time

from kubernetes import client

from .harness import TALLY, Cluster, account_plain, plain_report, pool_manifest, wait_for
from .loadclient import LoadClient


def _run_load(cluster: Cluster, namespace: str, pool: str) -> LoadClient:
    return LoadClient(cluster.api, namespace, pool, workers=4)


def _account(load: LoadClient) -> None:
    TALLY.requests += load.stats.sent
    TALLY.failed += load.stats.failed


def test_scale_out_and_in_under_load_loses_no_request(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("load", namespace, replicas=1))
    cluster.wait_serving(namespace, "load", 1)
    with _run_load(cluster, namespace, "load") as load, cluster.plain_clients(namespace, "load") as plain:
        wait_for("first requests", lambda: load.stats.ok > 20 and plain.ok_everywhere(5))
        cluster.scale(namespace, "load", 4)
        cluster.wait_serving(namespace, "load", 4)
        wait_for("traffic on all 4 replicas", lambda: len(load.stats.by_endpoint) >= 4, timeout=30)
        cluster.scale(namespace, "load", 1)
        cluster.wait_serving(namespace, "load", 1)
        time.sleep(2)
    _account(load)
    account_plain(plain)
    assert load.stats.failed == 0, load.stats.failures[:10]
    assert plain.stats.failed == 0, plain_report(plain)
    assert load.stats.ok > 100
    history = cluster.pool(namespace, "load")["status"]["history"]
    assert [(h["type"], h["outcome"]) for h in history[-2:]] == [("ScaleOut", "Succeeded"), ("ScaleIn", "Succeeded")]


def test_reversal_rescues_draining_replicas_before_creating_pods(cluster: Cluster, namespace: str) -> None:
    # Long enough drains that the reversal lands while victims are still draining.
    manifest = pool_manifest("rev", namespace, replicas=4,
                             drain={"propagationSeconds": 8, "quietSeconds": 1, "timeoutSeconds": 60})
    cluster.kubectl("apply", "-f", "-", input=manifest)
    cluster.wait_serving(namespace, "rev", 4)
    before = {p["metadata"]["name"] for p in cluster.pods(namespace, "rev")}
    with _run_load(cluster, namespace, "rev") as load, cluster.plain_clients(namespace, "rev") as plain:
        wait_for("first requests", lambda: load.stats.ok > 20 and plain.ok_everywhere(5))
        cluster.scale(namespace, "rev", 1)

        def victims_draining() -> bool:
            op = (cluster.pool(namespace, "rev").get("status") or {}).get("operation") or {}
            return op.get("type") == "ScaleIn" and len(op.get("victims", [])) == 3 and \
                all(v.get("unpublishedAt") for v in op["victims"])
        wait_for("three victims unpublished", victims_draining, timeout=30, interval=0.2)
        cluster.scale(namespace, "rev", 4)
        cluster.wait_serving(namespace, "rev", 4)
        time.sleep(2)
    _account(load)
    account_plain(plain)
    after = {p["metadata"]["name"] for p in cluster.pods(namespace, "rev")}
    assert after == before, "draining replicas must be rescued, not replaced by new pods"
    events = client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items
    assert sum(1 for e in events if e.reason == "ReplicaRescued") >= 1
    assert load.stats.failed == 0, load.stats.failures[:10]
    assert plain.stats.failed == 0, plain_report(plain)

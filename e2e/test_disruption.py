"""`kubectl drain` of a node under load: the pool's PodDisruptionBudget at work.

Aspects: the PDB allows a disruption (ALLOWED DISRUPTIONS 1, not stuck at 0); `kubectl drain`
evicts the pool's replicas on the node through the eviction API one at a time; each evicted
replica drains through its preStop and is replaced on the other node; neither the
endpoint-following client nor the unmodified clients through the Service lose a request.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from .harness import TALLY, Cluster, account_plain, plain_report, pool_manifest, wait_for
from .loadclient import LoadClient

POOL = "evict"
REPLICAS = 3


def _pdb_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pdb", POOL, "-n", namespace, "-o", "json")).get("status") or {})


def test_kubectl_drain_evicts_one_replica_at_a_time_and_loses_nothing(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(POOL, namespace, replicas=REPLICAS))
    cluster.wait_serving(namespace, POOL, REPLICAS)
    status = wait_for("the PDB to allow one disruption", lambda: (s := _pdb_status(cluster, namespace))
                      .get("disruptionsAllowed") == 1 and s, timeout=60)
    assert (status["expectedPods"], status["currentHealthy"], status["desiredHealthy"]) == (REPLICAS, REPLICAS,
                                                                                            REPLICAS - 1)
    by_node: dict[str, list[str]] = {}
    for pod in cluster.pods(namespace, POOL):
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    node, evicted = max(by_node.items(), key=lambda item: len(item[1]))

    most_terminating = 0
    stop = threading.Event()

    def watch_terminating() -> None:
        nonlocal most_terminating
        while not stop.wait(0.3):
            pods = cluster.pods(namespace, POOL)
            most_terminating = max(most_terminating, sum(1 for p in pods if p["metadata"].get("deletionTimestamp")))

    watcher = threading.Thread(target=watch_terminating, daemon=True)
    with LoadClient(cluster.api, namespace, POOL, workers=3) as load, \
            cluster.plain_clients(namespace, POOL) as plain:
        wait_for("first requests", lambda: load.stats.ok > 20 and plain.ok_everywhere(5))
        watcher.start()
        try:
            started = time.monotonic()
            drained = cluster.kubectl("drain", node, "--pod-selector", f"genrm.io/pool={POOL}",
                                      "--ignore-daemonsets", "--timeout=300s", timeout=330)
            drain_seconds = time.monotonic() - started
            cluster.wait_serving(namespace, POOL, REPLICAS, timeout=180)
            time.sleep(2)
        finally:
            cluster.kubectl("uncordon", node, check=False)
            stop.set()
            watcher.join(5)
    TALLY.requests += load.stats.sent
    TALLY.failed += load.stats.failed
    account_plain(plain)
    assert load.stats.failed == 0, load.stats.failures[:10]
    assert plain.stats.failed == 0, plain_report(plain)

    for name in evicted:
        assert f"pod/{name} evicted" in drained, drained
    assert most_terminating == 1, f"up to {most_terminating} replicas were disrupted at once"
    pods = cluster.pods(namespace, POOL)
    assert not {p["metadata"]["name"] for p in pods} & set(evicted)
    assert all(p["spec"]["nodeName"] != node for p in pods), "replacements must avoid the cordoned node"
    for name in evicted:
        gateway_log = cluster.local.logs_for(name, namespace)["gateway"].read_text(errors="replace")
        assert "genrm-gateway: drained" in gateway_log, f"{name} must drain through its preStop hook"
    print(f"\nkubectl drain of {node} ({len(evicted)} replicas) took {drain_seconds:.1f}s")

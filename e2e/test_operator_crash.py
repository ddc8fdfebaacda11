"""SIGKILL the operator mid-operation: the next process resumes from the status.

Aspects: killed during a scale-out and again during a scale-in, then
restarted: the pool converges, pod names stay unique (no duplicates), no pod
is left without being counted (no orphans) and no request fails, neither the
endpoint-following client's nor the unmodified clients' through the ClusterIP.
"""

from __future__ import annotations

import time

from .harness import TALLY, Cluster, OperatorProcess, account_plain, plain_report, pool_manifest, wait_for
from .loadclient import LoadClient


def _phase(cluster: Cluster, namespace: str, name: str) -> tuple[str, str] | None:
    op = (cluster.pool(namespace, name).get("status") or {}).get("operation") or {}
    return (op["type"], op["phase"]) if op else None


def test_operator_killed_during_scale_out_and_scale_in_converges_without_loss(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        "crash", namespace, replicas=1, drain={"propagationSeconds": 4, "quietSeconds": 1, "timeoutSeconds": 60}))
    cluster.wait_serving(namespace, "crash", 1)
    with LoadClient(cluster.api, namespace, "crash", workers=4) as load, \
            cluster.plain_clients(namespace, "crash") as plain:
        wait_for("first requests", lambda: load.stats.ok > 20 and plain.ok_everywhere(5))

        cluster.scale(namespace, "crash", 3)
        wait_for("scale-out in progress", lambda: (_phase(cluster, namespace, "crash") or ("", ""))[0] == "ScaleOut",
                 timeout=30, interval=0.2)
        operator.kill()
        time.sleep(3)
        operator.start()
        cluster.wait_serving(namespace, "crash", 3)

        cluster.scale(namespace, "crash", 1)
        wait_for("victims unpublished", lambda: (_phase(cluster, namespace, "crash") or ("", ""))
                 in {("ScaleIn", "Unpublishing"), ("ScaleIn", "Fencing"), ("ScaleIn", "Draining")},
                 timeout=30, interval=0.2)
        operator.kill()
        time.sleep(3)
        operator.start()
        cluster.wait_serving(namespace, "crash", 1)
        time.sleep(2)
    TALLY.requests += load.stats.sent
    TALLY.failed += load.stats.failed
    account_plain(plain)

    pods = cluster.pods(namespace, "crash")
    names = [p["metadata"]["name"] for p in pods]
    assert len(names) == len(set(names)) == 1
    status = cluster.pool(namespace, "crash")["status"]
    assert status["nextOrdinal"] == 3, "a retried create must reuse its name, never take a new ordinal"
    assert load.stats.failed == 0, load.stats.failures[:10]
    assert plain.stats.failed == 0, plain_report(plain)

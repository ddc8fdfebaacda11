"""The built-in autoscaler on the local cluster: a load ramp scales a pool out, silence scales it in.

Aspects: in mode Auto with an InFlight target the operator scrapes the replicas' sidecars,
writes spec.replicas through the scale subresource when the load ramps up (2 then 6 concurrent
clients against a target of 2 in flight per replica), and back down to minReplicas once the load
stops; no request fails on the way (scale-in drains); every applied change is recorded in
status.autoscaler.decisions and announced by a SuccessfulRescale Event.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from .harness import TALLY, Cluster, pool_manifest, wait_for
from .loadclient import LoadClient

AUTOSCALING = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "2"}}],
    # Windows shortened for test speed; the defaults (0 s up, 600 s down) are for GPU replicas.
    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10,
                               "policies": [{"type": "Pods", "value": 4, "periodSeconds": 10}]}},
}
# 20 ms per token and answers of ~25 tokens: each client keeps about one request in flight.
ENGINE = {"extraArgs": ["--sim-startup-seconds", "1", "--sim-ttft-ms", "5", "--sim-itl-ms", "20"]}


def _replicas(cluster: Cluster, namespace: str) -> int:
    return int(cluster.pool(namespace, "auto")["spec"]["replicas"])


def _decisions(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(((cluster.pool(namespace, "auto").get("status") or {}).get("autoscaler") or {}).get("decisions", []))


def test_load_ramp_scales_out_then_in_without_losing_a_request(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("auto", namespace, replicas=1, engine=ENGINE,
                                                            autoscaling=AUTOSCALING))
    cluster.wait_serving(namespace, "auto", 1)
    with LoadClient(cluster.api, namespace, "auto", workers=2, max_new_tokens=64) as base:
        wait_for("first requests", lambda: base.stats.ok > 20)
        with LoadClient(cluster.api, namespace, "auto", workers=4, max_new_tokens=64) as ramp:
            peak = wait_for("a scale-out to 3+ replicas", lambda: _replicas(cluster, namespace) >= 3 and
                            _replicas(cluster, namespace), timeout=60)
            cluster.wait_serving(namespace, "auto", _replicas(cluster, namespace), timeout=120)
            wait_for("traffic on the new replicas", lambda: len(ramp.stats.by_endpoint) >= peak, timeout=30)
    wait_for("a scale-in to minReplicas", lambda: _replicas(cluster, namespace) == 1, timeout=120)
    cluster.wait_serving(namespace, "auto", 1, timeout=120)
    for load in (base, ramp):
        TALLY.requests += load.stats.sent
        TALLY.failed += load.stats.failed
        assert load.stats.failed == 0, load.stats.failures[:10]
    applied = [(d["result"], d["applied"]) for d in _decisions(cluster, namespace) if d["applied"]]
    assert ("ScaleUp", True) in applied and ("ScaleDown", True) in applied, applied
    conditions = {c["type"]: c for c in cluster.pool(namespace, "auto")["status"]["conditions"]}
    assert conditions["ScalingActive"]["status"] == "True"
    assert conditions["AutoscalerOverridden"]["status"] == "False"
    events = client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items
    rescales = [e.message for e in events if e.reason == "SuccessfulRescale"]
    assert any("New size: 1" in m for m in rescales) and len(rescales) >= 2, rescales

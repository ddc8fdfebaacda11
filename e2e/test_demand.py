"""Demand hints and scale to zero on the local cluster (issue 34, without the activator yet).

Aspects: a trainer's hint sent with ``genrm_contract.demand.send`` to the pool's Service ClusterIP
pre-scales the pool before any load, at once rather than at the next autoscaler interval (the
interval here is 30 s), shows as ``status.autoscaler.demandFloor``, in the decision record and in
``kubectl describe``, and expires by itself; a person's hint through ``kubectl annotate`` does the
same; an idle pool with ``scaleToZero`` goes to zero replicas through an ordinary scale-in, while
the same pool without it stays at ``minReplicas``; a hint wakes the pool from zero and its answers
come back.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from genrm_contract.demand import DEMAND_ANNOTATION, send

from .harness import Cluster, pool_manifest, wait_for

BASE: dict[str, Any] = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 30,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "2"}}],
    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 5,
                               "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]}},
    "demand": {"replicaRequestsPerSecond": "1"},
}


def _autoscaler(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict((cluster.pool(namespace, name).get("status") or {}).get("autoscaler") or {})


def _replicas(cluster: Cluster, namespace: str, name: str) -> int:
    return int(cluster.pool(namespace, name)["spec"]["replicas"])


def test_a_hint_through_the_service_pre_scales_at_once_and_expires(cluster: Cluster, namespace: str) -> None:
    name = "hinted"
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1,
                                                            autoscaling={**BASE, "intervalSeconds": 30}))
    cluster.wait_serving(namespace, name, 1)
    url = cluster.service_answering(namespace, name)
    wait_for("a first decision", lambda: _autoscaler(cluster, namespace, name).get("desiredReplicas") == 1, 40)
    sent = time.monotonic()
    answer = send(url, requests=60, within=0, duration=20, hint_id="phase-1")  # 3 req/s at 1 per replica
    assert answer == {"id": "phase-1", "expiresInSeconds": 20}
    wait_for("spec.replicas raised by the hint", lambda: _replicas(cluster, namespace, name) == 3, 10)
    reacted = time.monotonic() - sent
    assert reacted < 5, f"the hint waited {reacted:.1f}s: it must not wait for the 30 s interval"
    status = _autoscaler(cluster, namespace, name)
    assert status["demandFloor"] == 3 and [h["id"] for h in status["demand"]] == ["phase-1"]
    assert any(d.get("demandFloor") == 3 and d["limitedBy"] == "DemandFloor" for d in status["decisions"])
    described = cluster.kubectl("describe", "genrmpool", name, "-n", namespace)
    assert "Demand Floor" in described and "phase-1" in described, described
    cluster.wait_serving(namespace, name, 3)
    judged = httpx.post(url + "/generate", json={"text": "warm?"}, timeout=30)
    assert judged.status_code == 200
    wait_for("the hint to expire", lambda: "demandFloor" not in _autoscaler(cluster, namespace, name), 60)
    assert _autoscaler(cluster, namespace, name)["demandSeen"] == ["phase-1"]
    print(f"\ndemand-e2e: hint_to_spec_s={reacted:.2f} floor=3")


def test_idle_pools_go_to_zero_only_with_scale_to_zero_and_an_annotated_hint_wakes_one(
        cluster: Cluster, namespace: str) -> None:
    zero, kept = "to-zero", "kept"
    # Advisory until both serve 2: idle from the start, an Auto pool may be scaled down (after the 5 s
    # window) before its scale-out counts both replicas as ready endpoints of its Service.
    for name, extra in ((zero, {"scaleToZero": {"idleSeconds": 30}}), (kept, {})):
        cluster.kubectl("apply", "-f", "-", input=pool_manifest(
            name, namespace, replicas=2, autoscaling={**BASE, "intervalSeconds": 2, "mode": "Advisory", **extra}))
    for name in (zero, kept):
        cluster.wait_serving(namespace, name, 2, timeout=120)
    for name in (zero, kept):
        cluster.kubectl("patch", "genrmpool", name, "-n", namespace, "--type", "merge", "-p",
                        json.dumps({"spec": {"autoscaling": {"mode": "Auto"}}}))
    started = time.monotonic()
    wait_for("the idle pool to reach zero", lambda: _replicas(cluster, namespace, zero) == 0, 90)
    idle_to_zero = time.monotonic() - started
    wait_for("its last pod to go", lambda: not cluster.pods(namespace, zero), 90)
    status = _autoscaler(cluster, namespace, zero)
    assert any(d["limitedBy"] == "IdleToZero" and d["desiredReplicas"] == 0 for d in status["decisions"]), status
    assert _replicas(cluster, namespace, kept) == 1, "without scaleToZero a pool stays at minReplicas"
    time.sleep(5)
    conditions = {c["type"]: c for c in cluster.pool(namespace, zero)["status"]["conditions"]}
    assert conditions["ScalingActive"]["reason"] == "ScaledToZero", conditions["ScalingActive"]
    assert _replicas(cluster, namespace, zero) == 0

    hint = json.dumps({"id": "by-hand", "requests": 10, "forSeconds": 10})
    woke = time.monotonic()
    cluster.kubectl("annotate", "--overwrite", "genrmpool", zero, "-n", namespace, f"{DEMAND_ANNOTATION}={hint}")
    wait_for("the pool to wake", lambda: _replicas(cluster, namespace, zero) == 1, 10)
    cluster.wait_serving(namespace, zero, 1, timeout=120)
    url = cluster.service_answering(namespace, zero)
    assert httpx.post(url + "/generate", json={"text": "awake?"}, timeout=30).status_code == 200
    print(f"\ndemand-e2e: idle_to_zero_s={idle_to_zero:.1f} annotate_to_serving_s={time.monotonic() - woke:.1f}")
    bad = cluster.kubectl("annotate", "--overwrite", "genrmpool", kept, "-n", namespace, f"{DEMAND_ANNOTATION}=nope")
    assert bad
    wait_for("the bad annotation to be reported",
             lambda: _autoscaler(cluster, namespace, kept).get("demandAnnotationError"), 40)

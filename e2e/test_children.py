"""The pool's Secret, Service and PodDisruptionBudget follow the spec on a running pool.

Aspects: a deleted Service and a deleted Secret come back (the Secret with the token the running
replicas hold); a changed spec.service.port and spec.disruptionBudget reach the existing objects,
and a disabled budget is deleted; a child the API server refuses (a pod mounting a volume the
template does not define, which the CRD schema cannot check) makes the pool Degraded with the API server's message
and posts a Warning event carrying it.
"""

from __future__ import annotations

import json
from typing import Any

from .harness import Cluster, pool_manifest, wait_for


def _get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def _patch(cluster: Cluster, namespace: str, pool: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "genrmpool", pool, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def test_deleted_children_are_repaired_and_spec_changes_reach_them(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("kids", namespace, replicas=1))
    cluster.wait_serving(namespace, "kids", 1)
    service, secret = _get(cluster, namespace, "service", "kids"), _get(cluster, namespace, "secret", "kids-control")
    assert service is not None and secret is not None

    cluster.kubectl("delete", "service", "kids", "-n", namespace)
    cluster.kubectl("delete", "secret", "kids-control", "-n", namespace)
    repaired = wait_for("the Service to be recreated", lambda: (
        s if (s := _get(cluster, namespace, "service", "kids")) and s["metadata"]["uid"] != service["metadata"]["uid"]
        else None))
    assert repaired["spec"]["ports"][0]["port"] == 8000
    token = wait_for("the Secret to be recreated", lambda: _get(cluster, namespace, "secret", "kids-control"))
    assert token["data"] == secret["data"], "the running replicas hold the old token"

    _patch(cluster, namespace, "kids", {"service": {"port": 9000}, "disruptionBudget": {"maxUnavailable": 2}})
    wait_for("the Service port to follow spec.service.port", lambda: [
        p["port"] for p in (_get(cluster, namespace, "service", "kids") or {"spec": {"ports": []}})["spec"]["ports"]
    ] == [9000])
    wait_for("the PDB to follow spec.disruptionBudget", lambda: (
        _get(cluster, namespace, "pdb", "kids") or {"spec": {}})["spec"].get("maxUnavailable") == 2)
    assert cluster.plain_clients(namespace, "kids").base_url.endswith(":9000")

    _patch(cluster, namespace, "kids", {"disruptionBudget": {"enabled": False}})
    wait_for("the disabled PDB to be deleted", lambda: _get(cluster, namespace, "pdb", "kids") is None)


def test_a_child_the_api_server_refuses_makes_the_pool_degraded_with_a_warning(
        cluster: Cluster, namespace: str) -> None:
    body = json.loads(pool_manifest("broken", namespace, replicas=1))
    body["spec"]["template"] = {"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))

    def degraded() -> dict[str, Any] | None:
        conditions = (cluster.pool(namespace, "broken").get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)
    condition = wait_for("Degraded=True", degraded, timeout=60)
    assert condition["reason"] == "ChildFailed"
    assert "Pod broken-0" in condition["message"] and "volumeMounts[0].name" in condition["message"]

    def warning() -> dict[str, Any] | None:
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                                            "--field-selector", "involvedObject.name=broken"))["items"]
        return next((e for e in events if e["reason"] == "ChildFailed"), None)
    event = wait_for("a ChildFailed event", warning, timeout=60)
    assert event["type"] == "Warning" and "volumeMounts[0].name" in event["message"]

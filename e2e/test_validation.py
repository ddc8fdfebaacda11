"""Invalid pools are rejected by the API server with a message naming the field.

Aspects: negative replicas, minReplicas > maxReplicas, changing an immutable
field, an unknown field, a wrong type.
"""

from __future__ import annotations

import json

from .harness import Cluster, pool_manifest


def _with(namespace: str, **spec: object) -> str:
    body = json.loads(pool_manifest("bad", namespace))
    body["spec"].update(spec)
    return json.dumps(body)


def test_negative_replicas_are_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, replicas=-1))
    assert "spec.replicas" in error


def test_min_above_max_is_rejected(cluster: Cluster, namespace: str) -> None:
    autoscaling = {"mode": "Auto", "minReplicas": 5, "maxReplicas": 2,
                   "metrics": [{"type": "InFlight", "target": {"type": "AverageValue", "averageValue": "4"}}]}
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, autoscaling=autoscaling))
    assert "spec.autoscaling" in error and "minReplicas" in error


def test_changing_an_immutable_field_is_rejected(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("bad", namespace, replicas=0))
    patch = json.dumps({"spec": {"engine": {"seed": 8}}})
    error = cluster.kubectl_fails("patch", "genrmpool", "bad", "-n", namespace, "--type=merge", "-p", patch)
    assert "spec.engine.seed" in error and "create a new GenRMPool" in error


def test_an_unknown_field_is_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, replicaz=3))
    assert "replicaz" in error


def test_a_wrong_type_is_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, replicas="three"))
    assert "spec.replicas" in error

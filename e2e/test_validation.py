"""Invalid pools are rejected by the API server with a message naming the field.

Aspects: negative replicas, minReplicas > maxReplicas, changing an immutable
field, an unknown field, a wrong type; what the pool's children would be refused
for: invalid label keys and values in the template and nodeSelector, an env entry
without a name, a malformed resource quantity, a pool name too long for its
children's labels or not a DNS-1035 label (its Service's name); an API key in the engine's
arguments (any spelling SGLang reads as --api-key or --admin-api-key), refused with a pointer to
spec.engine.apiKey, and a --config of one's own beside apiKey.
"""

from __future__ import annotations

import json

import pytest

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


def test_a_connection_age_that_would_turn_keep_alive_off_is_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(
        namespace, gateway={"limits": {"maxConnectionAgeSeconds": 2}}))
    assert "spec.gateway.limits.maxConnectionAgeSeconds" in error and "at least 10" in error
    for fine in (0, 10, 300):
        cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                        input=_with(namespace, gateway={"limits": {"maxConnectionAgeSeconds": fine}}))


def test_changing_an_immutable_field_is_rejected(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("bad", namespace, replicas=0))
    patch = json.dumps({"spec": {"engine": {"seed": 8}}})
    error = cluster.kubectl_fails("patch", "genrmpool", "bad", "-n", namespace, "--type=merge", "-p", patch)
    assert "spec.engine.seed" in error and "create a new GenRMPool" in error


def test_the_judge_changes_in_place_only_under_blue_green(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("judged", namespace, replicas=0))
    patch = json.dumps({"spec": {"model": {"path": "judge-v2"}}})
    error = cluster.kubectl_fails("patch", "genrmpool", "judged", "-n", namespace, "--type=merge", "-p", patch)
    assert "spec.model" in error and "spec.judgeUpdate.strategy=BlueGreen" in error
    blue_green = json.dumps({"spec": {"judgeUpdate": {"strategy": "BlueGreen"}, "model": {"path": "judge-v2"}}})
    cluster.kubectl("patch", "genrmpool", "judged", "-n", namespace, "--type=merge", "-p", blue_green,
                    "--dry-run=server")


def test_an_unknown_field_is_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, replicaz=3))
    assert "replicaz" in error


def test_a_wrong_type_is_rejected(cluster: Cluster, namespace: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=_with(namespace, replicas="three"))
    assert "spec.replicas" in error


def test_a_key_in_the_engines_arguments_is_refused_with_a_pointer_to_api_key(cluster: Cluster, namespace: str) -> None:
    def applied(**engine: object) -> str:
        return cluster.kubectl("apply", "--dry-run=server", "-f", "-", check=False,
                               input=pool_manifest("bad", namespace, engine=engine))

    for field, args in (("extraArgs", ["--api-key", "s3cret"]), ("extraArgs", ["--api-k=s3cret"]),
                        ("args", ["--model-path", "m", "--admin-api-key", "s3cret"])):
        error = applied(**{field: args})
        assert f"spec.engine.{field}" in error and "spec.engine.apiKey" in error, error
    key = {"secretKeyRef": {"name": "judge-key", "key": "apiKey"}}
    assert "reads one only" in applied(apiKey=key, extraArgs=["--config", "/etc/sglang.yaml"])
    for fine in ({"extraArgs": ["--config", "/etc/sglang.yaml"]}, {"apiKey": key, "extraArgs": ["--apikey"]}):
        assert "created (server dry run)" in applied(**fine), fine


@pytest.mark.parametrize(("spec", "field"), [
    ({"template": {"labels": {"bad key!": "x"}}}, "spec.template.labels"),
    ({"template": {"labels": {"team": "v" * 64}}}, "spec.template.labels"),
    ({"template": {"nodeSelector": {"gpu": "a100 80gb"}}}, "spec.template.nodeSelector"),
    ({"engine": {"env": [{"value": "1"}]}}, "spec.engine.env[0].name"),
    ({"engine": {"resources": {"limits": {"memory": "4 GB"}}}}, "spec.engine.resources.limits.memory"),
    ({"gateway": {"resources": {"requests": {"cpu": "half"}}}}, "spec.gateway.resources.requests.cpu"),
], ids=["label-key", "label-value-length", "node-selector-value", "env-without-name", "engine-quantity",
        "gateway-quantity"])
def test_what_a_child_would_be_refused_for_is_rejected(cluster: Cluster, namespace: str, spec: dict[str, object],
                                                       field: str) -> None:
    body = json.loads(pool_manifest("bad", namespace))
    for key, value in spec.items():
        body["spec"].setdefault(key, {}).update(value)
    error = cluster.kubectl_fails("apply", "-f", "-", input=json.dumps(body))
    assert field in error


@pytest.mark.parametrize(("name", "why"), [("p" * 64, "at most 63"), ("judge.v2", "DNS-1035")])
def test_a_pool_name_its_children_cannot_carry_is_rejected(cluster: Cluster, namespace: str, name: str,
                                                           why: str) -> None:
    error = cluster.kubectl_fails("apply", "-f", "-", input=pool_manifest(name, namespace))
    assert "metadata.name" in error and why in error

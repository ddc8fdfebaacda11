"""Tests of the GenRMPool API: the generated CRD and the pydantic models behind it.

Aspects under test:
- the committed CRD (crds/ and the Helm chart's copy) is byte-identical to what
  ``genrm_operator.crdgen.render()`` generates, and ``--check`` agrees;
- names, scope, short name and category; status and scale subresources whose paths exist in
  the schema with the right types;
- the schema is structural: no $ref, no anyOf with null, no additionalProperties: false, no
  title/const leftovers, every property and array item has a type or preserves unknown fields;
- printer columns like ``kubectl get deploy`` pointing at schema fields;
- CEL rules: transition rules with a "create a new GenRMPool" message on every field that
  changes what a replica answers, cross-field rules (timeouts, GPUs vs tensor parallelism,
  autoscaling min <= max), each referring only to properties of its own object;
- defaults and minimums (replicas >= 0), descriptions for ``kubectl explain``;
- pydantic rejects unknown fields and negative replicas, and speaks camelCase on the wire.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from genrm_operator import crdgen
from genrm_operator.api.pool import GenRMPoolSpec, GenRMPoolStatus
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[2]
COMMITTED = [REPO / "crds" / "genrm.io_genrmpools.yaml",
             REPO / "charts" / "genrm-operator" / "crds" / "genrm.io_genrmpools.yaml"]
Node = dict[str, Any]


@pytest.fixture(scope="module")
def crd() -> Node:
    doc = yaml.safe_load(crdgen.render())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def root(crd: Node) -> Node:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Node]]:
    """Every schema node with its path."""
    if isinstance(node, dict):
        yield path, node
        for name, prop in (node.get("properties") or {}).items():
            yield from walk(prop, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")
        for i, option in enumerate(node.get("anyOf") or []):
            yield from walk(option, f"{path}|{i}")


def at(root: Node, dotted: str) -> Node:
    node = root
    for part in dotted.strip(".").split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_committed_crd_is_exactly_what_the_models_generate(path: Path) -> None:
    assert path.read_text() == crdgen.render(), "stale CRD: run `make crds`"


def test_the_generator_check_passes_and_rendering_is_stable() -> None:
    assert crdgen.main(["--check"]) == 0
    assert crdgen.render() == crdgen.render()


def test_names_scope_and_subresources(crd: Node, root: Node) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "genrmpools.genrm.io"
    assert (spec["group"], spec["scope"]) == ("genrm.io", "Namespaced")
    names = spec["names"]
    assert (names["kind"], names["plural"], names["singular"]) == ("GenRMPool", "genrmpools", "genrmpool")
    assert names["shortNames"] and "genrm" in names["categories"]
    version = spec["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["status"] == {}
    scale = version["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    assert at(root, scale["specReplicasPath"])["type"] == "integer"
    assert at(root, scale["statusReplicasPath"])["type"] == "integer"
    assert at(root, scale["labelSelectorPath"])["type"] == "string"


def test_the_schema_is_structural(root: Node) -> None:
    assert root["type"] == "object" and "spec" in root["required"]
    for path, node in walk(root):
        assert "$ref" not in node and "$defs" not in node, path
        assert "title" not in node and "const" not in node and "nullable" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert not any(o.get("type") == "null" for o in node.get("anyOf") or []), path
        if "|" not in path:  # Kubernetes: a type on every node but int-or-string and preserved ones
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields") is True or (
                node.get("x-kubernetes-int-or-string") is True and node.get("anyOf") == [
                    {"type": "integer"}, {"type": "string"}]), path
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), path
        if node.get("type") == "object" and node is not root and path != ".metadata":
            assert ("properties" in node or "additionalProperties" in node
                    or node.get("x-kubernetes-preserve-unknown-fields") is True), path


def test_every_spec_and_status_field_is_described_for_kubectl_explain(root: Node) -> None:
    for top in ("spec", "status"):
        for path, node in walk(root["properties"][top], f".{top}"):
            if "|" in path or path.endswith("[]") or path.endswith("{}"):
                continue
            assert node.get("description"), path


def test_printer_columns_read_like_kubectl_get_deploy(crd: Node, root: Node) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    by_name = {c["name"]: c for c in columns}
    for name in ("Desired", "Current", "Ready", "Serving", "Operation", "Age"):
        assert name in by_name and by_name[name].get("priority", 0) == 0, name
    assert by_name["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for column in columns:
        path = column["jsonPath"]
        if path.startswith((".spec.", ".status.")) and "[" not in path:
            node = at(root, path)
            expected = {"integer": "integer", "string": "string"}[column["type"]]
            assert node["type"] == expected, path


JUDGE_FIELDS = ["model", "engine.image", "engine.command", "engine.args", "engine.extraArgs", "engine.seed",
                "engine.deterministic", "engine.tensorParallelSize"]


def rules_at(root: Node, dotted: str) -> list[Node]:
    return list(at(root, dotted).get("x-kubernetes-validations") or [])


@pytest.mark.parametrize("field", JUDGE_FIELDS)
def test_fields_that_change_the_answers_change_only_blue_green_with_a_helpful_message(root: Node, field: str) -> None:
    rule = next(r for r in rules_at(root, ".spec")
                if r["rule"] == f"self.judgeUpdate.strategy == 'BlueGreen' || self.{field} == oldSelf.{field}")
    assert rule["fieldPath"] == f".{field}"
    assert "immutable" in rule["message"] and "create a new GenRMPool" in rule["message"]
    assert "spec.judgeUpdate.strategy=BlueGreen" in rule["message"]
    assert not [r for r in rules_at(root, ".spec.engine") if "oldSelf" in r["rule"]]  # no rule left unconditional


def test_cross_field_rules_keep_timeouts_gpus_and_autoscaling_bounds_consistent(root: Node) -> None:
    all_rules = [r["rule"] for _, node in walk(root) for r in node.get("x-kubernetes-validations") or []]
    assert "self.timeoutSeconds > self.propagationSeconds + self.quietSeconds" in all_rules
    assert "self.gpusPerReplica >= self.tensorParallelSize" in all_rules
    assert any("minReplicas" in r and "maxReplicas" in r and "<=" in r for r in all_rules), all_rules


def test_cel_rules_only_refer_to_properties_of_their_own_object(root: Node) -> None:
    for path, node in walk(root):
        for rule in node.get("x-kubernetes-validations") or []:
            assert rule["message"], path
            for name in re.findall(r"\b(?:self|oldSelf)\.([A-Za-z]+)\b(?!\()", rule["rule"]):  # not all(), size()
                assert name in node.get("properties", {}), (path, rule["rule"], name)


def test_replicas_defaults_and_minimums(root: Node) -> None:
    replicas = at(root, ".spec.replicas")
    assert replicas["type"] == "integer" and replicas["minimum"] == 0 and replicas["default"] == 1
    assert at(root, ".spec.drain.onTimeout")["enum"] == ["Fail", "Force"]
    assert at(root, ".spec.drain.onTimeout")["default"] == "Fail"
    assert at(root, ".spec.engine.deterministic")["default"] is True
    assert at(root, ".spec.engine.gpusPerReplica")["default"] == 1
    engine_default = at(root, ".spec.engine")["default"]
    assert isinstance(engine_default, dict), "nested defaults apply to an omitted engine block"
    assert engine_default.get("deterministic", True) is True
    assert all("default" not in node for _, node in walk(root["properties"]["status"])), "status has no defaults"
    conditions = at(root, ".status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_pydantic_rejects_unknown_fields_like_strict_field_validation() -> None:
    with pytest.raises(ValidationError, match="replica"):
        GenRMPoolSpec.model_validate({"replica": 2, "model": {"path": "m"}})
    with pytest.raises(ValidationError, match="randomSeed"):
        GenRMPoolSpec.model_validate({"model": {"path": "m"}, "engine": {"randomSeed": 1}})
    with pytest.raises(ValidationError):
        GenRMPoolStatus.model_validate({"servingReplica": 1})


@pytest.mark.parametrize("wire", [
    {"replicas": -1, "model": {"path": "m"}},
    {"replicas": 1, "model": {"path": ""}},
    {"replicas": 1, "model": {"path": "m"}, "drain": {"onTimeout": "Ignore"}},
    {"replicas": 1, "model": {"path": "m"}, "engine": {"seed": -3}},
    {"replicas": 1},
])
def test_pydantic_rejects_invalid_specs(wire: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GenRMPoolSpec.model_validate(wire)


def test_the_models_speak_camel_case_and_fill_defaults() -> None:
    spec = GenRMPoolSpec.model_validate({"replicas": 0, "model": {"path": "m", "servedName": "judge"},
                                         "drain": {"onTimeout": "Force", "timeoutSeconds": 60}})
    assert spec.model.served_name == "judge" and spec.drain.on_timeout == "Force"
    assert spec.engine.deterministic and spec.engine.gpus_per_replica == 1 and spec.replicas == 0
    wire = spec.to_wire()
    assert wire["model"]["servedName"] == "judge" and wire["drain"]["timeoutSeconds"] == 60
    assert GenRMPoolSpec.model_validate(wire) == spec

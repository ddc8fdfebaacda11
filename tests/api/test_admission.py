"""Admission rules for what the pool's children would otherwise be refused for at runtime.

Aspects under test (the same rules run against a real API server in e2e/test_validation.py):
- the label key and value syntax Kubernetes uses, on spec.template.labels and nodeSelector, in the
  CRD (CEL for keys, pattern and maxLength for values) and in pydantic (values);
- resource quantities in the engine's and the gateway's limits and requests, integers allowed;
- env entries need a name;
- the pool name: at most 63 characters (its children's instance label) and a DNS-1035 label
  (its Service's name).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from genrm_operator import crdgen
from genrm_operator.api.pool import MAX_NAME_LENGTH, NAME_RULES, GenRMPoolSpec
from genrm_operator.api.spec import LABEL_KEY, LABEL_VALUE, QUANTITY
from pydantic import ValidationError

SPEC = yaml.safe_load(crdgen.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def at(*path: str) -> dict[str, Any]:
    node: dict[str, Any] = SPEC
    for part in path:
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("key", ["app", "genrm.io/tier", "a.b-c/D_e.f", "x" * 63])
def test_valid_label_keys_match(key: str) -> None:
    assert re.match(LABEL_KEY, key)


@pytest.mark.parametrize("key", ["-a", "a/", "Bad.Prefix/x", "x" * 64, "bad key!", "/x"])
def test_invalid_label_keys_do_not_match(key: str) -> None:
    assert not re.match(LABEL_KEY, key)


@pytest.mark.parametrize("field", ["labels", "nodeSelector"])
def test_label_maps_check_keys_with_cel_and_values_with_the_schema(field: str) -> None:
    node = at("spec", "template", field)
    [rule] = node["x-kubernetes-validations"]
    assert LABEL_KEY in rule["rule"] and rule["rule"].startswith("self.all(k, ")
    assert node["additionalProperties"] == {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}


@pytest.mark.parametrize("template", [{"labels": {"team": "v" * 64}}, {"labels": {"team": "a b"}},
                                      {"nodeSelector": {"gpu": "a100 80gb"}}])
def test_pydantic_rejects_label_values_the_api_server_refuses(template: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GenRMPoolSpec.model_validate({"model": {"path": "m"}, "template": template})


@pytest.mark.parametrize("quantity", ["1", "500m", "4Gi", "1e3", ".5", "+1.5G"])
def test_quantities_match(quantity: str) -> None:
    assert re.match(QUANTITY, quantity)


@pytest.mark.parametrize("quantity", ["4 GB", "half", "1GiB", ""])
def test_malformed_quantities_do_not_match(quantity: str) -> None:
    assert not re.match(QUANTITY, quantity)


@pytest.mark.parametrize("container", ["engine", "gateway"])
def test_resources_take_integers_or_quantity_strings(container: str) -> None:
    resources = at("spec", container, "resources")
    assert resources.get("x-kubernetes-preserve-unknown-fields") is True  # claims pass through
    for part in ("limits", "requests"):
        assert resources["properties"][part]["additionalProperties"] == {
            "anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY,
            "x-kubernetes-int-or-string": True}


def test_env_entries_need_a_name() -> None:
    item = at("spec", "engine", "env")["items"]
    assert item["required"] == ["name"] and item["properties"]["name"]["minLength"] == 1


def test_the_pool_name_fits_its_childrens_labels_and_service_name() -> None:
    assert SPEC["x-kubernetes-validations"] == NAME_RULES["x-kubernetes-validations"]
    [length, syntax] = NAME_RULES["x-kubernetes-validations"]
    assert length["rule"] == f"self.metadata.name.size() <= {MAX_NAME_LENGTH}" and MAX_NAME_LENGTH == 63
    pattern = re.search(r"matches\('(.*)'\)", syntax["rule"])
    assert pattern is not None
    assert re.match(pattern.group(1), "judge-7b") and not re.match(pattern.group(1), "judge.v2")
    assert not re.match(pattern.group(1), "7b-judge") and "DNS-1035" in syntax["message"]

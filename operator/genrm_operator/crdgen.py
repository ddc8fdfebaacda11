"""Generate the GenRMPool CustomResourceDefinition from the pydantic models.

Usage: ``python -m genrm_operator.crdgen`` (what ``make crds`` runs) rewrites
``crds/genrm.io_genrmpools.yaml`` and the Helm chart's copy;
``--check`` exits non-zero when either committed file differs.

Why generate: the API server's validation, defaults and ``kubectl explain``
text must be exactly what the operator parses. pydantic's JSON Schema is not a
structural schema, so this module inlines ``$ref``s, turns optional unions into
plain optional fields, marks free-form Kubernetes objects with
``x-kubernetes-preserve-unknown-fields`` and materialises ``default_factory``
defaults so the API server fills in whole nested objects.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from .api.pool import GROUP, KIND, NAME_RULES, PLURAL, VERSION, GenRMPoolSpec, GenRMPoolStatus

REPO = Path(__file__).resolve().parents[2]
TARGETS = (
    REPO / "crds" / f"{GROUP}_{PLURAL}.yaml",
    REPO / "charts" / "genrm-operator" / "crds" / f"{GROUP}_{PLURAL}.yaml",
)
Schema = dict[str, Any]

PRINTER_COLUMNS = [
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Requested replicas"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas", "description": "Replica pods"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Ready replicas"},
    {"name": "Serving", "type": "integer", "jsonPath": ".status.servingReplicas",
     "description": "Replicas published and ready endpoints of the Service"},
    {"name": "Up-to-date", "type": "integer", "jsonPath": ".status.updatedReplicas",
     "description": "Replicas made from the current pod template"},
    {"name": "Operation", "type": "string", "jsonPath": ".status.operation.type",
     "description": "Active operation (ScaleOut, ScaleIn, Rollout, JudgeSwitch)"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.operation.phase",
     "description": "Phase of the active operation"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.path", "priority": 1,
     "description": "Judge model"},
    {"name": "Judge", "type": "string", "jsonPath": ".status.judge.active", "priority": 1,
     "description": "The judge revision the pool's Service serves"},
    {"name": "Available", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].status',
     "priority": 1, "description": "Available condition"},
]


class _PlainDumper(yaml.SafeDumper):
    """Writes a schema used twice (an enum shared by two fields) out in full each time: a CRD
    with YAML anchors and aliases is valid, but hard to read and to diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _resolve(node: Schema, defs: Schema) -> Schema:
    """Inline a ``$ref`` (keeping the referring node's own keys, e.g. its description)."""
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        node = {**target, **node}
    return node


def _nullable(node: Schema) -> bool:
    """An ``X | None`` field: absent means off, so it must not get an implicit ``{}`` default."""
    return any(option.get("type") == "null" for option in node.get("anyOf", []))


def _structural(node: Any, defs: Schema) -> Any:
    """Rewrite one pydantic schema node into a Kubernetes structural schema node."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = _resolve(dict(node), defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) == 1:
            node = {**_resolve(dict(options[0]), defs), **node}
            if node.get("default", 0) is None:
                node.pop("default")
        else:
            node["anyOf"] = options
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(flag), int | float) and not isinstance(node[flag], bool):
            # pydantic writes JSON Schema 2020's numeric form; Kubernetes wants OpenAPI v3.0's flag
            node[bound], node[flag] = node[flag], True
    node.pop("title", None)
    extra = node.pop("additionalProperties", None)
    if node.get("type") == "object" and "properties" not in node:
        if isinstance(extra, dict) and extra:
            node["additionalProperties"] = extra
        else:
            node["x-kubernetes-preserve-unknown-fields"] = True
    out = {k: _structural(v, defs) if k in ("properties", "items", "additionalProperties", "anyOf") else v
           for k, v in node.items()}
    if "properties" in out:
        out["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
    return out


def _wire(value: Any) -> Any:
    """A default value as it appears on the wire (camelCase, no unset optionals)."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    return value


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Model classes inside a field annotation (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _factory_defaults(schema: Schema, model: type[BaseModel]) -> None:
    """Materialise ``default_factory`` defaults, which pydantic leaves out of its schema.

    The API server validates a default against the schema and its CEL rules as
    is, so a nested object's default must be the complete default object, not ``{}``.
    """
    properties = schema.get("properties", {})
    for name, field in model.model_fields.items():
        prop = properties.get(field.alias or name)
        if prop is None:
            continue
        if field.default_factory is not None and "default" not in prop:
            prop["default"] = _wire(field.default_factory())  # type: ignore[call-arg]
        for nested in _models_in(field.annotation):
            target = prop.get("items", prop)
            if "properties" in target:
                _factory_defaults(target, nested)


def openapi_schema(model: type[BaseModel], *, defaults: bool = True) -> Schema:
    """Structural schema of one root model (spec or status)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: Schema = _structural(raw, defs)
    _factory_defaults(schema, model)
    if not defaults:
        _strip_defaults(schema)
    return schema


def _strip_defaults(node: Any) -> None:
    """Status is written by the operator only; defaults there would only hide missing writes."""
    if isinstance(node, dict):
        node.pop("default", None)
        for value in node.values():
            _strip_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _strip_defaults(value)


def crd() -> Schema:
    """The whole CustomResourceDefinition object."""
    root: Schema = {
        "type": "object",
        "description": "GenRMPool runs identical GenRM judge replicas (SGLang engine plus gateway sidecar, "
                       "one GPU pod each) and scales them without losing requests.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": openapi_schema(GenRMPoolSpec),
            "status": openapi_schema(GenRMPoolStatus, defaults=False),
        },
        **NAME_RULES,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "genrm-operator", "app.kubernetes.io/part-of": "genrm-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": "genrmpool",
                "shortNames": ["grp"], "categories": ["genrm"],
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render() -> str:
    """The CRD as committed YAML text."""
    header = "# Generated by `make crds` (python -m genrm_operator.crdgen) from the pydantic models. Do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_PlainDumper, sort_keys=False, width=120)


def write_or_check(argv: list[str] | None, what: str, targets: list[Path], text: str, make_target: str) -> int:
    """The generators' command line: write ``text`` to every target, or with ``--check`` exit 1
    naming each target that differs (so ``make test`` fails on a stale generated file)."""
    parser = argparse.ArgumentParser(description=f"Write or check {what}.")
    parser.add_argument("--check", action="store_true", help=f"fail if the committed {what} is stale")
    args = parser.parse_args(argv)
    stale = [p for p in targets if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run `make {make_target}`", file=sys.stderr)
        return 1 if stale else 0
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Write or check the generated CRD files."""
    return write_or_check(argv, "CRD", list(TARGETS), render(), "crds")


if __name__ == "__main__":
    sys.exit(main())

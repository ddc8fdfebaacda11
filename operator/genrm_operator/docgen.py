"""Generate ``docs/reference.md``, the GenRMPool field reference, from the pydantic models.

Usage: ``python -m genrm_operator.docgen`` (what ``make docs`` runs) rewrites ``docs/reference.md``;
``--check`` exits non-zero when the committed file differs (``tests/api/test_reference_docs.py``
fails ``make test`` the same way).

Why render the CRD rather than the models directly: the reference is read from
:func:`genrm_operator.crdgen.crd`, the very schema the API server validates with, so each field's
type, default, bounds, CEL rules and description here are the ones admission and ``kubectl
explain`` use, and a change to a model reaches this page only through ``make docs``.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

from . import crdgen

TARGET = crdgen.REPO / "docs" / "reference.md"
Node = dict[str, Any]

INTRO = """\
Every field of the `GenRMPool` custom resource, with its type, default, validation and meaning,
generated from the pydantic models in `operator/genrm_operator/api/` through the same schema as
the CRD (`crds/`). `kubectl explain genrmpool.spec --recursive` prints the same descriptions from
the cluster.

Immutable fields are enforced by CEL transition rules: changing one is rejected with a message
telling you to create a new pool — a reward model must never mix two judges. The judge fields
(`model` and the engine's image, command, arguments, seed, determinism and tensor parallelism)
change under `judgeUpdate.strategy: BlueGreen` only, as a new judge revision beside the serving one
([judge-changes.md](judge-changes.md)). Unknown fields, wrong
types, negative replicas, `minReplicas > maxReplicas`, inconsistent drain timeouts and seeded
verification of a non-deterministic engine are rejected by the API server with a message naming
the field. The rules are listed under the object they belong to.

What the fields do together is explained in the concept pages: the scale-operation state machine
and rollouts ([state-machine.md](state-machine.md)), the gateway and its limits
([gateway.md](gateway.md)), the built-in autoscaler ([autoscaling.md](autoscaling.md)).
"""


def _text(value: str) -> str:
    """One table cell: docstring line breaks become spaces, and a pipe cannot end the cell."""
    return " ".join(value.split()).replace("|", "\\|")


def _code(value: Any) -> str:
    """A value as inline code (JSON for anything but a plain string) safe inside a table cell."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`"


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _is_object(node: Node) -> bool:
    """A node documented in a section of its own: an object with named fields."""
    return "properties" in node


def _type(node: Node, path: str) -> str:
    """The type column: scalar types, links to nested objects' sections, lists and maps."""
    if node.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if "anyOf" in node and "type" not in node:
        return " or ".join(_type(option, path) for option in node["anyOf"])
    kind = node.get("type", "object")
    if kind == "array":
        return "list of " + _type(node.get("items", {}), path + "[]")
    if _is_object(node):
        return f"[object](#{anchor(path)})"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map of string to " + _type(node["additionalProperties"], path + "{}")
    if kind == "object":
        return "object (free-form)"
    return str(kind)


def _bounds(node: Node) -> list[str]:
    """Numeric bounds as one interval (``1 to 65535``, ``> 0, ≤ 3600``)."""
    low, high = node.get("minimum"), node.get("maximum")
    open_low = node.get("exclusiveMinimum") is True
    open_high = node.get("exclusiveMaximum") is True
    if low is not None and high is not None and not open_low and not open_high:
        return [f"{low} to {high}"]
    out = []
    if low is not None:
        out.append(f"{'>' if open_low else '≥'} {low}")
    if high is not None:
        out.append(f"{'<' if open_high else '≤'} {high}")
    return out


def _constraints(node: Node, required: bool) -> list[str]:
    """The validation column: what the API server refuses for this field's own value."""
    out = ["required"] if required else []
    out += _bounds(node)
    if "enum" in node:
        out.append("one of " + ", ".join(_code(v) for v in node["enum"]))
    low, high = node.get("minLength"), node.get("maxLength")
    if low is not None and high is not None:
        out.append(f"length {low} to {high}")
    elif low is not None:
        out.append(f"length ≥ {low}")
    elif high is not None:
        out.append(f"length ≤ {high}")
    if "minItems" in node:
        out.append(f"≥ {node['minItems']} items")
    if "maxItems" in node:
        out.append(f"≤ {node['maxItems']} items")
    if "maxProperties" in node:
        out.append(f"≤ {node['maxProperties']} entries")
    if "pattern" in node:
        out.append("pattern " + _code(node["pattern"]))
    if node.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(_code(k) for k in node.get("x-kubernetes-list-map-keys", []))
        out.append(f"one entry per {keys}")
    items = node.get("items")
    if isinstance(items, dict) and not _is_object(items):
        out += [f"each item: {c}" for c in _constraints(items, False)]
    values = node.get("additionalProperties")
    if isinstance(values, dict) and not _is_object(values):
        out += [f"each value: {c}" for c in _constraints(values, False)]
    return out


def _default(node: Node) -> str:
    """The default column (empty when the field has none)."""
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, dict) and value and _is_object(node):
        return "each field's default"
    return _code(value)


def _rules(node: Node) -> list[str]:
    """CEL rules on an object, as list items: the rule and the message the API server answers with."""
    out = []
    for rule in node.get("x-kubernetes-validations", []):
        where = f" (reported at `{rule['fieldPath'].lstrip('.')}`)" if "fieldPath" in rule else ""
        out.append(f"- `{rule['rule']}`{where}: {' '.join(rule['message'].split())}")
    return out


def _nested(node: Node, path: str) -> Iterator[tuple[str, Node]]:
    """The objects with named fields under ``node``'s fields, each with its section path."""
    for name, field in node.get("properties", {}).items():
        child, child_path = field, f"{path}.{name}"
        while child.get("type") == "array" and isinstance(child.get("items"), dict):
            child, child_path = child["items"], child_path + "[]"
        if _is_object(child):
            yield child_path, child


@functools.cache
def _judge_fields() -> frozenset[str]:
    """The spec's judge fields (``spec.model``, ``spec.engine.seed``, ...): immutable unless the pool's
    judge update is BlueGreen, by one transition rule each on the spec."""
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pattern = r"self\.judgeUpdate\.strategy == 'BlueGreen' \|\| self\.([\w.]+) == oldSelf\.\1"
    return frozenset(f"spec.{m.group(1)}" for rule in spec.get("x-kubernetes-validations", [])
                     if (m := re.fullmatch(pattern, rule["rule"])))


def _section(path: str, node: Node, *, defaults: bool, level: int, intro: str = "") -> list[str]:
    """One object's heading, description, field table and rules, then its nested objects' sections."""
    lines = [f"{'#' * level} {path}", ""]
    if intro:
        lines += [intro, ""]
    if node.get("description"):
        lines += [" ".join(node["description"].split()), ""]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        lines += ["Fields other than these are kept as given (a Kubernetes core type passed through).", ""]
    required = set(node.get("required", []))
    immutable = {m.group(1) for rule in node.get("x-kubernetes-validations", [])
                 if (m := re.fullmatch(r"self\.(\w+) == oldSelf\.\1", rule["rule"]))}
    immutable |= {name for name in node["properties"] if f"{path}.{name}" in _judge_fields()}
    header = ["field", "type", *(["default"] if defaults else []), "validation", "description"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, field in node["properties"].items():
        checks = ["immutable"] * (name in immutable) + _constraints(field, name in required)
        row = [f"`{name}`", _type(field, f"{path}.{name}"), *([_default(field)] if defaults else []),
               "; ".join(checks), _text(field.get("description", ""))]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    rules = _rules(node)
    if rules:
        lines += ["Rules the API server checks on this object:", "", *rules, ""]
    for child_path, child in _nested(node, path):
        lines += _section(child_path, child, defaults=defaults, level=min(level + 1, 4))
    return lines


def render() -> str:
    """The whole reference page as committed Markdown."""
    crd = crdgen.crd()
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    scale = version["subresources"]["scale"]
    lines = [
        "<!-- Generated by `make docs` (python -m genrm_operator.docgen) from the pydantic models. Do not edit. -->",
        f"# GenRMPool reference (`{crd['spec']['group']}/{version['name']}`)",
        "",
        INTRO,
        "## The resource",
        "",
        "| | |",
        "|---|---|",
        f"| API version | `{crd['spec']['group']}/{version['name']}` |",
        f"| kind | `{names['kind']}` (list: `{names['listKind']}`) |",
        f"| plural, singular | `{names['plural']}`, `{names['singular']}` |",
        f"| short names | {', '.join(_code(n) for n in names['shortNames'])} |",
        f"| categories | {', '.join(_code(c) for c in names['categories'])} |",
        f"| scope | {crd['spec']['scope']} |",
        "| subresources | `status`; `scale` (replicas `{}`, current `{}`, selector `{}`) |".format(
            scale["specReplicasPath"], scale["statusReplicasPath"], scale["labelSelectorPath"]),
        "",
        " ".join(root["description"].split()),
        "",
        "Rules the API server checks on the whole object:",
        "",
        *_rules(root),
        "",
        "### Columns of `kubectl get genrmpools`",
        "",
        "`-o wide` adds the columns of priority 1.",
        "",
        "| column | type | JSONPath | priority | description |",
        "|---|---|---|---|---|",
        *(f"| {c['name']} | {c['type']} | {_code(c['jsonPath'])} | {c.get('priority', 0)} | "
          f"{_text(c.get('description', ''))} |" for c in version["additionalPrinterColumns"]),
        "",
        *_section("spec", root["properties"]["spec"], defaults=True, level=2,
                  intro="What the user writes; the API server fills in the defaults."),
        *_section("status", root["properties"]["status"], defaults=False, level=2,
                  intro="Written by the operator only, through the status subresource; it has no defaults."),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write or check docs/reference.md."""
    return crdgen.write_or_check(argv, "reference", [TARGET], render(), "docs")


if __name__ == "__main__":
    sys.exit(main())

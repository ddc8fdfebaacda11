"""docs/reference.md is what `make docs` generates from the models, and covers every field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from genrm_operator import crdgen, docgen


def test_the_committed_reference_is_exactly_what_the_models_generate() -> None:
    assert docgen.TARGET.read_text() == docgen.render(), "stale docs/reference.md: run `make docs`"


def test_the_generator_check_passes_and_rendering_is_stable() -> None:
    assert docgen.main(["--check"]) == 0
    assert docgen.render() == docgen.render()


def fields(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(section path, field name) of every property under ``node``, as the reference sections them."""
    for name, field in node.get("properties", {}).items():
        yield path, name
        child, child_path = field, f"{path}.{name}"
        while child.get("type") == "array" and isinstance(child.get("items"), dict):
            child, child_path = child["items"], child_path + "[]"
        yield from fields(child, child_path)


def test_every_spec_and_status_field_has_a_row_in_its_section() -> None:
    text = docgen.render()
    sections = {}
    for block in text.split("\n#")[1:]:
        heading, _, body = block.partition("\n")
        sections[heading.lstrip("#").strip()] = body
    root = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = 0
    for top in ("spec", "status"):
        for section, name in fields(root["properties"][top], top):
            assert section in sections, f"no section {section}"
            assert f"\n| `{name}` |" in sections[section], f"{section}.{name} has no row"
            found += 1
    assert found > 100


def test_links_to_nested_sections_use_their_headings_anchors() -> None:
    text = docgen.render()
    headings = {docgen.anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    links = [part.split(")")[0] for part in text.split("](#")[1:]]
    assert links and all(link in headings for link in links)


def test_defaults_immutability_and_rules_come_through() -> None:
    text = docgen.render()
    assert "| `replicas` | integer | `1` | 0 to 10000 |" in text
    assert "| `seed` | integer | `42` | immutable; 0 to 2147483647 |" in text
    assert "| `model` | [object](#specmodel) |  | immutable; required |" in text
    assert "`self.timeoutSeconds > self.propagationSeconds + self.quietSeconds`" in text
    assert "| `onTimeout` | string | `Fail` | one of `Fail`, `Force` |" in text

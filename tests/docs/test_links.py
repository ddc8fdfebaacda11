"""The README is a front door whose links, commands and figures hold; the docs' links all resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from genrm_operator.docgen import anchor

REPO = Path(__file__).resolve().parents[2]
MARKDOWN = sorted(
    p for p in REPO.rglob("*.md")
    if not {".venv", ".git", "node_modules", ".pytest_cache"} & set(p.relative_to(REPO).parts)
    and ".egg-info" not in str(p)
)
README = REPO / "README.md"
PERFORMANCE = REPO / "docs" / "performance.md"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.M)


def prose(path: Path) -> str:
    """A Markdown file without its fenced code blocks (neither links nor headings live there)."""
    return FENCE.sub("", path.read_text())


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path).splitlines():
        if re.match(r"^#{1,6}\s", line):
            slug = anchor(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#")))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: Path) -> list[str]:
    """Every link target in the file's prose: inline links and reference definitions."""
    text = re.sub(r"`[^`\n]*`", "", prose(path))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def test_the_project_has_its_documentation_tree() -> None:
    names = {p.relative_to(REPO).as_posix() for p in MARKDOWN}
    assert {"README.md", "docs/performance.md", "docs/reference.md", "docs/architecture.md"} <= names


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_a_file_and_heading(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
    linked = {t.partition("#")[0] for t in links(README)}
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{page.name}" in linked, f"README.md does not link docs/{page.name}"


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("path", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_make_target_named_exists(path: Path) -> None:
    named = set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", path.read_text(), re.M))
    assert named - make_targets() == set(), f"{path.name} names make targets the Makefile lacks"


def test_every_figure_the_readme_quotes_is_in_the_performance_page() -> None:
    figures = re.findall(r"\b[a-z][a-z0-9]*_[a-z0-9_]*=[0-9][0-9.]*", README.read_text())
    assert figures, "the README quotes no benchmark figure; this check would be empty"
    performance = PERFORMANCE.read_text()
    assert [f for f in figures if not re.search(rf"(?<![\w.]){re.escape(f)}(?![\w.])", performance)] == []

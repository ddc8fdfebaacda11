"""The known differences between the simulator and the real engine: ``differences.toml``, read and checked.

Why a data file: the differential test must fail on a difference nobody has looked at, and on a
listed one that no longer occurs, so the list stays true; docs/sglang.md's section "Differences found
against the running engine" is rendered from the same file (``python -m e2e.realengine.differences``
rewrites it, tests/docs fails when it is stale).

Each entry names cases of the corpus, the difference lines it covers (``shapes.differences``'s
``<path>: real <shape>, sim <shape>``; ``*`` matches any text), a status and why:

- ``kept``: the difference occurs in each of its cases and is meant to (the test fails when it no
  longer does);
- ``fixed in the simulator`` / ``fixed in the product``: found by this test and fixed; it must not
  occur again (the test fails when it does).
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

DATA = Path(__file__).with_name("differences.toml")
DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang.md"
HEADING = "## Differences found against the running engine"
KEPT = "kept"
STATUSES = (KEPT, "fixed in the simulator", "fixed in the product")


@dataclass(frozen=True)
class Difference:
    cases: tuple[str, ...]
    differs: tuple[str, ...]
    status: str
    why: str

    @property
    def kept(self) -> bool:
        return self.status == KEPT

    @cached_property
    def _patterns(self) -> tuple[re.Pattern[str], ...]:
        """Only ``*`` is special: difference lines are full of brackets, which globs would read."""
        return tuple(re.compile(".*".join(re.escape(part) for part in p.split("*"))) for p in self.differs)

    def matches(self, line: str) -> bool:
        return any(p.fullmatch(line) for p in self._patterns)


def load(path: Path = DATA) -> tuple[Difference, ...]:
    """Every entry of the file, checked for its fields and status."""
    entries = tomllib.loads(path.read_text())["difference"]
    known = []
    for entry in entries:
        assert set(entry) == {"cases", "differs", "status", "why"}, entry
        assert entry["status"] in STATUSES, entry
        known.append(Difference(tuple(entry["cases"]), tuple(entry["differs"]), entry["status"],
                                " ".join(entry["why"].split())))
    return tuple(known)


@dataclass(frozen=True)
class Verdict:
    """One case's differences against the list."""

    unlisted: tuple[str, ...]
    """Lines no kept entry covers."""
    stale: tuple[Difference, ...]
    """Kept entries that matched nothing."""
    regressed: tuple[Difference, ...]
    """Fixed entries that matched again."""
    listed: int
    """Kept entries that matched."""

    @property
    def holds(self) -> bool:
        return not (self.unlisted or self.stale or self.regressed)


def judge(case: str, found: list[str], known: tuple[Difference, ...]) -> Verdict:
    mine = [d for d in known if case in d.cases]
    kept = [d for d in mine if d.kept]
    return Verdict(
        unlisted=tuple(line for line in found if not any(d.matches(line) for d in kept)),
        stale=tuple(d for d in kept if not any(d.matches(line) for line in found)),
        regressed=tuple(d for d in mine if not d.kept and any(d.matches(line) for line in found)),
        listed=sum(1 for d in kept if any(d.matches(line) for line in found)),
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(known: tuple[Difference, ...]) -> str:
    """The Markdown section of docs/sglang.md: one row per entry, in the file's order."""
    lines = [
        HEADING, "",
        "`e2e/realengine/test_differential.py` sends one corpus of requests to the simulator and to SGLang 0.5.23",
        "itself (on this CPU, with a tiny model) and compares statuses, content types, JSON shapes, stream frames,",
        "metric families and drain behaviour. Every difference it found is below, from",
        "`e2e/realengine/differences.toml` (the test fails on one not listed there, and on a kept one that no longer",
        "occurs; `python -m e2e.realengine.differences` rewrites this section).", "",
        "| cases | what differs (real, then simulator) | status | why |",
        "| --- | --- | --- | --- |",
    ]
    for d in known:
        cases = "<br>".join(_cell(case) for case in d.cases)
        differs = "<br>".join(f"`{_cell(line)}`" for line in d.differs)
        lines.append(f"| {cases} | {differs} | {d.status} | {_cell(d.why)} |")
    return "\n".join(lines) + "\n"


def section(text: str) -> str:
    """The section in a document: from its heading to the next heading of its level, or the end,
    without the blank lines before that."""
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return (text[start:] if end < 0 else text[start:end]).rstrip("\n") + "\n"


def main() -> int:
    text = DOC.read_text()
    DOC.write_text(text.replace(section(text), render(load())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

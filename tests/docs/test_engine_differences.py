"""docs/sglang.md's section on the differences found against the running engine is the data file's.

The real-engine lane's differential test (e2e/realengine/test_differential.py) holds the simulator to
e2e/realengine/differences.toml; the documentation must list exactly that file's entries, so it is
rendered from it and compared here, where no engine is needed.
"""

from __future__ import annotations

from e2e.realengine import differences


def test_the_section_lists_exactly_the_data_files_differences() -> None:
    known = differences.load()
    assert known, "the data file lists no difference; this check would be empty"
    assert differences.section(differences.DOC.read_text()) == differences.render(known), \
        "stale docs/sglang.md: run `python -m e2e.realengine.differences`"


def test_every_entry_names_its_cases_its_difference_lines_and_why() -> None:
    for entry in differences.load():
        assert entry.cases and entry.differs and len(entry.why) > 20, entry

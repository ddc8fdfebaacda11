"""Tests of the documentation: README.md as the front door and the docs/ tree behind it.

Aspects under test:
- docs/reference.md is byte-identical to what ``genrm_operator.docgen.render()`` generates from the
  models (as the CRD is in tests/api), documents every spec and status field, and ``--check`` agrees;
- every relative link in the project's Markdown files reaches an existing file, and every
  ``#anchor`` a heading of it;
- README.md stays a front door: at most 300 lines, every ``make`` target it or docs/ names exists,
  and every benchmark figure it quotes is one of docs/performance.md's.
"""

"""docs/gateway.md's refusal table names every reason of the contract once, with the retry marker and the
``Retry-After`` the pool sends for it (`genrm_contract.sidecar.retry_headers`): a reason added to the
contract without its row, or a row that says otherwise than the code, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from genrm_contract.sidecar import RETRYABLE_REASONS, UNMARKED_REASONS, RefusalReason

GATEWAY_DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
NEVER_SENT = frozenset({RefusalReason.CLIENT_GONE, RefusalReason.WRITE_TIMEOUT, RefusalReason.TRAILER_DROPPED,
                        RefusalReason.ENGINE_DOWN, RefusalReason.ENGINE_UNHEALTHY})
"""Reasons that label a count or the readiness probe's answer, never a refusal a client gets."""


def table() -> dict[RefusalReason, tuple[str, str]]:
    """Each reason the table names, with its row's ``x-should-retry`` and ``Retry-After`` cells."""
    section = GATEWAY_DOC.read_text().split("\n## Retrying a refusal\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| reasons")]
    named: dict[RefusalReason, tuple[str, str]] = {}
    for row in rows:
        reasons, _status, marker, after = (cell.strip() for cell in row.strip("|").split(" | "))
        for name in dict.fromkeys(re.findall(r"`([A-Za-z]+)`", reasons)):  # a status (`499`) is no reason
            reason = RefusalReason(name)
            assert reason not in named, f"{name} has two rows"
            named[reason] = (marker, after)
    return named


def test_every_reason_has_one_row_with_its_retry_marker() -> None:
    named = table()
    assert set(named) == set(RefusalReason), sorted(set(RefusalReason) ^ set(named))
    for reason, (marker, after) in named.items():
        if reason in NEVER_SENT:
            assert (marker, after) == ("—", "—"), reason
        elif reason in RETRYABLE_REASONS:
            assert (marker, after) == ("`true`", f"`{RETRYABLE_REASONS[reason]}`"), reason
        elif reason in UNMARKED_REASONS:
            assert marker.startswith("none") and after == "none", reason
        else:
            assert (marker, after) == ("`false`", "none"), reason

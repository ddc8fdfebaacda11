"""The container pre-count, held to the json module's own reading of the same bytes.

For any JSON document (strings full of brackets, quotes, backslashes and non-ASCII text, in any
encoding the json module reads), the count is over the limit exactly when json.loads builds more
arrays and objects than the limit, and within it never less than it builds: so no document is
refused for brackets inside its strings, and none gets past the count with more containers. For
bytes that are not JSON, the parser refuses them after the count; what the count then says does
not matter, but it must not fail in any other way.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from genrm_contract.sidecar import RefusalReason
from genrm_gateway import body as body_module
from genrm_gateway.body import containers
from genrm_gateway.errors import Refusal
from hypothesis import given, settings
from hypothesis import strategies as st

_tricky = st.text(alphabet=st.sampled_from(['"', "\\", "[", "]", "{", "}", "a", " ", "\n", "é", "\u225b", "😀"]),
                  max_size=12)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), _tricky)
DOCUMENTS = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                          st.dictionaries(_tricky, inner, max_size=5)),
                         max_leaves=40)
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32-be"])


def built(value: object) -> int:
    """Arrays and objects in a parsed document."""
    if isinstance(value, dict):
        return 1 + sum(built(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(built(item) for item in value)
    return 0


@settings(max_examples=1500, deadline=None)
@given(document=DOCUMENTS, ascii_only=st.booleans(), encoding=ENCODINGS, limit=st.integers(0, 12))
def test_the_count_is_what_json_builds_up_to_the_limit(document: object, ascii_only: bool, encoding: str,
                                                        limit: int) -> None:
    body = json.dumps(document, ensure_ascii=ascii_only).encode(encoding)
    assert_counts(body, limit)


@settings(max_examples=500, deadline=None)
@given(document=DOCUMENTS, limit=st.integers(0, 12), step=st.integers(1, 7))
def test_the_count_is_the_same_in_steps_of_any_size(document: object, limit: int, step: int) -> None:
    """The refined count walks the body's marks in steps (a large body's in 64 KiB ones)."""
    with mock.patch.object(body_module, "_MARKS_PER_STEP", step):
        assert_counts(json.dumps(document).encode(), limit)


def assert_counts(body: bytes, limit: int) -> None:
    expected = built(json.loads(body))
    counted = containers(body, limit)
    assert expected <= counted <= limit if expected <= limit else counted > limit, (body, expected, counted)


@settings(max_examples=1000, deadline=None)
@given(raw=st.binary(max_size=80), limit=st.integers(0, 4))
def test_any_bytes_are_counted_or_refused_as_invalid_json(raw: bytes, limit: int) -> None:
    try:
        assert containers(raw, limit) >= 0
    except Refusal as refusal:
        assert refusal.code == 400 and refusal.reason == RefusalReason.INVALID_JSON


@pytest.mark.parametrize("body", [
    b'{"a": "[[[", "b": "\\\\", "c": "\\"[{", "d": [[]]}',
    b'["\\\\\\"[", [], "\\\\\\\\", {}]',
    b'{"": "", "x": ""}',
])
def test_escapes_are_read_as_json_reads_them(body: bytes) -> None:
    for limit in range(built(json.loads(body)) + 2):
        assert_counts(body, limit)

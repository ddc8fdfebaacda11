"""The shell's wire helpers: the status merge patch."""

from __future__ import annotations

from typing import Any

from genrm_operator.shell.kube import merge_diff
from hypothesis import given
from hypothesis import strategies as st

SCALARS = st.one_of(st.booleans(), st.integers(-3, 3), st.sampled_from(["a", "b", ""]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("pqrs"), inner, max_size=4)), max_leaves=12)
OBJECTS = st.dictionaries(st.sampled_from("pqrs"), JSON, max_size=4)


def merge_apply(target: Any, patch: Any) -> Any:
    """RFC 7386's MergePatch, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_apply(result.get(key), value)
    return result


@given(OBJECTS, OBJECTS)
def test_the_status_patch_turns_the_stored_status_into_the_new_one(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = merge_diff(old, new)
    assert merge_apply(old, patch) == new


def test_the_status_patch_carries_only_what_changed() -> None:
    old = {"replicas": 3, "conditions": [{"type": "Available", "status": "True"}], "operation": {"phase": "Verifying"}}
    new = {"replicas": 4, "conditions": [{"type": "Available", "status": "True"}]}
    assert merge_diff(old, new) == {"replicas": 4, "operation": None}
    assert merge_diff(new, new) == {}

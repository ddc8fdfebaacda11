"""The shell's wire helpers: the status merge patch, and sidecar connections pooled per address."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from genrm_operator.shell.kube import merge_diff
from genrm_operator.shell.pooling import PerAddressTransport
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


def test_each_address_gets_a_pool_of_its_own_and_unused_ones_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    made: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        return httpx.Response(200, json={"ok": True})

    class Pool(httpx.MockTransport):
        """Stands in for one address's network pool."""

        def __init__(self, **_: Any) -> None:
            made.append("pool")
            super().__init__(answer)

    monkeypatch.setattr(httpx, "AsyncHTTPTransport", Pool)

    async def scenario() -> None:
        transport = PerAddressTransport(unused_seconds=0.2)
        async with httpx.AsyncClient(transport=transport) as http:
            for host in ("10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1"):
                assert (await http.get(f"http://{host}:8001/v1/state")).json() == {"ok": True}
            assert transport.addresses == 2 and len(made) == 2
            await asyncio.sleep(0.3)
            await http.get("http://10.0.0.3:8001/v1/state")
            assert transport.addresses == 1, "pools unused past the limit are closed at the next sweep"
        assert seen == ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1", "10.0.0.3"]

    asyncio.run(scenario())

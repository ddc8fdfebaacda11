"""Demand hints on a real gateway: ``POST /v1/genrm/demand`` on the traffic port keeps a hint in the
state document (a new version, so the operator's long poll wakes at once) until it expires; the same
id replaces a hint; malformed, oversized, unauthenticated (on a keyed pool) and surplus hints are
refused with a clear 4xx and counted; and the trainer's helper (``genrm_contract.demand.send``)
speaks it unchanged."""

from __future__ import annotations

import time
import urllib.error
from pathlib import Path

import httpx
import pytest
from conftest import Stack, gateway_stack
from genrm_contract.demand import DEMAND_PATH, MAX_HINTS, send
from test_apikey import BEARER, KEY, keyed_stack, write_key

pytestmark = pytest.mark.timeout(60)


def _state_hints(stack: Stack) -> list[dict[str, object]]:
    hints: list[dict[str, object]] = stack.state()["demand"]  # type: ignore[assignment]
    return hints


def test_a_hint_is_reported_in_the_state_until_it_expires_and_wakes_a_long_poll() -> None:
    with gateway_stack() as stack:
        stack.wait_reported_idle()  # so that only the hint can move the version
        before = stack.state()
        answer = send(f"http://127.0.0.1:{stack.port}", requests=4096, within=0, duration=2, hint_id="phase-1")
        assert answer == {"id": "phase-1", "expiresInSeconds": 2}
        after = stack.state()
        assert after["version"] != before["version"], "a new hint is significant: the long poll wakes"
        assert _state_hints(stack) == [{"id": "phase-1", "requests": 4096, "startsWithinSeconds": 0, "forSeconds": 2}]
        send(f"http://127.0.0.1:{stack.port}", requests=100, within=0, duration=1, hint_id="phase-1")
        assert [h["requests"] for h in _state_hints(stack)] == [100], "the same id replaces the hint"
        time.sleep(1.3)
        assert _state_hints(stack) == []


def test_bad_hints_are_refused_with_a_clear_4xx_and_counted() -> None:
    with gateway_stack() as stack:
        url = f"http://127.0.0.1:{stack.port}{DEMAND_PATH}"
        cases = [
            (httpx.post(url, content=b"{not json"), 400),
            (httpx.post(url, json={"requests": 0, "forSeconds": 10}), 400),
            (httpx.post(url, json={"requests": 5, "forSeconds": 10, "id": "bad id\r\nx: y"}), 400),
            (httpx.post(url, json={"requests": 5, "forSeconds": 10, "extra": 1}), 400),
            (httpx.post(url, content=b"{" + b" " * 8192 + b"}"), 413),
            (httpx.get(url), 405),
        ]
        for response, code in cases:
            assert response.status_code == code, response.text
            assert response.json()["error"]["reason"], response.text
        assert _state_hints(stack) == []
        for i in range(MAX_HINTS):
            assert httpx.post(url, json={"requests": 5, "forSeconds": 60, "id": f"p{i}"}).status_code == 202
        surplus = httpx.post(url, json={"requests": 5, "forSeconds": 60, "id": "one-more"})
        assert surplus.status_code == 429 and surplus.json()["error"]["reason"] == "tooManyHints"
        assert httpx.post(url, json={"requests": 9, "forSeconds": 60, "id": "p3"}).status_code == 202
        assert len(_state_hints(stack)) == MAX_HINTS
        assert stack.metric('genrm_gateway_refused_total{reason="tooManyHints"}') == 1
        assert stack.metric('genrm_gateway_refused_total{reason="bodyTooLarge"}') == 1
        judged = httpx.post(f"http://127.0.0.1:{stack.port}/generate", json={"text": "still serving"})
        assert judged.status_code == 200


def test_a_keyed_pool_wants_its_key_for_a_hint(tmp_path: Path) -> None:
    write_key(tmp_path, KEY)
    with keyed_stack(tmp_path) as stack:
        base = f"http://127.0.0.1:{stack.port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            send(base, requests=10, within=0, duration=10)
        assert refused.value.code == 401
        assert _state_hints(stack) == []
        assert send(base, requests=10, within=5, duration=10, api_key=KEY)["expiresInSeconds"] == 15
        assert httpx.post(base + DEMAND_PATH, headers=BEARER, json={"requests": 1, "forSeconds": 1}).status_code == 202
        assert len(_state_hints(stack)) == 2

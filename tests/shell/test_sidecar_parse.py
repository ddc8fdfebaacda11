"""Tests of the pure parts of ``genrm_operator.shell.sidecar``.

Aspects under test: ``parse_state`` turns a gateway ``/v1/state`` document into the core's
``SidecarView`` for each drain state, with in-flight count, engine health and drain id, and
returns None (unknown, never drained) for anything that is not a state document;
``compare`` accepts a first replica without a reference, accepts identical answers and names
the first differing probe with both answers (truncated) otherwise; the default probes.
"""

from __future__ import annotations

from typing import Any

import pytest
from genrm_operator.core.model import SidecarView
from genrm_operator.shell.sidecar import DEFAULT_PROBES, Endpoint, compare, parse_state


@pytest.mark.parametrize("state", ["Serving", "SoftDrain", "Fenced", "Drained"])
def test_every_drain_state_is_parsed(state: str) -> None:
    doc = {"state": state, "inflight": 4, "drainId": "genrm/uid-1",
           "engine": {"up": True, "healthy": True, "running": 4, "waiting": 0}}
    assert parse_state(doc) == SidecarView(state=state, inflight=4, engine_healthy=True,  # type: ignore[arg-type]
                                           drain_id="genrm/uid-1")


def test_a_serving_sidecar_with_a_cold_engine_is_not_healthy() -> None:
    view = parse_state({"state": "Serving", "inflight": 0, "engine": {"up": False, "healthy": False}})
    assert view == SidecarView(state="Serving", inflight=0, engine_healthy=False, drain_id=None)


def test_missing_fields_default_to_idle_and_unhealthy() -> None:
    assert parse_state({"state": "Fenced"}) == SidecarView(state="Fenced", inflight=0, engine_healthy=False)
    assert parse_state({"state": "Drained", "inflight": None, "engine": None}) == SidecarView(state="Drained")


@pytest.mark.parametrize("doc", [
    {}, {"state": "drained"}, {"state": "Draining"}, {"state": None, "inflight": 0},
    {"detail": "unauthorized"}, {"error": {"code": 503, "reason": "draining"}},
])
def test_anything_that_is_not_a_state_document_is_unknown(doc: dict[str, Any]) -> None:
    assert parse_state(doc) is None


def test_the_first_replica_passes_without_a_reference() -> None:
    ok, message = compare(["a", "b", "c"], None)
    assert ok and "no reference" in message and "3 probes" in message


def test_identical_answers_pass() -> None:
    assert compare(["a", "b"], ["a", "b"]) == (True, "2 probes identical to the reference")


def test_a_different_answer_fails_and_names_the_probe_with_both_answers() -> None:
    ok, message = compare(["Score: 7", "B", "yes"], ["Score: 7", "A", "no"])
    assert not ok
    assert message == "probe 1 differs: new='B' reference='A'"


def test_long_answers_are_truncated_in_the_message() -> None:
    ok, message = compare(["x" * 1000], ["y" * 1000])
    assert not ok and len(message) < 400 and "x" * 160 in message and "x" * 161 not in message


def test_answers_of_different_lengths_are_a_programming_error() -> None:
    with pytest.raises(ValueError):
        compare(["a"], ["a", "b"])


def test_the_default_probes_are_fixed_judge_prompts() -> None:
    assert len(DEFAULT_PROBES) >= 3 and all(p.prompt and p.max_new_tokens > 0 for p in DEFAULT_PROBES)
    endpoint = Endpoint("10.0.0.7", 8000, 8001, "tok")
    assert endpoint.traffic == "http://10.0.0.7:8000" and endpoint.control == "http://10.0.0.7:8001"
    assert endpoint.headers == {"Authorization": "Bearer tok"}

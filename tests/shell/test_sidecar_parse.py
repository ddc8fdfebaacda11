"""Tests of the pure parts of ``genrm_operator.shell.sidecar``.

Aspects under test: ``parse_state`` and ``view_of`` turn a gateway ``/v1/state`` document (built
from the shared contract) into the core's ``SidecarView`` for each drain state, with in-flight
count, engine health and drain id, and ``parse_state`` returns None (unknown, never drained) for
anything that is not a whole state document;
``compare`` accepts a first replica without a reference, accepts identical answers and names
the first differing probe with both answers (truncated) otherwise; the default probes;
``probe_request``: a Seeded probe is sampled with the fixed seed, a Greedy one decodes at temperature 0
with no seed, and a reward model's probe is the same classification in both modes.
"""

from __future__ import annotations

from typing import Any

import pytest
from genrm_contract.sidecar import DrainState, EngineReport, StateDocument
from genrm_operator.api.spec import ProbeRequest, VerificationSpec
from genrm_operator.core.model import SidecarView
from genrm_operator.shell.sidecar import (
    DEFAULT_PROBES,
    SEEDED_TEMPERATURE,
    Endpoint,
    compare,
    parse_state,
    probe_request,
    view_of,
)


def state_document(state: DrainState, inflight: int = 4, healthy: bool = True,
                   drain_id: str | None = "genrm/uid-1") -> dict[str, object]:
    """A document as the gateway writes it: built from the shared contract, so it cannot drift."""
    return StateDocument(
        state=state, drain_id=drain_id, inflight=inflight, admitted_total=9, completed_total=5, refused_total=0,
        engine=EngineReport(up=healthy, healthy=healthy, running_requests=inflight, queued_requests=0,
                            token_usage=0.1),
        idle_since_seconds=None).wire()


@pytest.mark.parametrize("state", list(DrainState))
def test_every_drain_state_is_parsed(state: DrainState) -> None:
    document = parse_state(state_document(state))
    assert document is not None
    assert view_of(document, 100.0) == SidecarView(state=state, inflight=4, engine_healthy=True)


def test_a_serving_sidecar_with_a_cold_engine_is_not_healthy() -> None:
    document = parse_state(state_document(DrainState.SERVING, inflight=0, healthy=False, drain_id=None))
    assert document is not None
    assert view_of(document, 100.0) == SidecarView(state=DrainState.SERVING, inflight=0, engine_healthy=False)


def test_idleness_counts_from_the_report_and_only_once_the_gateway_calls_it_idle() -> None:
    """Scale to zero reads ``idle_from``: on the operator's clock, from when the report arrived, and
    None for a replica idle for less than the contract's report threshold (or busy)."""
    wire = state_document(DrainState.SERVING, inflight=0) | {"idleSinceSeconds": 30.0}
    document = parse_state(wire)
    assert document is not None and document.idle
    assert view_of(document, 1000.0).idle_from == 970.0
    brief = parse_state(wire | {"idleSinceSeconds": 0.5})
    assert brief is not None and view_of(brief, 1000.0).idle_from is None
    busy = parse_state(wire | {"inflight": 1})
    assert busy is not None and view_of(busy, 1000.0).idle_from is None


def test_an_incomplete_document_is_unknown_never_idle() -> None:
    """A document without its in-flight count must not read as an empty replica (it could be deleted)."""
    assert parse_state({"state": "Fenced"}) is None
    assert parse_state({**state_document(DrainState.DRAINED), "inflight": None}) is None
    assert parse_state({**state_document(DrainState.DRAINED), "inflight": -1}) is None


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
    endpoint = Endpoint("10.0.0.7", 8001, "tok")
    assert endpoint.control == "http://10.0.0.7:8001"
    assert endpoint.headers == {"Authorization": "Bearer tok"}


PROBE = ProbeRequest(prompt="Score 2+2=4 from 1 to 10.", max_new_tokens=16)


def test_a_seeded_probe_is_sampled_with_the_fixed_seed() -> None:
    spec = VerificationSpec(sampling_seed=77)
    assert spec.sampling == "Seeded", "the default: today's probes"
    assert probe_request(PROBE, spec, generation=True) == ("/generate", {
        "text": PROBE.prompt,
        "sampling_params": {"max_new_tokens": 16, "temperature": SEEDED_TEMPERATURE, "sampling_seed": 77}})


def test_a_greedy_probe_decodes_at_temperature_zero_and_carries_no_seed() -> None:
    """Without deterministic inference SGLang ignores a seed: a Greedy probe's answer must not need one."""
    spec = VerificationSpec(sampling="Greedy", sampling_seed=77)
    assert probe_request(PROBE, spec, generation=True) == ("/generate", {
        "text": PROBE.prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0}})


@pytest.mark.parametrize("sampling", ["Seeded", "Greedy"])
def test_a_reward_models_probe_is_the_same_classification_in_both_modes(sampling: str) -> None:
    spec = VerificationSpec.model_validate({"sampling": sampling})
    assert probe_request(PROBE, spec, generation=False) == ("/classify", {"text": PROBE.prompt})

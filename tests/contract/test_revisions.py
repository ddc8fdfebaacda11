"""The judge switch in the contract (`genrm_contract.revisions`, the drain's reason): what the documents
admit, the roles a replica's revision takes, the refusals' retry markers, and that an operator or a
gateway that says nothing of a switch writes the same documents as before it."""

from __future__ import annotations

import pytest
from genrm_contract.revisions import RevisionAnswer, RevisionRole, RevisionsDocument
from genrm_contract.sidecar import (
    RETRYABLE_REASONS,
    DrainPhase,
    DrainReason,
    DrainRequest,
    DrainState,
    EngineReport,
    RefusalReason,
    StateDocument,
    retry_headers,
)
from pydantic import ValidationError

STATE = StateDocument(state=DrainState.FENCED, drain_id="genrm/u", inflight=0, admitted_total=1, completed_total=1,
                      refused_total=0, engine=EngineReport(up=True, healthy=True, running_requests=0,
                                                           queued_requests=0, token_usage=0.0),
                      idle_since_seconds=None)


def test_a_drain_request_without_a_reason_is_the_document_of_before() -> None:
    """The operator drops None fields: a drain that names no switch is byte for byte the old document,
    which every gateway, old or new, takes."""
    plain = DrainRequest(drain_id="genrm/u", phase=DrainPhase.FENCE, quiet_seconds=2)
    assert plain.model_dump(by_alias=True, exclude_none=True, mode="json") == {
        "drainId": "genrm/u", "phase": "fence", "quietSeconds": 2}
    switched = DrainRequest.model_validate({"drainId": "genrm/u", "phase": "fence", "reason": "judgeSwitched",
                                            "activeRevision": "4b1e9d0c7a"})
    assert (switched.reason, switched.active_revision) == (DrainReason.JUDGE_SWITCHED, "4b1e9d0c7a")


@pytest.mark.parametrize("extra", [{"reason": "bored"}, {"reason": "judgeSwitched", "activeRevision": "a b"},
                                   {"reason": "judgeSwitched", "activeRevision": "r\r\nx-injected: 1"},
                                   {"reason": "judgeSwitched", "activeRevision": "r" * 64},
                                   {"activeRevision": "4b1e9d0c7a"}])
def test_a_drain_reason_and_active_revision_are_checked(extra: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        DrainRequest.model_validate({"drainId": "d", "phase": "fence", **extra})


def test_the_state_document_names_the_drain_reason_only_when_there_is_one() -> None:
    assert "drainReason" not in STATE.wire()
    switched = STATE.model_copy(update={"drain_reason": DrainReason.JUDGE_SWITCHED})
    assert switched.wire()["drainReason"] == "judgeSwitched"
    assert StateDocument.model_validate(switched.wire()).drain_reason is DrainReason.JUDGE_SWITCHED
    assert switched.significant() != STATE.significant(), "a reason landing on a fenced replica is a change"


def test_a_judge_switch_refusal_is_retried_and_a_retired_revision_never() -> None:
    assert dict(retry_headers(RefusalReason.JUDGE_SWITCHED)) == {"x-should-retry": "true", "retry-after": "1"}
    assert RETRYABLE_REASONS[RefusalReason.JUDGE_SWITCHED] == RETRYABLE_REASONS[RefusalReason.DRAINING]
    assert dict(retry_headers(RefusalReason.REVISION_RETIRED)) == {"x-should-retry": "false"}


@pytest.mark.parametrize(("active", "preview", "own", "role"), [
    (None, None, "a1", None),
    ("a1", None, "a1", RevisionRole.ACTIVE),
    ("a1", "b2", "b2", RevisionRole.PREVIEW),
    ("b2", None, "a1", RevisionRole.RETIRING),
    ("b2", "c3", "a1", RevisionRole.RETIRING),
    (None, "b2", "a1", None),
    (None, "b2", "b2", RevisionRole.PREVIEW),
    ("a1", None, None, None),
])
def test_a_replicas_role_follows_from_the_pools_revisions(active: str | None, preview: str | None, own: str | None,
                                                          role: RevisionRole | None) -> None:
    told = RevisionsDocument(active=active, preview=preview)
    assert told.role(own) is role
    assert RevisionAnswer.of(own, told).model_dump(mode="json") == {
        "revision": own, "active": active, "preview": preview, "role": None if role is None else role.value}


@pytest.mark.parametrize("document", [{"active": "a b"}, {"active": ""}, {"preview": "-b2"}, {"active": "r" * 64},
                                      {"active": "a1", "preview": "a1"}, {"active": "a1", "extra": 1},
                                      {"active": ["a1"]}, {"active": 7}])
def test_hostile_revisions_documents_are_refused(document: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RevisionsDocument.model_validate(document)

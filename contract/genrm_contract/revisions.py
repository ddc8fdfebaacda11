"""The operator -> gateway judge revisions contract: which judge a pool serves during a blue/green switch.

Why: a pool can change its judge (model, engine) blue/green. The new judge revision comes up beside
the active one as the *preview*; at promotion the pool's Service selects the new revision in one
step, and the old revision's gateways are fenced with ``DrainReason.JUDGE_SWITCHED``. A gateway
knows its own revision (``--judge-revision``) but has no Kubernetes credentials, so the operator,
which already follows every gateway on its control port, tells each one the pool's active and
preview revisions (``POST`` :data:`REVISIONS_PATH`, a :class:`RevisionsDocument`). Clients read them
from any replica (``GET`` :data:`REVISION_PATH` on the traffic port, a :class:`RevisionAnswer`), and
may pin a request to a revision with the request header ``x-genrm-revision``
(`genrm_contract.sidecar.REVISION_HEADER`, the same name as on every answer): a gateway of another
revision refuses it ``409 revisionRetired``, and so does a gateway whose revision the switch retired.
Standard library and pydantic only, like the rest of the contract.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genrm_contract.sidecar import JUDGE_REVISION_PATTERN

REVISIONS_PATH = "/v1/revisions"
"""``POST`` on the control port, with the pool's control token: replace the pool's revisions."""
REVISION_PATH = "/v1/genrm/revision"
"""``GET`` on the traffic port (the pool's API key, as every judge route): this replica's revision
and the pool's, as a :class:`RevisionAnswer`."""

JudgeRevision = Annotated[str, Field(pattern=JUDGE_REVISION_PATTERN)]
"""A judge revision (the pod label ``genrm.io/judge-revision``): fit for a header as it is."""


class RevisionRole(enum.StrEnum):
    """What a replica's revision is to its pool (:func:`role`)."""

    ACTIVE = "active"
    """The revision the pool's Service selects."""
    PREVIEW = "preview"
    """The revision coming up beside the active one, not yet in the Service."""
    RETIRING = "retiring"
    """Neither: a revision the pool switched away from, drained and deleted soon."""


class RevisionsDocument(BaseModel):
    """``POST /v1/revisions``: the pool's active and preview revisions, as the operator decided them.

    Each push replaces the last (the operator is the pool's one writer and pushes in order); until the
    first, a gateway knows neither (both None)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    active: JudgeRevision | None = None
    preview: JudgeRevision | None = None

    @model_validator(mode="after")
    def _two_revisions(self) -> RevisionsDocument:
        if self.preview is not None and self.preview == self.active:
            raise ValueError("the preview is another revision than the active one")
        return self

    def role(self, own: str | None) -> RevisionRole | None:
        """What revision ``own`` is to the pool: active, preview, retiring once an active revision is
        known that it is neither, else None (nothing told yet, or a replica that names no revision)."""
        if own is None:
            return None
        if own == self.active:
            return RevisionRole.ACTIVE
        if own == self.preview:
            return RevisionRole.PREVIEW
        return RevisionRole.RETIRING if self.active is not None else None

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json")


class RevisionAnswer(BaseModel):
    """``GET /v1/genrm/revision``: the answering replica's revision (None when it names none), the
    pool's active and preview revisions as its gateway was last told, and the replica's role."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: JudgeRevision | None
    active: JudgeRevision | None
    preview: JudgeRevision | None
    role: RevisionRole | None

    @classmethod
    def of(cls, own: str | None, told: RevisionsDocument) -> RevisionAnswer:
        return cls(revision=own, active=told.active, preview=told.preview, role=told.role(own))

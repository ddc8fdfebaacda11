"""``GenRMPool.status``: what the operator observed and the scale-operation state machine.

The status subresource is the durable memory of the single writer: the active
operation (with its victims recorded before any side effect), the next pod
ordinal (so a retried create can never produce a second pod) and a bounded
history. An operator restart resumes from here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel

OperationType = Literal["ScaleOut", "ScaleIn"]
ScaleOutPhase = Literal["Pending", "Provisioning", "Verifying"]
ScaleInPhase = Literal["Pending", "Unpublishing", "Fencing", "Draining", "Removing"]
TerminalPhase = Literal["Succeeded", "Partial", "Failed", "Superseded"]
Phase = Literal[
    "Pending", "Provisioning", "Verifying", "Unpublishing", "Fencing", "Draining", "Removing",
    "Succeeded", "Partial", "Failed", "Superseded",
]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Partial", "Failed", "Superseded"})
HISTORY_LIMIT = 10


class Condition(ApiModel):
    """Standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(max_length=316)
    """Condition type: Available, Progressing, Degraded, ..."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """CamelCase reason for the last transition."""
    message: str = Field("", max_length=32768)
    """Human-readable detail."""
    last_transition_time: str
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = Field(None, ge=0)
    """The spec generation the condition was computed from."""


class AddedPod(ApiModel):
    """A pod created by a scale-out operation."""

    name: str
    """Pod name (deterministic: <pool>-<ordinal>)."""
    ordinal: int = Field(ge=0)
    """Ordinal the name was built from."""
    observed: bool = False
    """The pod has been seen since it was created; until then the create is retried (idempotently)."""


class Victim(ApiModel):
    """A replica chosen for removal, recorded before anything is done to it."""

    name: str
    """Pod name."""
    uid: str
    """Pod UID: every drain and delete is bound to it, so a recreated pod is never mistaken for it."""
    needs_drain: bool = True
    """False for a replica that was never published (nothing can be in flight): deleted directly."""
    unpublished_at: str | None = None
    """When it stopped receiving traffic (RFC 3339)."""
    fenced_at: str | None = None
    """When admission was closed (RFC 3339)."""
    drained_at: str | None = None
    """When the sidecar proved it drained (RFC 3339)."""
    forced: bool = False
    """Deleted after a drain timeout under onTimeout=Force."""


class OperationIdentity(ApiModel):
    """What names a scale operation, active or finished."""

    id: str
    """Operation id, unique within the pool (op-<n>)."""
    type: OperationType
    """ScaleOut or ScaleIn."""
    from_: int = Field(alias="from", ge=0)
    """Serving replicas when the operation started."""
    to: int = Field(ge=0)
    """Target replicas."""
    started_at: str
    """Start time (RFC 3339)."""


class Operation(OperationIdentity):
    """The active scale operation."""

    phase: Phase
    """Current phase of the state machine."""
    last_transition_time: str
    """Time of the last phase change (RFC 3339)."""
    added_pods: list[AddedPod] = Field(default_factory=list)
    """Pods created by this operation."""
    victims: list[Victim] = Field(default_factory=list)
    """Replicas being removed by this operation."""
    message: str = ""
    """Human-readable progress or failure reason."""


class HistoryEntry(OperationIdentity):
    """A finished operation."""

    outcome: TerminalPhase
    """Succeeded, Partial, Failed or Superseded."""
    reason: str = ""
    """CamelCase reason of the outcome."""
    message: str = ""
    """Detail."""
    finished_at: str
    """End time (RFC 3339)."""
    duration_seconds: float = Field(ge=0)
    """finishedAt - startedAt."""
    forced_drains: int = Field(0, ge=0)
    """Victims deleted after a drain timeout."""

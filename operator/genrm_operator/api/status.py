"""``GenRMPool.status``: what the operator observed and the scale-operation state machine.

The status subresource is the durable memory of the single writer: the active
operation (with its victims recorded before any side effect), the next pod
ordinal (so a retried create can never produce a second pod) and a bounded
history. An operator restart resumes from here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, WithJsonSchema, model_validator

from .base import ApiModel, Timestamp

HISTORY_LIMIT = 10


class OperationType(StrEnum):
    """What a scale operation does."""

    SCALE_OUT = "ScaleOut"
    SCALE_IN = "ScaleIn"
    ROLLOUT = "Rollout"
    JUDGE_SWITCH = "JudgeSwitch"


class OperationPhase(StrEnum):
    """Phases of the scale-operation state machine (docs/state-machine.md)."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    VERIFYING = "Verifying"
    UNPUBLISHING = "Unpublishing"
    FENCING = "Fencing"
    DRAINING = "Draining"
    REMOVING = "Removing"
    PAUSED = "Paused"
    AWAITING_PROMOTION = "AwaitingPromotion"
    """A judge switch: the preview revision is ready and waits for its promotion (`BlueGreenSpec.promotion`)."""
    PROMOTED = "Promoted"
    """A judge switch: the pool serves the new revision; the previous one stays up, fenced, for the
    scale-down delay (a revert of the judge fields within it promotes it back at once)."""
    SUCCEEDED = "Succeeded"
    PARTIAL = "Partial"
    FAILED = "Failed"
    SUPERSEDED = "Superseded"


SCALE_OUT_PHASES = frozenset({OperationPhase.PENDING, OperationPhase.PROVISIONING, OperationPhase.VERIFYING})
SCALE_IN_PHASES = frozenset({OperationPhase.PENDING, OperationPhase.UNPUBLISHING, OperationPhase.FENCING,
                             OperationPhase.DRAINING, OperationPhase.REMOVING})
TERMINAL_PHASES = frozenset({OperationPhase.SUCCEEDED, OperationPhase.PARTIAL, OperationPhase.FAILED,
                             OperationPhase.SUPERSEDED})
ROLLOUT_PHASES = SCALE_OUT_PHASES | SCALE_IN_PHASES | {OperationPhase.PAUSED}
"""A rollout surges (Provisioning, Verifying) and retires outdated replicas like a scale-in; Paused between."""
JUDGE_SWITCH_PHASES = SCALE_OUT_PHASES | SCALE_IN_PHASES | {OperationPhase.AWAITING_PROMOTION, OperationPhase.PROMOTED}
"""A judge switch brings the preview up like a scale-out, waits for promotion, then retires the
previous revision like a scale-in."""
ACTIVE_PHASES = {OperationType.SCALE_OUT: SCALE_OUT_PHASES, OperationType.SCALE_IN: SCALE_IN_PHASES,
                 OperationType.ROLLOUT: ROLLOUT_PHASES, OperationType.JUDGE_SWITCH: JUDGE_SWITCH_PHASES}
"""The phases an active operation of each type may be in; a finished one is in history with a terminal phase."""
Outcome = Literal[OperationPhase.SUCCEEDED, OperationPhase.PARTIAL, OperationPhase.FAILED, OperationPhase.SUPERSEDED]
"""How an operation ended: one of :data:`TERMINAL_PHASES`."""


class ConditionType(StrEnum):
    """Every condition the operator sets on a pool (KubeRay's ``RayClusterConditionType`` constants)."""

    AVAILABLE = "Available"
    """Some replica serves (or none is wanted)."""
    PROGRESSING = "Progressing"
    """A scale operation runs."""
    DEGRADED = "Degraded"
    """Something needs a human: a failed replica or child, an operation that fell short."""
    SCALING_ACTIVE = "ScalingActive"
    """The autoscaler has a usable signal (HPA's condition)."""
    ABLE_TO_SCALE = "AbleToScale"
    """The autoscaler's recommendation is applied as computed, or was stabilized (HPA's condition)."""
    SCALING_LIMITED = "ScalingLimited"
    """The autoscaler's count was clamped by a bound, a rate policy or a hold (HPA's condition)."""
    AUTOSCALER_OVERRIDDEN = "AutoscalerOverridden"
    """Another writer set spec.replicas and the autoscaler adopted it."""
    ROLLOUT_BLOCKED = "RolloutBlocked"
    """A rollout cannot go on: no room for a surge replica and maxUnavailable allows no drain first."""
    RECONCILE_FAILED = "ReconcileFailed"
    """The operator's reconcile step failed several times in a row (`core.retry`); gone once one succeeds."""


AUTOSCALER_CONDITIONS = frozenset({
    ConditionType.SCALING_ACTIVE, ConditionType.ABLE_TO_SCALE, ConditionType.SCALING_LIMITED,
    ConditionType.AUTOSCALER_OVERRIDDEN,
})
"""Conditions present only while the autoscaler is on (mode Advisory or Auto; Overridden only in Auto)."""


class ConditionStatus(StrEnum):
    """Whether a condition holds (metav1.ConditionStatus)."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionReason(StrEnum):
    """CamelCase reasons of the state machine's conditions and outcomes (events have :class:`EventReason`).

    The autoscaler's limiter reasons (``ScaleUpStabilized``, ``TooManyReplicas``, ...) are the
    control law's vocabulary and live with it in :mod:`genrm_operator.autoscaling.decide`.
    """

    SCALED_TO_ZERO = "ScaledToZero"
    REPLICAS_SERVING = "ReplicasServing"
    NO_SERVING_REPLICAS = "NoServingReplicas"
    SCALING_OUT = "ScalingOut"
    SCALING_IN = "ScalingIn"
    AT_TARGET = "AtTarget"
    WAITING = "Waiting"
    AS_EXPECTED = "AsExpected"
    OPERATION_FAILED = "OperationFailed"
    TARGET_REACHED = "TargetReached"
    TARGET_CHANGED = "TargetChanged"
    DRAIN_TIMEOUT = "DrainTimeout"
    BACK_OFF = "BackOff"
    VERIFICATION_BACK_OFF = "VerificationBackOff"
    UNSCHEDULABLE = "Unschedulable"
    CANNOT_START = "ReplicaCannotStart"
    JUDGE_CHANGED = "JudgeChanged"
    """The judge fields changed again while a judge switch (or another operation) ran."""
    AWAITING_PROMOTION = "AwaitingPromotion"
    REPLICA_FAILED = "ReplicaFailed"
    REPLICA_CRASHED = "ReplicaCrashed"
    STARTUP_TIMEOUT = "StartupTimeout"
    REPLICA_INCONSISTENT = "ReplicaInconsistent"
    REPLICA_MISPLACED = "ReplicaMisplaced"
    VALID_METRIC_FOUND = "ValidMetricFound"
    READY_FOR_NEW_SCALE = "ReadyForNewScale"
    DESIRED_WITHIN_RANGE = "DesiredWithinRange"
    EXTERNAL_WRITE = "ExternalWrite"
    AUTOSCALER_IN_CHARGE = "AutoscalerInCharge"
    ROLLING_OUT = "RollingOut"
    SWITCHING_JUDGE = "SwitchingJudge"
    ROLLOUT_PAUSED = "RolloutPaused"
    STRATEGY_CHANGED = "StrategyChanged"
    SURGE_BLOCKED = "SurgeBlocked"
    RECONCILE_ERROR = "ReconcileError"


class FailureReason(StrEnum):
    """Why a replica must be replaced (``core.classify.failure_reason``): recorded in the status
    (``AddedPod.failure``, history and condition messages) and named in the Warning event."""

    REPLICA_FAILED = "ReplicaFailed"
    REPLICA_CRASHED = "ReplicaCrashed"
    REPLICA_INCONSISTENT = "ReplicaInconsistent"
    STARTUP_TIMEOUT = "StartupTimeout"


class EventReason(StrEnum):
    """The reasons of the Kubernetes Events the operator records on a pool (``kubectl describe``):
    the users' vocabulary, one member per reason an event may carry."""

    # An operation's life: <type><Started|outcome> (see :meth:`operation`).
    SCALE_OUT_STARTED = "ScaleOutStarted"
    SCALE_OUT_SUCCEEDED = "ScaleOutSucceeded"
    SCALE_OUT_PARTIAL = "ScaleOutPartial"
    SCALE_OUT_FAILED = "ScaleOutFailed"
    SCALE_OUT_SUPERSEDED = "ScaleOutSuperseded"
    SCALE_IN_STARTED = "ScaleInStarted"
    SCALE_IN_SUCCEEDED = "ScaleInSucceeded"
    SCALE_IN_PARTIAL = "ScaleInPartial"
    SCALE_IN_FAILED = "ScaleInFailed"
    SCALE_IN_SUPERSEDED = "ScaleInSuperseded"
    ROLLOUT_STARTED = "RolloutStarted"
    ROLLOUT_SUCCEEDED = "RolloutSucceeded"
    ROLLOUT_PARTIAL = "RolloutPartial"
    ROLLOUT_FAILED = "RolloutFailed"
    ROLLOUT_SUPERSEDED = "RolloutSuperseded"
    ROLLOUT_RETARGETED = "RolloutRetargeted"
    ROLLOUT_BLOCKED = "RolloutBlocked"
    JUDGE_SWITCH_STARTED = "JudgeSwitchStarted"
    JUDGE_SWITCH_SUCCEEDED = "JudgeSwitchSucceeded"
    JUDGE_SWITCH_PARTIAL = "JudgeSwitchPartial"
    JUDGE_SWITCH_FAILED = "JudgeSwitchFailed"
    JUDGE_SWITCH_SUPERSEDED = "JudgeSwitchSuperseded"
    JUDGE_PROMOTED = "JudgePromoted"
    """The pool's Service moves to another judge revision."""
    JUDGE_RETIRING = "JudgeRetiring"
    """The previous judge revision's scale-down delay ended: its replicas drain and go."""
    # Replicas.
    VICTIMS_SELECTED = "VictimsSelected"
    REPLICAS_RETIRING = "ReplicasRetiring"
    REPLICA_RESCUED = "ReplicaRescued"
    VICTIM_KEPT_PUBLISHED = "VictimKeptPublished"
    """A published victim stays in the Service: no other published replica is a ready endpoint."""
    VICTIM_RESCUED = "VictimRescued"
    """A victim already taken out of the Service is put back: no other replica could serve."""
    REPLICA_PUBLISHED = "ReplicaPublished"
    REPLICA_FAILED = "ReplicaFailed"
    REPLICA_MISPLACED = "ReplicaMisplaced"
    DRAIN_FORCED = "DrainForced"
    # Children and the autoscaler.
    CHILD_FAILED = "ChildFailed"
    DEMAND_HINT_INVALID = "DemandHintInvalid"
    AUTOSCALER_OVERRIDDEN = "AutoscalerOverridden"
    SUCCESSFUL_RESCALE = "SuccessfulRescale"
    """The built-in autoscaler changed the replica count (HPA's reason)."""
    FAILED_RESCALE = "FailedRescale"
    """Its write of the replica count was refused (HPA's reason)."""

    @classmethod
    def operation(cls, type_: OperationType, stage: OperationPhase | Literal["Started"]) -> EventReason:
        """The event of an operation starting (``"Started"``) or ending (its terminal phase)."""
        return cls(f"{type_}{stage}")


class Condition(ApiModel):
    """Standard Kubernetes condition (metav1.Condition shape)."""

    type: Annotated[ConditionType, WithJsonSchema({"type": "string", "maxLength": 316})]
    """Condition type: Available, Progressing, Degraded, ..."""
    status: ConditionStatus
    """Whether the condition holds."""
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """CamelCase reason for the last transition."""
    message: str = Field("", max_length=32768)
    """Human-readable detail."""
    last_transition_time: Timestamp
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = Field(None, ge=0)
    """The spec generation the condition was computed from."""


class Placement(ApiModel):
    """The GPU product new replicas of a pool whose answers are compared (deterministic or verified) are
    required onto, and where it comes from."""

    gpu_product: str
    """Value of the node label nvidia.com/gpu.product (GPU feature discovery) that every new replica's
    node affinity requires: deterministic and greedy answers are reproducible on one GPU generation only."""
    replica: str
    """The replica whose node has that product: the oldest serving one (new replicas are verified
    against it), or while none serves, the oldest scheduled one."""
    node: str
    """That replica's node."""


class AddedPod(ApiModel):
    """A pod created by a scale-out or rollout, or a starting one a scale-out took over."""

    name: str
    """Pod name (deterministic: <pool>-<ordinal>)."""
    ordinal: int = Field(ge=0)
    """Ordinal the name was built from."""
    observed: bool = False
    """The pod has been seen since it was created; until then the create is retried (idempotently)."""
    failure: str = ""
    """Why the pod failed (CamelCase), noted when the operator saw it fail before anyone deleted it.
    The operation ends on this note, not on what the pod shows later: a deleted pod's phase is the
    kubelet's answer to the deletion, and the pod may be gone by the time the operation ends."""
    failure_message: str = ""
    """What the failure showed, when there is more to say than its reason: a verification mismatch
    names both replicas, their nodes and GPU products, and the first answers that differ."""


class Victim(ApiModel):
    """A replica chosen for removal, recorded before anything is done to it."""

    name: str
    """Pod name."""
    uid: str
    """Pod UID: every drain and delete is bound to it, so a recreated pod is never mistaken for it."""
    needs_drain: bool = True
    """False for a replica that was never published (nothing can be in flight): deleted directly."""
    unpublished_at: Timestamp | None = None
    """When the pod was first seen unpublished (RFC 3339): the endpoint propagation window starts here."""
    fenced_at: Timestamp | None = None
    """When admission was closed (RFC 3339)."""
    drained_at: Timestamp | None = None
    """When the sidecar proved it drained (RFC 3339)."""
    held_at: Timestamp | None = None
    """When the victim was kept in, or put back into, the pool's Service because no other published
    replica was a ready endpoint of it (RFC 3339); cleared once another one is."""
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
    started_at: Timestamp
    """Start time (RFC 3339)."""


class Operation(OperationIdentity):
    """The active operation: a scale-out, a scale-in or a rollout."""

    phase: OperationPhase
    """Current phase of the state machine."""
    last_transition_time: Timestamp
    """Time of the last phase change (RFC 3339)."""
    added_pods: list[AddedPod] = Field(default_factory=list)
    """Pods created by this operation, and for a scale-out the starting ones it took over when it began."""
    victims: list[Victim] = Field(default_factory=list)
    """Replicas being removed by this operation."""
    message: str = ""
    """Human-readable progress or failure reason."""
    revision: str = ""
    """Rollout: the pod template revision every replica moves to."""
    replaced: int = Field(0, ge=0)
    """Rollout: outdated replicas retired so far."""
    judge_from: str = ""
    """JudgeSwitch: the judge revision the pool served when it started."""
    judge_to: str = ""
    """JudgeSwitch: the judge revision it moves to (the spec's)."""
    promoted_at: Timestamp | None = None
    """JudgeSwitch: when judge_to became the active revision (RFC 3339); the scale-down delay counts from here."""

    @model_validator(mode="after")
    def _phase_of_type(self) -> Self:
        """A scale-out is never Fencing, nor a scale-in Verifying; neither is active in a terminal phase."""
        if self.phase not in ACTIVE_PHASES[self.type]:
            raise ValueError(f"a {self.type} operation cannot be in phase {self.phase}")
        return self


class HistoryEntry(OperationIdentity):
    """A finished operation."""

    outcome: Outcome
    """Succeeded, Partial, Failed or Superseded."""
    reason: str = ""
    """CamelCase reason of the outcome."""
    message: str = ""
    """Detail."""
    finished_at: Timestamp
    """End time (RFC 3339)."""
    duration_seconds: float = Field(ge=0)
    """finishedAt - startedAt."""
    forced_drains: int = Field(0, ge=0)
    """Victims deleted after a drain timeout."""


JudgeRole = Literal["Active", "Preview", "Retiring"]


class JudgeRevisionStatus(ApiModel):
    """One judge revision with replicas in the pool, and what it is to clients."""

    name: str
    """The judge revision (`core.judge`): the pods' genrm.io/judge-revision label and every answer's
    x-genrm-revision."""
    role: JudgeRole
    """Active: the pool's Service sends requests to it. Preview: coming up or waiting for promotion,
    reached by no client of the Service. Retiring: promoted away from; its gateways refuse new requests."""
    replicas: int = Field(0, ge=0)
    """Its pods that are not terminating."""
    serving: int = Field(0, ge=0)
    """Its pods published and ready (for a preview: verified and ready to take the Service)."""


class JudgeStatus(ApiModel):
    """Which judge the pool serves (`spec.judgeUpdate`)."""

    active: str
    """The judge revision the pool's Service sends requests to."""
    revisions: list[JudgeRevisionStatus] = Field(default_factory=list)
    """Every judge revision with pods, the active one first."""

"""The GenRMPool resource: spec and status roots."""

from __future__ import annotations

from pydantic import Field

from .autoscaling import AutoscalerStatus, AutoscalingSpec
from .base import ApiModel, cel, validations
from .spec import (
    DisruptionBudgetSpec,
    DrainSpec,
    EngineSpec,
    GatewaySpec,
    JudgeUpdateSpec,
    ModelSpec,
    ServiceSpec,
    TemplateSpec,
    UpdateStrategySpec,
    VerificationSpec,
    judge_field_rules,
)
from .status import Condition, HistoryEntry, JudgeStatus, Operation, Placement

GROUP = "genrm.io"
VERSION = "v1alpha1"
PLURAL = "genrmpools"
KIND = "GenRMPool"
"""The resource's identity: the CRD generated from these models, the operator's watches and its
labels (``genrm.io/pool``) all take it from here."""

MAX_NAME_LENGTH = 63
"""The pool name is the value of its children's instance label and its Service's name: 63 at most."""
NAME_RULES = validations(
    cel(f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: it labels the pool's Secret, Service and pods"),
    cel("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must be a DNS-1035 label (lowercase alphanumerics and '-', starting with a letter): "
        "it names the pool's Service"),
)
"""CEL rules on the whole object: the names the pool's children derive from its name must be valid."""


class GenRMPoolSpec(ApiModel):
    """Desired state of a pool of identical GenRM judge replicas, one GPU pod each."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            *judge_field_rules(),
            cel("self.engine.port != self.gateway.port && self.engine.port != self.gateway.controlPort",
                "the engine port must differ from the gateway's ports", ".engine.port"),
            cel("!self.verification.enabled || self.verification.sampling != 'Seeded' || self.engine.deterministic",
                "verification with sampling Seeded compares sampled answers across replicas, which SGLang "
                "reproduces only with spec.engine.deterministic=true (without it the probes' seed is ignored); "
                "set spec.engine.deterministic=true, or spec.verification.sampling=Greedy (greedy probes, "
                "comparable without deterministic inference), or spec.verification.enabled=false",
                ".verification.enabled"),
        )
    }

    replicas: int = Field(1, ge=0, le=10000)
    """Number of serving replicas. Writable through the scale subresource (kubectl scale, HPA, KEDA)."""
    model: ModelSpec
    """The judge model."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """SGLang engine settings."""
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    """Gateway sidecar settings."""
    drain: DrainSpec = Field(default_factory=DrainSpec)
    """Scale-in drain settings."""
    verification: VerificationSpec = Field(default_factory=VerificationSpec)
    """Answer check before a new replica is published."""
    template: TemplateSpec = Field(default_factory=TemplateSpec)
    """Pod-level settings for replica pods."""
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    """The pool's Service."""
    disruption_budget: DisruptionBudgetSpec = Field(default_factory=DisruptionBudgetSpec)
    """The pool's PodDisruptionBudget."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Built-in HPA-style autoscaler driven by the replicas' own metrics (mode Off by default)."""
    update_strategy: UpdateStrategySpec = Field(default_factory=UpdateStrategySpec)
    """How changes to the pod template (images, resources, env, scheduling) reach existing replicas."""
    paused: bool = False
    """Stop a rolling update between replacements; scaling goes on."""
    judge_update: JudgeUpdateSpec = Field(default_factory=JudgeUpdateSpec)
    """How a change of the judge (model, engine image, arguments, seed...) is applied: refused, or blue/green."""


class GenRMPoolStatus(ApiModel):
    """Observed state of the pool and its scale-operation state machine."""

    observed_generation: int = Field(0, ge=0)
    """The spec generation this status was computed from."""
    replicas: int = Field(0, ge=0)
    """Replica pods that exist and are not terminating (scale subresource)."""
    ready_replicas: int = Field(0, ge=0)
    """Replica pods whose gateway reports ready."""
    serving_replicas: int = Field(0, ge=0)
    """Replicas published for routing, Ready, and listed as ready endpoints by the Service's EndpointSlices."""
    draining_replicas: int = Field(0, ge=0)
    """Replicas unpublished and draining or drained."""
    updated_replicas: int = Field(0, ge=0)
    """Replica pods (not terminating) made from the current pod template."""
    current_revision: str = ""
    """The pod template revision all replicas had when the pool last had a single one."""
    update_revision: str = ""
    """The revision of the current pod template: what a rollout moves every replica to."""
    selector: str = ""
    """Label selector of the pool's pods, serialised (scale subresource)."""
    next_ordinal: int = Field(0, ge=0)
    """Ordinal of the next pod to create: pod names are never reused."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Available, Progressing, Degraded."""
    operation: Operation | None = None
    """The active scale operation, if any."""
    operation_count: int = Field(0, ge=0)
    """Operations started so far (ids are op-<n>)."""
    history: list[HistoryEntry] = Field(default_factory=list)
    """The last finished operations, newest last."""
    autoscaler: AutoscalerStatus | None = None
    """The built-in autoscaler's memory (recommendation history) and its last decisions."""
    judge: JudgeStatus | None = None
    """The judge revision the pool serves, and the others it runs during a judge switch."""
    placement: Placement | None = None
    """The GPU product new replicas are required onto; absent when nothing is pinned (a non-deterministic
    pool without verification, no replica on a labelled node yet, or the user's own selector chooses)."""

    def decisions(self) -> tuple[object, ...]:
        """What the operator decided, as opposed to what it counted: the operation (victims, creates,
        phase), ordinals, history, revisions and the autoscaler's memory. Acting on a decision needs
        it written first (a crash must find it); counts and conditions only report what was seen."""
        return (self.operation, self.next_ordinal, self.operation_count, self.history, self.current_revision,
                self.update_revision, self.autoscaler, self.judge.active if self.judge is not None else "")

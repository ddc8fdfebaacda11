"""``GenRMPool.spec``: the desired state a user writes.

Fields that change what a replica answers (model, engine image/command/args,
seed, determinism, tensor parallelism) are immutable in v1alpha1: a reward
model must never mix two judges in one pool, so those CEL transition rules tell
the user to create a new pool instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from genrm_contract import limits as defaults
from genrm_contract import sidecar
from pydantic import Field, WithJsonSchema

from .base import ApiModel, cel, validations

SGLANG_IMAGE_TAG = "v0.5.23"
"""SGLang's image for the release whose contract the simulator and the tests follow (tests/contract)."""
IMMUTABLE_HINT = ("is immutable in v1alpha1 because it changes what the judge answers; create a new GenRMPool, "
                  "or set spec.judgeUpdate.strategy=BlueGreen to change the judge in place")
JUDGE_FIELDS = ("model", "engine.image", "engine.command", "engine.args", "engine.extraArgs", "engine.seed",
                "engine.deterministic", "engine.tensorParallelSize")
"""The spec fields that change what the judge answers (`core.judge.judge_fields` hashes them): each changes
only under spec.judgeUpdate.strategy=BlueGreen, as a new judge revision beside the serving one."""


def judge_field_rules() -> list[dict[str, str]]:
    """One transition rule per judge field, on the spec, where the judge-update strategy is visible."""
    return [cel(f"self.judgeUpdate.strategy == 'BlueGreen' || self.{f} == oldSelf.{f}", f"spec.{f} {IMMUTABLE_HINT}",
                f".{f}") for f in JUDGE_FIELDS]
OpaqueObject = dict[str, Any]
"""A Kubernetes core type (EnvVar, Volume, Affinity...) passed through verbatim to the pod."""

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LabelMap = Annotated[
    dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]],
    Field(max_length=64, json_schema_extra=validations(cel(
        f"self.all(k, k.size() <= 317 && k.matches('{LABEL_KEY}'))",
        "keys must be label keys: an optional DNS subdomain prefix and '/', then at most 63 characters "
        "(alphanumerics, '-', '_', '.'), starting and ending with an alphanumeric"))),
]
"""Labels as the API server accepts them on a pod, checked at admission rather than at pod creation."""
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY = rf"^(\+|-)?{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"
"""The API server's resource.Quantity syntax, as in the core types' own OpenAPI schema."""
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY,
             "x-kubernetes-int-or-string": True}
Resources = Annotated[OpaqueObject, WithJsonSchema({
    "type": "object", "properties": {
        "limits": {"type": "object", "description": "Maximum amount of each resource.",
                   "additionalProperties": _QUANTITY},
        "requests": {"type": "object", "description": "Amount of each resource the scheduler reserves.",
                     "additionalProperties": _QUANTITY}},
    "x-kubernetes-preserve-unknown-fields": True})]
"""core/v1 ResourceRequirements: limits and requests must be resource quantities (``500m``, ``4Gi``)."""
EnvVar = Annotated[OpaqueObject, WithJsonSchema({
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string", "minLength": 1, "description": "Name of the variable."}},
    "x-kubernetes-preserve-unknown-fields": True})]
"""core/v1 EnvVar: passed through, but a name is required."""


class ModelSpec(ApiModel):
    """Which judge the pool serves."""

    path: str = Field(min_length=1, max_length=1024)
    """Model path or hub name given to SGLang as --model-path."""
    served_name: str | None = Field(None, max_length=253)
    """Name clients use in the OpenAI-compatible API (--served-model-name); defaults to the path."""
    revision: str | None = Field(None, max_length=253)
    """Model revision (branch, tag or commit) passed as --revision."""


KEY_FLAGS = {"--api-key": "--ap", "--admin-api-key": "--ad"}
"""SGLang's flags that take a key, each with its shortest abbreviation: SGLang's parser allows
abbreviations, so ``--api-k x`` is ``--api-key x`` (tests/contract checks these against SGLang's flags)."""
KEY_SPELLINGS = tuple(flag[:n] for flag, shortest in KEY_FLAGS.items() for n in range(len(shortest), len(flag) + 1))
"""Every argument SGLang reads as a key flag, without its ``=value``."""
MAX_ARGUMENTS = 512
"""Bounds args and extraArgs (SGLang has about 530 flags): the API server refuses a CEL rule over a list
whose cost it cannot bound, and the key rules look at every argument."""
CONFIG_FLAG = "--config"
"""SGLang's ``--config <file>.yaml``: it reads one only, and a pool's API key comes in one of its own."""


def _argument_rules(field: str) -> list[dict[str, str]]:
    """What ``args`` and ``extraArgs`` must not hold: a key, which every process list and the pod spec
    show (refused with a pointer to apiKey), and with apiKey set, a second ``--config``."""
    flags = ", ".join(f"'{s}'" for s in KEY_SPELLINGS)
    assigned = ", ".join(f"'{s}='" for s in KEY_SPELLINGS)
    return [
        cel(f"self.{field}.all(a, !(a in [{flags}] || [{assigned}].exists(p, a.startsWith(p))))",
            f"spec.engine.{field} must not hold an API key (--api-key, --admin-api-key or an abbreviation): "
            "arguments show in the pod spec and in every process list; put the key in a Secret and set "
            "spec.engine.apiKey.secretKeyRef", f".{field}"),
        cel(f"!has(self.apiKey) || !self.{field}.exists(a, a == '{CONFIG_FLAG}' || a.startsWith('{CONFIG_FLAG}='))",
            f"spec.engine.{field} must not hold {CONFIG_FLAG} when spec.engine.apiKey is set: the key reaches "
            f"SGLang in a {CONFIG_FLAG} file of its own, and SGLang reads one only", f".{field}"),
    ]


class SecretKeySelector(ApiModel):
    """A key of a Secret in the pool's namespace (core/v1 SecretKeySelector)."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret, in the pool's namespace."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key within the Secret whose value is used."""


class ApiKeySource(ApiModel):
    """Where the engine's API key comes from."""

    secret_key_ref: SecretKeySelector
    """A key of a Secret in the pool's namespace; its value (visible ASCII, surrounding whitespace ignored,
    not starting with "-", which SGLang would read as a flag) is the key."""


class EngineSpec(ApiModel):
    """The SGLang engine container of every replica; changes apply to replicas created afterwards."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.gpusPerReplica >= self.tensorParallelSize",
                "gpusPerReplica must be at least tensorParallelSize", ".gpusPerReplica"),
            *_argument_rules("args"),
            *_argument_rules("extraArgs"),
        )
    }

    image: str = Field(f"lmsysorg/sglang:{SGLANG_IMAGE_TAG}", min_length=1)
    """Engine container image (default: SGLang's image of the release the project is tested against)."""
    command: list[str] = Field(default_factory=list)
    """Overrides the launcher (default: python3 -m sglang.launch_server); the simulator uses [genrm-sim]."""
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGUMENTS)
    """Replaces the generated SGLang arguments entirely when not empty (advanced)."""
    extra_args: list[str] = Field(default_factory=list, max_length=MAX_ARGUMENTS)
    """Extra SGLang arguments appended to the generated ones; the operator's --weight-version (the pool's
    judge revision, reported with every answer) comes after them."""
    seed: int = Field(42, ge=0, le=2**31 - 1)
    """The single --random-seed every replica of the pool uses, so replicas answer identically."""
    deterministic: bool = True
    """--enable-deterministic-inference, so replicas give equal verdicts; false needs verification.sampling
    Greedy or verification.enabled=false."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """SGLang --tp-size."""
    gpus_per_replica: int = Field(1, ge=0, le=64)
    """nvidia.com/gpu requested and limited per replica pod."""
    port: int = Field(30000, ge=1, le=65535)
    """Engine port; the engine binds 127.0.0.1 so only the gateway sidecar can reach it."""
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment variables (core/v1 EnvVar) for the engine container."""
    resources: Resources = Field(default_factory=dict)
    """Engine container resources (core/v1 ResourceRequirements); the GPU limit is added."""
    startup_timeout_seconds: int = Field(1800, ge=1)
    """A replica not ready within this time after it could start (creation, or later its scheduling or its
    first container start) is replaced; one that cannot start without a change (Unschedulable, or a
    container the kubelet cannot create, such as a missing Secret) is kept and reported instead."""
    api_key: ApiKeySource | None = None
    """SGLang's --api-key, from a Secret: it never appears in a command line or in the pod spec (an init
    container writes it to a --config file). The gateway sends it on every engine call, and judge clients
    must send it too (Authorization: Bearer <key>). Read when a replica starts: after changing the Secret's
    value, roll the replicas (e.g. change an annotation in spec.template)."""


class GatewayLimits(ApiModel):
    """What one client may cost a replica's gateway; each refusal has its own status code."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.maxConnectionAgeSeconds == 0.0 || self.maxConnectionAgeSeconds >= 10.0",
                "maxConnectionAgeSeconds must be 0 (off) or at least 10: shorter ages turn keep-alive off",
                ".maxConnectionAgeSeconds"),
        )
    }

    max_head_bytes: int = Field(defaults.MAX_HEAD_BYTES, ge=1024, le=16 * 1024 * 1024)
    """Request line plus headers larger than this are refused with 431."""
    max_headers: int = Field(defaults.MAX_HEADERS, ge=8, le=10000)
    """Requests with more header fields are refused with 431."""
    head_timeout_seconds: float = Field(defaults.HEAD_TIMEOUT_SECONDS, gt=0, le=3600)
    """A request head not complete this long after its first byte is refused with 408."""
    body_timeout_seconds: float = Field(defaults.BODY_TIMEOUT_SECONDS, gt=0, le=3600)
    """A request body not complete within this is refused with 408 (and stops counting as in flight)."""
    max_json_depth: int = Field(defaults.MAX_JSON_DEPTH, ge=2, le=1000)
    """JSON bodies nesting deeper are refused with 400."""
    max_json_containers: int = Field(defaults.MAX_JSON_CONTAINERS, ge=16, le=10_000_000)
    """JSON bodies with more arrays and objects are refused with 400 (bounds the gateway's parsing time)."""
    max_batch_size: int = Field(defaults.MAX_BATCH_SIZE, ge=1, le=1_000_000)
    """Batched requests with more prompts are refused with 400."""
    max_connections: int = Field(defaults.MAX_CONNECTIONS, ge=1, le=1_000_000)
    """Open client connections per replica; more are answered 503 and closed."""
    write_timeout_seconds: float = Field(defaults.WRITE_TIMEOUT_SECONDS, gt=0, le=3600)
    """A client that reads nothing of its response this long is disconnected and its request aborted."""
    keep_alive_seconds: float = Field(defaults.KEEP_ALIVE_SECONDS, gt=0, le=3600)
    """Idle keep-alive client connections are closed after this."""
    max_connection_age_seconds: float = Field(defaults.MAX_CONNECTION_AGE_SECONDS, ge=0, le=86400)
    """A client connection older than this (jittered by up to 10% either way) is handed back: its next
    response carries Connection: close, so the client reconnects and the Service places it anew. The
    backstop of load spread when the operator is away; 0 turns it off, else at least 10."""
    engine_wait_seconds: float = Field(defaults.ENGINE_WAIT_SECONDS, ge=0, le=600)
    """A request that finds the engine unreachable, and no other serving replica of the pool to take it, waits
    this long for the engine to come back before a retryable 503 (0: the 503 comes at once)."""
    engine_head_timeout_seconds: float = Field(defaults.ENGINE_HEAD_TIMEOUT_SECONDS, gt=0, le=86400)
    """An engine answer whose head has not come this long after the request was sent is refused with 504
    engineTimeout (a non-streamed answer's head comes only when its generation ends: this bounds one
    generation)."""
    engine_read_timeout_seconds: float = Field(defaults.ENGINE_READ_TIMEOUT_SECONDS, gt=0, le=86400)
    """An engine answer that sends nothing more this long, while the gateway reads it, is ended: 504
    engineTimeout, or a cut stream (and the engine request is aborted)."""


class GatewaySpec(ApiModel):
    """The gateway sidecar: the pod's only ingress, counting in-flight requests. Changes apply to replicas
    created afterwards."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.port != self.controlPort", "controlPort must differ from port", ".controlPort"),
        )
    }

    image: str = Field("genrm/gateway:0.1.0", min_length=1)
    """Gateway container image."""
    port: int = Field(sidecar.TRAFFIC_PORT, ge=1, le=65535)
    """Port of judge traffic (pod IP); the Service targets it. Only the judge routes are served here."""
    control_port: int = Field(sidecar.CONTROL_PORT, ge=1, le=65535)
    """Port of the probes, the drain API and /metrics (the kubelet, the operator, Prometheus)."""
    resources: Resources = Field(default_factory=dict)
    """Gateway container resources (core/v1 ResourceRequirements)."""
    max_request_body_bytes: int = Field(sidecar.MAX_BODY_BYTES, ge=1024)
    """Requests with larger bodies are refused with 413."""
    limits: GatewayLimits = Field(default_factory=GatewayLimits)
    """Per-client limits: head size, header count, timeouts, JSON depth, connections."""


class DrainSpec(ApiModel):
    """How a scale-in victim is drained before it is deleted."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.timeoutSeconds > self.propagationSeconds + self.quietSeconds",
                "timeoutSeconds must exceed propagationSeconds + quietSeconds", ".timeoutSeconds"),
        )
    }

    propagation_seconds: int = Field(sidecar.PROPAGATION_SECONDS, ge=0, le=600)
    """Time between unpublishing and fencing, for clients and endpoints to stop routing to the victim."""
    quiet_seconds: int = Field(sidecar.QUIET_SECONDS, ge=0, le=600)
    """The victim must be fenced, empty and its engine idle this long to count as drained."""
    timeout_seconds: int = Field(300, ge=1, le=86400)
    """Longest wait for a drain; should exceed the slowest judge request."""
    on_timeout: Literal["Fail", "Force"] = "Fail"
    """Fail keeps the victim fenced and fails the operation; Force deletes it anyway and records that."""


class ProbeRequest(ApiModel):
    """One fixed judge prompt used to verify a new replica."""

    prompt: str = Field(min_length=1, max_length=65536)
    """Judge prompt sent to /generate."""
    max_new_tokens: int = Field(32, ge=1, le=4096)
    """Output length of the probe."""


class VerificationSpec(ApiModel):
    """Cross-replica answer check before a new replica is published."""

    enabled: bool = True
    """Compare a new replica's answers (or reward scores) with a serving one's; with sampling Seeded this
    needs engine.deterministic."""
    sampling: Literal["Seeded", "Greedy"] = "Seeded"
    """How generative probes decode. Seeded: sampled (temperature 0.7) with samplingSeed, which SGLang
    reproduces only under deterministic inference (without it SGLang accepts the seed and ignores it), so
    Seeded needs engine.deterministic. Greedy: temperature 0 and no seed, for an engine without
    deterministic inference (SGLang refuses it with CPU's torch_native attention and on GPUs without a
    supported attention backend): a greedy answer depends on no seed. What Greedy relies on: without
    deterministic inference SGLang's kernels are not batch-invariant, so greedy answers agree across
    replicas on one GPU (or CPU) kind only while the batch a probe runs in does not flip an argmax, and the
    reference replica may be serving traffic while it is probed. Such a flip fails a good replica, which is
    then replaced with back-off; other weights or settings still show in the greedy answers. A reward
    model's probes are the same /classify requests in both modes, and without deterministic inference
    their exact scores can differ in the last bits with the batch."""
    requests: list[ProbeRequest] = Field(default_factory=list, max_length=16)
    """Probe prompts; empty means the operator's built-in judge prompts."""
    sampling_seed: int = Field(1234, ge=0, le=2**31 - 1)
    """Fixed sampling seed of Seeded probes, so sampled answers are comparable (Greedy probes carry none)."""
    timeout_seconds: int = Field(30, ge=1, le=3600)
    """Time allowed for one probe request."""


class TemplateSpec(ApiModel):
    """Pod-level settings copied into every replica pod; changes apply to replicas created afterwards."""

    node_selector: LabelMap = Field(default_factory=dict)
    """Node labels a replica pod requires."""
    tolerations: list[OpaqueObject] = Field(default_factory=list)
    """core/v1 Tolerations, e.g. for tainted GPU nodes."""
    affinity: OpaqueObject = Field(default_factory=dict)
    """core/v1 Affinity."""
    priority_class_name: str | None = None
    """PriorityClass of replica pods."""
    image_pull_secrets: list[OpaqueObject] = Field(default_factory=list)
    """core/v1 LocalObjectReferences to pull secrets."""
    service_account_name: str | None = None
    """ServiceAccount of replica pods."""
    volumes: list[OpaqueObject] = Field(default_factory=list)
    """Extra core/v1 Volumes (e.g. a model cache)."""
    volume_mounts: list[OpaqueObject] = Field(default_factory=list)
    """Extra core/v1 VolumeMounts for the engine container."""
    labels: LabelMap = Field(default_factory=dict)
    """Extra labels on replica pods."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations on replica pods."""


class ServiceSpec(ApiModel):
    """The pool's Service, which selects published replicas only. Changes apply to the existing Service,
    and a deleted one is recreated."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Service type."""
    port: int = Field(8000, ge=1, le=65535)
    """Service port, forwarded to the gateway port."""


class DisruptionBudgetSpec(ApiModel):
    """PodDisruptionBudget guarding replicas against node drains. Changes apply to the existing budget,
    a deleted one is recreated, and disabling deletes it."""

    enabled: bool = True
    """Create a PodDisruptionBudget for the pool."""
    max_unavailable: int = Field(1, ge=0)
    """Voluntary evictions allowed at once."""


class RollingUpdateSpec(ApiModel):
    """How a rolling update trades spare GPUs against serving capacity."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel("self.maxSurge + self.maxUnavailable >= 1",
                "maxSurge and maxUnavailable cannot both be 0: a rollout could then never replace a replica"),
        )
    }

    max_surge: int = Field(1, ge=0, le=10000)
    """Replicas created above spec.replicas while outdated ones are still serving."""
    max_unavailable: int = Field(0, ge=0, le=10000)
    """Replicas below spec.replicas the rollout may take out of service at once (used when no spare GPU
    is left for a surge replica)."""


class UpdateStrategySpec(ApiModel):
    """How a change to the pod template reaches the existing replicas."""

    type: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    """RollingUpdate: replace outdated replicas one surge at a time, each verified and published before an
    outdated one drains. OnDelete: replace a replica only when someone deletes it."""
    rolling_update: RollingUpdateSpec = Field(default_factory=RollingUpdateSpec)
    """RollingUpdate's surge and unavailability limits."""


PromotionMode = Literal["Manual", "Auto", "IdleGap"]


class BlueGreenSpec(ApiModel):
    """How a new judge revision comes up beside the active one and takes its place."""

    promotion: PromotionMode = "IdleGap"
    """When the preview revision becomes the active one. Manual: once the pool carries the annotation
    genrm.io/promote=<preview revision>. Auto: as soon as the preview is ready. IdleGap (default): as soon
    as it is ready and the active revision has had nothing in flight, nothing held and no demand hint for
    idleGapSeconds, so no judge phase runs across the switch."""
    preview_replicas: int | None = Field(None, ge=1, le=10000)
    """Replicas of the preview revision; default: spec.replicas."""
    idle_gap_seconds: int = Field(10, ge=1, le=3600)
    """IdleGap: how long the active revision must be idle before the switch."""
    scale_down_delay_seconds: int = Field(30, ge=0, le=86400)
    """How long the previous revision stays up, fenced, after a promotion: reverting the judge fields
    within it promotes it back without loading a model."""


class JudgeUpdateSpec(ApiModel):
    """How a change of what the judge answers (the model and the engine's judge fields) is applied."""

    strategy: Literal["Refuse", "BlueGreen"] = "Refuse"
    """Refuse (default): those fields are immutable. BlueGreen: a change brings up a new judge revision
    beside the active one (preview), and the pool's Service moves to it in one step at promotion; the
    previous revision's gateways are then fenced and hand what still reaches them to the new judge
    (docs/judge-changes.md)."""
    blue_green: BlueGreenSpec = Field(default_factory=BlueGreenSpec)
    """BlueGreen's preview size, promotion and scale-down delay."""

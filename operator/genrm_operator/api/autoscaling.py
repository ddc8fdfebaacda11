"""``spec.autoscaling`` and ``status.autoscaler``: the built-in autoscaler's API.

The shapes follow HPA v2 (``metrics[].target``, ``behavior.scaleUp/scaleDown`` with
``stabilizationWindowSeconds``, ``tolerance``, ``policies`` and ``selectPolicy``) so
that anyone who knows HPA can read a pool's autoscaling block, while the defaults are
chosen for GPU replicas that cost a GPU each and take minutes to load a model.

Numbers that are not whole (targets, tolerances, thresholds, quantiles) are Kubernetes
quantity *strings* such as ``"4"``, ``"0.85"`` or ``"850m"`` instead of JSON floats: the
API conventions avoid floats in specs because their round trip through JSON, YAML and
Go is lossy. Only plain decimals and the milli suffix are accepted (that is all a
per-replica target needs); :func:`quantity_value` turns one into a number.

The status keeps the autoscaler's memory (recommendation history for stabilization,
recent scale events for rate policies, the failure counter, the panic deadline) so a
restart or leader change of the operator resumes mid-window instead of forgetting it,
which is what HPA does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .base import ApiModel, Timestamp, cel, validations

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?m?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32)]
"""A non-negative decimal with an optional milli suffix: ``"4"``, ``"0.85"``, ``"850m"``."""
POSITIVE_QUANTITY_PATTERN = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)m?$"
PositiveQuantity = Annotated[str, Field(pattern=POSITIVE_QUANTITY_PATTERN, max_length=32)]
"""A :data:`Quantity` greater than zero (targets divide by it)."""

Mode = Literal["Off", "Advisory", "Auto"]
MetricType = Literal["InFlight", "Queue", "KVCache", "Latency", "Prometheus"]
TargetType = Literal["AverageValue", "Value"]
PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]
FallbackPolicy = Literal["Hold", "Static", "CurrentIfHigher"]
SourceType = Literal["Direct", "Prometheus"]
DecisionResult = Literal["ScaleUp", "ScaleDown", "NoChange"]

MAX_METRICS = 8
MAX_RECOMMENDATIONS = 128
MAX_SCALE_EVENTS = 64
MAX_DECISIONS = 20
MAX_ACTIVE_HINTS = 32
MAX_SEEN_HINTS = 64
WindowSeconds = Annotated[int, Field(ge=0, le=3600)]
PeriodSeconds = Annotated[int, Field(ge=1, le=1800)]


def quantity_value(quantity: str) -> float:
    """The number a :data:`Quantity` string stands for (``"850m"`` -> 0.85)."""
    if quantity.endswith("m"):
        return float(quantity[:-1]) / 1000
    return float(quantity)


def format_quantity(value: float) -> str:
    """A number as a :data:`Quantity` string with at most three decimals (for status)."""
    text = f"{max(value, 0.0):.3f}".rstrip("0").rstrip(".")
    return text or "0"


@dataclass(frozen=True)
class _Rule:
    """A cross-field rule stated once: CEL for the API server, a predicate for Python callers."""

    cel: str
    message: str
    holds: Callable[[Any], bool]


def _ruled(*rules: _Rule) -> tuple[ConfigDict, Callable[[Any], Any]]:
    """Model config carrying the rules into the CRD, and an after-validator enforcing them."""

    def check(model: Any) -> Any:
        for rule in rules:
            if not rule.holds(model):
                raise ValueError(rule.message)
        return model

    config = ConfigDict(json_schema_extra=validations(*(cel(r.cel, r.message) for r in rules)))
    return config, check


_TARGET_CONFIG, _check_target = _ruled(
    _Rule(
        "self.type == 'AverageValue' ? has(self.averageValue) && !has(self.value)"
        " : has(self.value) && !has(self.averageValue)",
        "set averageValue for type AverageValue and value for type Value (exactly one)",
        lambda t: (t.average_value is not None) == (t.type == "AverageValue")
        and (t.value is not None) == (t.type == "Value"),
    ),
)


class MetricTarget(ApiModel):
    """The level one metric is held at (HPA's MetricTarget without Utilization)."""

    model_config = _TARGET_CONFIG

    type: TargetType = "AverageValue"
    """AverageValue: the target is per replica and the desired count is ceil(total / averageValue),
    independent of the current count, so the backlog on old replicas after a scale-up cannot make
    the pool shrink again (the Ray #18925 effect). Value (Prometheus only): the target is for the
    query's single number and the desired count is ceil(ready replicas x value / target)."""
    average_value: PositiveQuantity | None = None
    """Per-replica target, e.g. "8" in-flight requests, "0.85" KV-cache usage."""
    value: PositiveQuantity | None = None
    """Whole-pool target for type Value, e.g. "2" seconds of p99 latency."""

    _checked = model_validator(mode="after")(_check_target)

    @property
    def quantity(self) -> str:
        """The target quantity, whichever of the two fields holds it."""
        return self.average_value if self.average_value is not None else self.value or "0"

    def amount(self) -> float:
        """The target as a number."""
        return quantity_value(self.quantity)


_METRIC_CONFIG, _check_metric = _ruled(
    _Rule(
        "(self.type == 'Latency') == has(self.quantile)",
        "quantile is required for, and only allowed on, Latency metrics",
        lambda m: (m.type == "Latency") == (m.quantile is not None),
    ),
    _Rule(
        "(self.type == 'Prometheus') == has(self.query)",
        "query is required for, and only allowed on, Prometheus metrics",
        lambda m: (m.type == "Prometheus") == (m.query is not None),
    ),
    _Rule(
        "self.type == 'Prometheus' || self.target.type == 'AverageValue'",
        "per-replica metrics (InFlight, Queue, KVCache, Latency) take an AverageValue target",
        lambda m: m.type == "Prometheus" or m.target.type == "AverageValue",
    ),
)


class MetricSpec(ApiModel):
    """One signal the autoscaler follows; the pool gets the largest count any signal asks for."""

    model_config = _METRIC_CONFIG

    type: MetricType
    """InFlight: requests inside a replica's gateway (running + queued), the primary driver.
    Queue: the engine's running + queued requests. KVCache: KV-cache token usage (0..1), a saturation
    guard only: at or above target it forces at least one more replica, and it keeps a scale-down from
    pushing the survivors to the target; being bounded by 1.0 it cannot say how many replicas are missing,
    so it is never the only metric. Latency: a quantile of the gateway's request-latency histogram per
    replica (lagging and non-linear: use it next to InFlight, not instead). Prometheus: a PromQL query
    returning one number."""
    name: str | None = Field(None, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=63)
    """Name used in status and metrics; defaults to the type. Needed when two metrics share a type."""
    target: MetricTarget
    """The level to hold the metric at."""
    quantile: PositiveQuantity | None = None
    """Latency only: the quantile, e.g. "0.99"."""
    query: str | None = Field(None, max_length=4096)
    """Prometheus only: PromQL returning a single sample."""

    _checked = model_validator(mode="after")(_check_metric)

    @property
    def key(self) -> str:
        """The metric's identity in observations, status and decision records."""
        return self.name or self.type


class ScalingPolicy(ApiModel):
    """How much the pool may change within a look-back period (HPA's HPAScalingPolicy)."""

    type: PolicyType
    """Pods: an absolute number of replicas. Percent: a share of the count at the period's start."""
    value: int = Field(ge=1)
    """Replicas or percent allowed per period."""
    period_seconds: PeriodSeconds
    """Look-back over which the change budget holds."""


def _policies(*items: tuple[PolicyType, int, int]) -> tuple[ScalingPolicy, ...]:
    return tuple(ScalingPolicy(type=t, value=v, period_seconds=p) for t, v, p in items)


class ScaleUpRules(ApiModel):
    """Scale-up rules; each unset field takes the default for GPU judges below."""

    stabilization_window_seconds: WindowSeconds = 0
    """0: grow on the first recommendation. A burst of judge calls stalls the RL training step, and a
    replica needs minutes to load, so any waiting here only adds to that."""
    tolerance: Quantity = "0.05"
    """Deadband above the target (ratio 1 + tolerance). Small because an undersized pool queues requests,
    but not 0 so that measurement noise at exactly the target does not add a GPU."""
    policies: tuple[ScalingPolicy, ...] = Field(
        default_factory=lambda: _policies(("Percent", 100, 60), ("Pods", 4, 60)), min_length=1, max_length=10
    )
    """Default: double or add 4 replicas per minute, whichever is more (HPA's shape over a period closer
    to a model's load time). 4 pods lets a single replica meet a 4x burst in one step."""
    select_policy: SelectPolicy = "Max"
    """Max: the policy allowing the biggest change. Min: the smallest. Disabled: never scale up."""


class ScaleDownRules(ApiModel):
    """Scale-down rules; each unset field takes the default for GPU judges below."""

    stabilization_window_seconds: WindowSeconds = 600
    """600 s: shrink only to the highest count recommended over the last 10 minutes. RL load comes in
    rollout batches separated by training steps; keeping a warm replica through a gap is far cheaper
    than another multi-minute cold start (Ray Serve uses 600 s for the same reason, HPA's 300 s is tuned
    for cheap pods)."""
    tolerance: Quantity = "0.15"
    """Deadband below the target (ratio 1 - tolerance). Wider than the scale-up one so that ceil()
    rounding on small pools (the jump between N and N-1) cannot make the pool flap."""
    policies: tuple[ScalingPolicy, ...] = Field(
        default_factory=lambda: _policies(("Pods", 1, 120), ("Percent", 10, 120)), min_length=1, max_length=10
    )
    """Default: remove 1 replica or 10 %, whichever is more, per 2 minutes: a removal drains in-flight
    judgments first, and a slow staircase lets a mistaken scale-down be caught before it compounds."""
    select_policy: SelectPolicy = "Max"
    """Max: the policy allowing the biggest change. Min: the smallest. Disabled: never scale down."""


class Behavior(ApiModel):
    """Per-direction scaling behaviour, with HPA v2 semantics."""

    scale_up: ScaleUpRules = Field(default_factory=ScaleUpRules)
    """Rules for growing the pool."""
    scale_down: ScaleDownRules = Field(default_factory=ScaleDownRules)
    """Rules for shrinking the pool."""


class PanicSpec(ApiModel):
    """Knative-style panic mode: a sudden burst overrides the scale-up window and freezes scale-down."""

    window_seconds: WindowSeconds = 10
    """The short window: while panicking, the scale-up stabilization window shrinks to this one
    (Knative's panic window is 10 % of its 60 s stable window)."""
    duration_seconds: WindowSeconds = 60
    """How long panic lasts after the last recommendation that crossed the threshold (Knative: one
    stable window). While panicking the pool never shrinks, and a further scale-up is allowed even
    while replicas added earlier are still starting."""
    threshold: PositiveQuantity
    """Required (setting it is what turns panic on; Knative uses "2"): enter panic when the raw
    recommendation reaches this multiple of the current replicas (those starting included, so a pool
    that is already growing does not panic about its own cold start)."""


_FALLBACK_CONFIG, _check_fallback = _ruled(
    _Rule(
        "self.policy == 'Hold' || has(self.replicas)",
        "replicas is required unless policy is Hold",
        lambda f: f.policy == "Hold" or f.replicas is not None,
    ),
)


class FallbackSpec(ApiModel):
    """What to do when no driving metric can be read for a while (KEDA's fallback, names and all)."""

    model_config = _FALLBACK_CONFIG

    failure_threshold: int = Field(3, ge=1)
    """Consecutive intervals with every driving metric failed before the fallback applies; until then
    the pool holds its size."""
    policy: FallbackPolicy = "Hold"
    """Hold: keep the current count (never act on missing data). Static: go to `replicas`.
    CurrentIfHigher: go to `replicas` only if that is more than now."""
    replicas: int | None = Field(None, ge=1)
    """Target for Static and CurrentIfHigher."""

    _checked = model_validator(mode="after")(_check_fallback)


_SPEC_CONFIG, _check_spec = _ruled(
    _Rule(
        "self.mode == 'Off' || has(self.maxReplicas)",
        "maxReplicas is required when mode is not Off",
        lambda s: s.mode == "Off" or s.max_replicas is not None,
    ),
    _Rule(
        "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "minReplicas must not exceed maxReplicas",
        lambda s: s.max_replicas is None or s.min_replicas <= s.max_replicas,
    ),
    _Rule(
        "self.mode == 'Off' || self.metrics.exists(m, m.type != 'KVCache')",
        "at least one metric other than KVCache is required when mode is not Off (KVCache is a guard)",
        lambda s: s.mode == "Off" or any(m.type != "KVCache" for m in s.metrics),
    ),
    _Rule(
        "self.metrics.all(m, self.metrics.exists_one(n, (has(n.name) ? n.name : n.type)"
        " == (has(m.name) ? m.name : m.type)))",
        "metric names (the type when name is unset) must be unique",
        lambda s: len({m.key for m in s.metrics}) == len(s.metrics),
    ),
    _Rule(
        "!(self.source == 'Prometheus' || self.metrics.exists(m, m.type == 'Prometheus'))"
        " || has(self.prometheusUrl)",
        "prometheusUrl is required with source Prometheus or a Prometheus metric",
        lambda s: not (s.source == "Prometheus" or any(m.type == "Prometheus" for m in s.metrics))
        or s.prometheus_url is not None,
    ),
)


class ScaleToZeroSpec(ApiModel):
    """``spec.autoscaling.scaleToZero``: let an idle pool go to zero replicas (opt-in)."""

    idle_seconds: int = Field(300, ge=30, le=86_400)
    """The pool goes to zero only after every replica has reported nothing in flight for this long,
    with no demand hint active and no replica starting. A replica that does not report (its gateway
    unreachable, or a report not seen yet) is never idle, so missing data never empties a pool."""
    hold_timeout_seconds: int | None = Field(None, ge=1, le=3600)
    """How long the activator holds a request for the pool at zero before answering ``503 holdTimeout``;
    unset: engine.startupTimeoutSeconds (at most 3600), so a request waits as long as a replica may
    take to start."""


class DemandSpec(ApiModel):
    """``spec.autoscaling.demand``: how demand hints become a replica floor (`genrm_contract.demand`)."""

    replica_requests_per_second: PositiveQuantity = "4"
    """Judge requests per second one replica serves at its target load: a hint of N requests over T
    seconds holds the pool at ``ceil(N / T / this)`` replicas (at most maxReplicas) while it lasts.
    Only until the pool has measured it (status.autoscaler.replicaThroughput), which then replaces it."""


class AutoscalingSpec(ApiModel):
    """``spec.autoscaling``: the built-in autoscaler, which writes ``spec.replicas`` in mode Auto."""

    model_config = _SPEC_CONFIG

    mode: Mode = "Off"
    """Off: no autoscaling. Advisory: compute and record decisions (status, events, metrics) without
    changing spec.replicas, to evaluate a configuration on live traffic. Auto: apply them."""
    min_replicas: int = Field(1, ge=1)
    """Lower bound while the pool serves; at least 1, since missing data must never scale a pool
    towards zero. Only ``scaleToZero`` takes an idle pool below it, and a pool woken from zero comes
    back to at least this many."""
    max_replicas: int | None = Field(None, ge=1)
    """Upper bound (the GPU budget); required unless mode is Off."""
    interval_seconds: int = Field(5, ge=1, le=300)
    """Seconds between decisions (and scrapes with source Direct)."""
    metrics: tuple[MetricSpec, ...] = Field((), max_length=MAX_METRICS)
    """Signals to follow; the pool gets the maximum count over them (HPA's rule)."""
    behavior: Behavior = Field(default_factory=Behavior)
    """Stabilization windows, tolerances and rate policies per direction."""
    panic: PanicSpec | None = None
    """Unset: no panic mode. With the default 0 s scale-up window its main use is freezing scale-down
    during a burst, which the 600 s scale-down window already does."""
    fallback: FallbackSpec = Field(default_factory=FallbackSpec)
    """What to do when the metrics cannot be read."""
    source: SourceType = "Direct"
    """Direct: scrape every replica's sidecar /metrics. Prometheus: query prometheusUrl instead."""
    prometheus_url: str | None = Field(None, pattern=r"^https?://", max_length=2048)
    """Base URL of the Prometheus HTTP API, for source Prometheus and Prometheus metrics."""
    scale_to_zero: ScaleToZeroSpec | None = None
    """Unset: never below minReplicas. Set: an idle pool goes to zero (see ScaleToZeroSpec)."""
    demand: DemandSpec = Field(default_factory=DemandSpec)
    """How demand hints are sized into a replica floor."""

    _checked = model_validator(mode="after")(_check_spec)


class TimedReplicas(ApiModel):
    """A raw recommendation, kept for stabilization."""

    time: Timestamp
    """When it was made (RFC 3339)."""
    replicas: int = Field(ge=0)
    """Replicas recommended."""


class ScaleEvent(ApiModel):
    """A change the autoscaler applied, kept for the rate policies' look-back."""

    time: Timestamp
    """When it was applied (RFC 3339)."""
    change: int
    """Replicas added (positive) or removed (negative)."""


class MetricReading(ApiModel):
    """One metric as a decision saw it."""

    name: str
    """The metric's name (its type unless named)."""
    value: Quantity | None = None
    """Observed average per replica (or the query's value); unset when the metric failed."""
    target: Quantity
    """The configured target."""
    replicas: int | None = Field(None, ge=0)
    """Replicas this metric alone asked for; unset when it gave no answer."""


class ActiveHint(ApiModel):
    """A demand hint the autoscaler holds the pool up for (`genrm_contract.demand.DemandHint`)."""

    id: str = Field(max_length=63)
    """The hint's id, as its sender named it."""
    requests: int = Field(ge=1)
    """About how many requests the announced phase sends."""
    for_seconds: int = Field(ge=1)
    """Over how many seconds."""
    seen_at: Timestamp
    """When the operator first saw it (RFC 3339): its lifetime counts from here."""
    until: Timestamp
    """When it expires (RFC 3339)."""


class DecisionRecord(ApiModel):
    """One autoscaler decision, for `kubectl get -o yaml` forensics."""

    id: int = Field(ge=1)
    """Sequence number, increasing over the pool's life (also in the Event's message)."""
    time: Timestamp
    """When it was made (RFC 3339)."""
    current_replicas: int = Field(ge=0)
    """spec.replicas when deciding."""
    metrics: tuple[MetricReading, ...] = ()
    """Every metric's value, target and proposal."""
    raw_recommendation: int = Field(ge=0)
    """What the metrics (or the fallback) asked for, before stabilization, rate policies and bounds."""
    limited_by: str | None = None
    """Which limiter changed the raw recommendation (a ScalingLimited or AbleToScale reason)."""
    demand_floor: int | None = Field(None, ge=0)
    """The replica floor the active demand hints asked for; unset when none was active."""
    desired_replicas: int = Field(ge=0)
    """The outcome."""
    result: DecisionResult
    """Direction of the outcome relative to current_replicas."""
    applied: bool
    """False in mode Advisory (recorded, not written)."""


class AutoscalerStatus(ApiModel):
    """``status.autoscaler``: the autoscaler's memory and its recent decisions."""

    desired_replicas: int | None = Field(None, ge=0)
    """The last decision's outcome."""
    last_scale_time: Timestamp | None = None
    """When the autoscaler last changed spec.replicas (RFC 3339)."""
    consecutive_failures: int = Field(0, ge=0)
    """Intervals in a row with every driving metric failed (compared with fallback.failureThreshold)."""
    panic_until: Timestamp | None = None
    """Panic mode lasts until this time (RFC 3339); unset when not panicking."""
    recommendations: tuple[TimedReplicas, ...] = Field((), max_length=MAX_RECOMMENDATIONS)
    """Raw recommendations inside the longest stabilization window (persisted so a restart keeps it)."""
    scale_events: tuple[ScaleEvent, ...] = Field((), max_length=MAX_SCALE_EVENTS)
    """Applied changes inside the longest policy period."""
    decisions: tuple[DecisionRecord, ...] = Field((), max_length=MAX_DECISIONS)
    """The last decisions that changed something or were limited, oldest first."""
    demand_floor: int | None = Field(None, ge=0)
    """The replica floor the active demand hints hold the pool at; unset when no hint is active."""
    replica_throughput: Quantity | None = None
    """Requests per second one replica was measured to answer at its InFlight target (a moving average
    over intervals where a replica was that busy); what demand hints are sized with once known,
    instead of demand.replicaRequestsPerSecond. Unset until measured (direct scrapes only)."""
    demand: tuple[ActiveHint, ...] = Field((), max_length=MAX_ACTIVE_HINTS)
    """The demand hints in force, oldest first."""
    demand_seen: tuple[str, ...] = Field((), max_length=MAX_SEEN_HINTS)
    """Ids of hints that expired, newest last: a gateway or an annotation still reporting one does
    not start it again."""
    demand_annotation_error: str | None = Field(None, max_length=1024)
    """Why the pool's genrm.io/demand annotation was not taken as a hint; unset when it was (or is absent)."""

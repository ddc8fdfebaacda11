"""Per-metric proposals: how many replicas one signal asks for, with HPA's missing-data rules.

Each proposal follows HPA's replica calculator for the matching metric kind, so a pool
configured like an HPA decides like one:

* per-replica metrics (InFlight, Queue, Latency) are HPA "Pods" metrics: the desired count
  is ``ceil(sum / target)``. That is demand-based (it does not depend on the current count)
  and, because starting replicas are compared through the current count, pending-aware:
  capacity on the way covers demand before any new replica is asked for;
* KVCache is a saturation guard, not a driver (see :func:`_kv_guard`);
* Prometheus metrics are HPA "External" metrics with Value or AverageValue semantics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from genrm_operator.api.autoscaling import MetricSpec

from .observation import Observation, ReplicaState


@dataclass(frozen=True)
class Tolerance:
    """Per-direction deadband around ratio 1.0 (HPA KEP-4951 semantics)."""

    up: float
    down: float

    def within(self, ratio: float) -> bool:
        """True when the observed/target ratio is too close to 1 to act on."""
        return 1.0 - self.down <= ratio <= 1.0 + self.up


@dataclass(frozen=True)
class MetricOutcome:
    """One metric's reading and proposal.

    ``replicas`` is None when the metric gave no answer: ``failed`` tells a real failure
    (serving replicas exist but none reported, or the query failed), which blocks
    scale-down, from an absence of data (nothing is serving yet), which only holds.
    """

    key: str
    target: float
    value: float | None
    replicas: int | None
    failed: bool


def evaluate(metric: MetricSpec, observation: Observation, tolerance: Tolerance) -> MetricOutcome:
    """The proposal of ``metric`` for this observation."""
    if metric.type == "Prometheus":
        return _pool_metric(metric, observation, tolerance)
    serving = [r for r in observation.replicas if r.state is ReplicaState.SERVING]
    sampled = [r.values[metric.key] for r in serving if metric.key in r.values]
    target = metric.target.amount()
    if not sampled:
        return MetricOutcome(metric.key, target, None, None, failed=bool(serving))
    missing = len(serving) - len(sampled)
    if metric.type == "KVCache":
        replicas = _kv_guard(sampled, missing, target, observation.current_replicas)
    else:
        replicas = _demand(sampled, missing, observation, target, tolerance)
    return MetricOutcome(metric.key, target, sum(sampled) / len(sampled), replicas, failed=False)


def _demand(
    sampled: list[float], missing: int, observation: Observation, target: float, tolerance: Tolerance
) -> int:
    """HPA's ``calcPlainMetricReplicas``: ceil(sum / target) with the missing and unready rules.

    Missing replicas (serving, no sample) count as exactly the target on a would-be scale-down
    and as 0 on a would-be scale-up; starting replicas count as 0 on a would-be scale-up. If
    filling them in brings the ratio within tolerance or flips its direction, hold: the
    unknown replicas might be exactly what makes the difference. One deliberate deviation:
    at a ratio of exactly 1.0 HPA fills missing replicas with 0 and can then shrink the pool
    on missing data; here they count as the target, so it holds.
    """
    current = observation.current_replicas
    ratio = sum(sampled) / len(sampled) / target
    starting = observation.count(ReplicaState.STARTING)
    scale_up_with_starting = starting > 0 and ratio > 1.0
    if not scale_up_with_starting and missing == 0:
        return current if tolerance.within(ratio) else math.ceil(ratio * len(sampled))
    filled_total = sum(sampled) + (missing * target if ratio <= 1.0 else 0.0)
    counted = len(sampled) + missing + (starting if scale_up_with_starting else 0)
    new_ratio = filled_total / counted / target
    flipped = (ratio > 1.0 > new_ratio) or (ratio < 1.0 < new_ratio)
    if tolerance.within(new_ratio) or flipped:
        return current
    replicas = math.ceil(new_ratio * counted)
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current
    return replicas


def _kv_guard(sampled: list[float], missing: int, target: float, current: int) -> int:
    """KV-cache usage as a saturation guard.

    Usage is bounded by 1.0, so it can say "saturated" but not by how much: at or above the
    target (on the replicas that reported) it asks for one replica more than now, the one
    step it can justify. Below the target it asks for the fewest replicas that keep the
    average below the target once the load is spread over them, which is the "simulate
    N-1" check that keeps a scale-down driven by the other metrics from saturating the
    survivors. Replicas without a sample count as at the target there, as HPA does on
    scale-down.
    """
    if sum(sampled) / len(sampled) >= target:
        return current + 1
    return math.floor((sum(sampled) + missing * target) / target) + 1


def _pool_metric(metric: MetricSpec, observation: Observation, tolerance: Tolerance) -> MetricOutcome:
    """HPA's External metric: AverageValue divides the total by the target, Value scales the ready count."""
    target = metric.target.amount()
    value = observation.pool_values.get(metric.key)
    serving = observation.count(ReplicaState.SERVING)
    if value is None or serving == 0:
        return MetricOutcome(metric.key, target, value, None, failed=value is None)
    current = observation.current_replicas
    if metric.target.type == "AverageValue":
        ratio = value / (target * current)
        replicas = current if tolerance.within(ratio) else math.ceil(value / target)
    else:
        ratio = value / target
        replicas = current if tolerance.within(ratio) else math.ceil(ratio * serving)
    return MetricOutcome(metric.key, target, value, replicas, failed=False)

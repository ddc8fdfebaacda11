"""Per-metric proposals: how many replicas one signal asks for, with HPA's missing-data rules.

Each proposal follows HPA's replica calculator for the matching metric kind, so a pool
configured like an HPA decides like one, in the same integer milli-units (:mod:`.milli`):

* per-replica metrics (InFlight, Queue, Latency) are HPA "Pods" metrics: the desired count
  is ``ceil(sum / target)``. That is demand-based (it does not depend on the current count)
  and, because starting replicas are compared through the current count, pending-aware:
  capacity on the way covers demand before any new replica is asked for;
* KVCache is a saturation guard, not a driver (see :func:`_kv_guard`);
* Prometheus metrics are HPA "External" metrics with Value or AverageValue semantics.

Which of the three a metric type is comes from its row in :data:`.signals.SIGNALS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from genrm_operator.api.autoscaling import Behavior, MetricSpec

from .milli import MILLI, ceil_div, quantity_milli, sample_milli
from .observation import Observation, ReplicaState
from .signals import SIGNALS


@dataclass(frozen=True)
class Tolerance:
    """Per-direction deadband around ratio 1.0 (HPA KEP-4951 semantics), in milli-units of the ratio."""

    up: int
    down: int

    @classmethod
    def of(cls, behavior: Behavior) -> Tolerance:
        """The tolerances a pool's behavior sets."""
        return cls(up=quantity_milli(behavior.scale_up.tolerance), down=quantity_milli(behavior.scale_down.tolerance))

    def within(self, usage: int, target: int) -> bool:
        """True when the ratio ``usage / target`` is too close to 1 to act on (both in milli-units).

        Cross-multiplied, so the edges are exact: a tolerance of 0.1 holds at a ratio of exactly 1.1.
        """
        return (MILLI - self.down) * target <= MILLI * usage <= (MILLI + self.up) * target


@dataclass(frozen=True)
class MetricOutcome:
    """One metric's reading and proposal.

    ``replicas`` is None when the metric gave no answer: ``failed`` tells a real failure
    (serving replicas exist but none reported, or the query failed), which blocks
    scale-down, from an absence of data (nothing is serving yet), which only holds.
    ``value`` is the number the proposal was computed from (the per-replica average in
    whole milli-units, or the query's value), for status and gauges.
    """

    key: str
    target: float
    value: float | None
    replicas: int | None
    failed: bool


def evaluate(metric: MetricSpec, observation: Observation, tolerance: Tolerance) -> MetricOutcome:
    """The proposal of ``metric`` for this observation."""
    target = quantity_milli(metric.target.quantity)
    if not SIGNALS[metric.type].per_replica:
        return _pool_metric(metric, observation, target, tolerance)
    serving = [r for r in observation.replicas if r.state is ReplicaState.SERVING]
    sampled = [sample_milli(r.values[metric.key]) for r in serving if metric.key in r.values]
    if not sampled:
        return MetricOutcome(metric.key, target / MILLI, None, None, failed=bool(serving))
    missing = len(serving) - len(sampled)
    if SIGNALS[metric.type].guard:
        replicas = _kv_guard(sampled, missing, target, observation.current_replicas)
    else:
        replicas = _demand(sampled, missing, observation, target, tolerance)
    average = sum(sampled) // len(sampled)
    return MetricOutcome(metric.key, target / MILLI, average / MILLI, replicas, failed=False)


def _demand(sampled: list[int], missing: int, observation: Observation, target: int, tolerance: Tolerance) -> int:
    """HPA's ``calcPlainMetricReplicas``: ceil(sum / target) with the missing and unready rules, in milli-units.

    As HPA's ``GetMetricUsageRatio`` does, the average is the total divided by the count in
    integers, and the count is ``ceil(average x replicas / target)`` computed exactly.

    Missing replicas (serving, no sample) count as exactly the target on a would-be scale-down
    and as 0 on a would-be scale-up; starting replicas count as 0 on a would-be scale-up. If
    filling them in brings the ratio within tolerance or flips its direction, hold: the
    unknown replicas might be exactly what makes the difference. One deliberate deviation:
    at a ratio of exactly 1.0 HPA fills missing replicas with 0 and can then shrink the pool
    on missing data; here they count as the target, so it holds.
    """
    current = observation.current_replicas
    average = sum(sampled) // len(sampled)
    starting = observation.count(ReplicaState.STARTING)
    scale_up_with_starting = starting > 0 and average > target
    if not scale_up_with_starting and missing == 0:
        return current if tolerance.within(average, target) else ceil_div(average * len(sampled), target)
    filled_total = sum(sampled) + (missing * target if average <= target else 0)
    counted = len(sampled) + missing + (starting if scale_up_with_starting else 0)
    new_average = filled_total // counted
    flipped = (average > target > new_average) or (average < target < new_average)
    if tolerance.within(new_average, target) or flipped:
        return current
    replicas = ceil_div(new_average * counted, target)
    if (new_average < target and replicas > current) or (new_average > target and replicas < current):
        return current
    return replicas


def _kv_guard(sampled: list[int], missing: int, target: int, current: int) -> int:
    """KV-cache usage as a saturation guard (milli-units).

    Usage is bounded by 1.0, so it can say "saturated" but not by how much: at or above the
    target (on the replicas that reported) it asks for one replica more than now, the one
    step it can justify. Below the target it asks for the fewest replicas that keep the
    average below the target once the load is spread over them, which is the "simulate
    N-1" check that keeps a scale-down driven by the other metrics from saturating the
    survivors. Replicas without a sample count as at the target there, as HPA does on
    scale-down.
    """
    if sum(sampled) >= target * len(sampled):
        return current + 1
    return (sum(sampled) + missing * target) // target + 1


def _pool_metric(metric: MetricSpec, observation: Observation, target: int, tolerance: Tolerance) -> MetricOutcome:
    """HPA's External metric: AverageValue divides the total by the target, Value scales the ready count."""
    value = observation.pool_values.get(metric.key)
    serving = observation.count(ReplicaState.SERVING)
    if value is None or serving == 0:
        return MetricOutcome(metric.key, target / MILLI, value, None, failed=value is None)
    usage = sample_milli(value)
    current = observation.current_replicas
    if metric.target.type == "AverageValue":
        within = tolerance.within(usage, target * current)
        replicas = current if within else ceil_div(usage, target)
    else:
        replicas = current if tolerance.within(usage, target) else ceil_div(usage * serving, target)
    return MetricOutcome(metric.key, target / MILLI, usage / MILLI, replicas, failed=False)

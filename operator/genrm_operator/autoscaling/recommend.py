"""From per-metric proposals to one raw recommendation, with the missing-data rules.

HPA's rules, made explicit and extended with a fallback:

* the pool gets the largest count any metric asks for;
* a scale-up from the metrics that answered always proceeds (an outage must not stop a
  pool from meeting a burst that the healthy signals see);
* a failed metric blocks any scale-down: what it would have said is unknown;
* when no driving metric answers, hold, and after ``failureThreshold`` such intervals in a
  row apply ``fallback.policy``. Hold is the default because acting on missing data is how
  other autoscalers scaled pools to zero during a Prometheus outage (KEDA #965, #3064).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from genrm_operator.api.autoscaling import AutoscalingSpec

from .metrics import MetricOutcome
from .signals import SIGNALS


@dataclass(frozen=True)
class Recommendation:
    """The raw recommendation, or why there is none.

    ``replicas`` is None when the control law must hold without recording anything (the
    stabilization history only holds what the metrics said). ``reason`` names the rule that
    decided (a condition reason; ``FallbackActive`` when the fallback produced ``replicas``).
    """

    replicas: int | None
    reason: str | None
    consecutive_failures: int


def recommend(
    spec: AutoscalingSpec, outcomes: Sequence[MetricOutcome], current: int, previous_failures: int
) -> Recommendation:
    """Combine ``outcomes`` (aligned with ``spec.metrics``) for a pool of ``current`` replicas."""
    drivers = [o for o, m in zip(outcomes, spec.metrics, strict=True) if not SIGNALS[m.type].guard]
    proposals = [o.replicas for o in outcomes if o.replicas is not None]
    driver_blind = all(o.replicas is None for o in drivers)
    drivers_failed = driver_blind and any(o.failed for o in drivers)
    if not driver_blind:
        failures = 0
    elif drivers_failed:
        failures = previous_failures + 1
    else:
        failures = previous_failures  # nothing is serving yet: no data, which is not a failure

    if proposals and max(proposals) > current:
        return Recommendation(max(proposals), None, failures)
    if drivers_failed:
        return _fallback(spec, current, failures)
    if driver_blind:
        return Recommendation(None, "NoServingReplicas", failures)
    if any(o.failed for o in outcomes) and max(proposals) < current:
        return Recommendation(None, "MetricsFailed", failures)
    return Recommendation(max(proposals), None, failures)


def _fallback(spec: AutoscalingSpec, current: int, failures: int) -> Recommendation:
    """Every driving metric failed: hold, or apply the fallback once the threshold is reached."""
    fallback = spec.fallback
    if failures < fallback.failure_threshold or fallback.replicas is None:
        return Recommendation(None, "FailedGetMetrics", failures)
    if fallback.policy == "CurrentIfHigher":
        return Recommendation(max(current, fallback.replicas), "FallbackActive", failures)
    return Recommendation(fallback.replicas, "FallbackActive", failures)

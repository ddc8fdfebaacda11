"""Operator metrics, named after Prometheus conventions (genrm_ prefix, base units, _total).

Parity with controller-runtime: reconcile totals by result, errors and
durations, plus the number of pools being worked on (kopf has no work queue;
each pool has one daemon). Per-pool series are removed when the pool goes.
"""

from __future__ import annotations

from genrm_contract.sidecar import HandBack
from prometheus_client import Counter, Gauge, Histogram

from ..api.pool import GenRMPoolSpec, GenRMPoolStatus
from ..api.status import HistoryEntry

RECONCILE_TOTAL = Counter("genrm_operator_reconcile_total", "Reconcile steps by result.",
                          ["namespace", "pool", "result"])
RECONCILE_ERRORS = Counter("genrm_operator_reconcile_errors_total", "Reconcile steps that raised.",
                           ["namespace", "pool"])
RECONCILE_SECONDS = Histogram("genrm_operator_reconcile_duration_seconds", "Duration of one reconcile step.",
                              ["namespace", "pool"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
ACTIVE_POOLS = Gauge("genrm_operator_active_pools", "Pools with a running reconciler (kopf daemon).")
SIDECAR_REQUESTS = Counter("genrm_operator_sidecar_requests_total",
                           "HTTP requests the operator made to replica sidecars, by call (state, drain, undrain, "
                           "probe) and code (the HTTP status, or error when no answer came).", ["call", "code"])
"""Operator-wide, not per pool: what the operator costs the sidecars in all (issue: sidecar calls per second)."""
REPLICAS = Gauge("genrm_pool_replicas", "Replicas of a pool by state.", ["namespace", "pool", "state"])
OPERATIONS = Counter("genrm_pool_operations_total", "Finished scale operations.",
                     ["namespace", "pool", "type", "outcome"])
OPERATION_SECONDS = Histogram("genrm_pool_operation_duration_seconds", "Duration of finished scale operations.",
                              ["namespace", "pool", "type"],
                              buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
FORCED_DRAINS = Counter("genrm_pool_forced_drains_total", "Victims deleted after a drain timeout (Force).",
                        ["namespace", "pool"])
VERIFICATION_FAILURES = Counter("genrm_pool_verification_failures_total",
                                "New replicas whose probe answers differed from a serving replica.",
                                ["namespace", "pool"])
AUTOSCALER_DESIRED = Gauge("genrm_autoscaler_desired_replicas", "Replicas the autoscaler's last decision asked for.",
                           ["namespace", "pool"])
AUTOSCALER_CURRENT = Gauge("genrm_autoscaler_current_replicas", "spec.replicas when the autoscaler last decided.",
                           ["namespace", "pool"])
AUTOSCALER_DEMAND_FLOOR = Gauge("genrm_autoscaler_demand_floor_replicas",
                                "Replica floor the pool's active demand hints ask for (0: none active).",
                                ["namespace", "pool"])
AUTOSCALER_METRIC_VALUE = Gauge("genrm_autoscaler_metric_value",
                                "Observed value of each autoscaling metric (per replica, or the query's value).",
                                ["namespace", "pool", "metric"])
AUTOSCALER_METRIC_TARGET = Gauge("genrm_autoscaler_metric_target", "Target of each autoscaling metric.",
                                 ["namespace", "pool", "metric"])
AUTOSCALER_DECISIONS = Counter("genrm_autoscaler_decisions_total",
                               "Autoscaler decisions by outcome (ScaleUp, ScaleDown, NoChange).",
                               ["namespace", "pool", "outcome"])
CONNECTIONS_SHED = Counter("genrm_pool_connections_shed_total",
                           "Client connections the operator asked replicas to hand back, by reason (balance: "
                           "above the fair share of connections; load: above 1.5x the mean request rate).",
                           ["namespace", "pool", "reason"])
PER_POOL = (RECONCILE_TOTAL, RECONCILE_ERRORS, RECONCILE_SECONDS, REPLICAS, OPERATIONS, OPERATION_SECONDS,
            FORCED_DRAINS, VERIFICATION_FAILURES, AUTOSCALER_DESIRED, AUTOSCALER_CURRENT, AUTOSCALER_DEMAND_FLOOR,
            AUTOSCALER_METRIC_VALUE, AUTOSCALER_METRIC_TARGET, AUTOSCALER_DECISIONS, CONNECTIONS_SHED)


def start_pool(namespace: str, pool: str) -> None:
    """Create a pool's failure counters at zero, as controller-runtime does for its error counter:
    a dashboard must read "0 errors" for a healthy pool, not "no data" (indistinguishable from a
    broken scrape)."""
    for counter in (RECONCILE_ERRORS, FORCED_DRAINS, VERIFICATION_FAILURES):
        counter.labels(namespace, pool)
    for reason in (HandBack.BALANCE, HandBack.LOAD):
        CONNECTIONS_SHED.labels(namespace, pool, reason.value)


def observe_status(namespace: str, pool: str, spec: GenRMPoolSpec, status: GenRMPoolStatus) -> None:
    """Refresh the replica gauges from the status just written."""
    for state, value in (("desired", spec.replicas), ("current", status.replicas),
                         ("ready", status.ready_replicas), ("serving", status.serving_replicas),
                         ("draining", status.draining_replicas)):
        REPLICAS.labels(namespace, pool, state).set(value)


def observe_finished(namespace: str, pool: str, entries: list[HistoryEntry]) -> None:
    """Count operations that finished in this step."""
    for entry in entries:
        OPERATIONS.labels(namespace, pool, entry.type, entry.outcome).inc()
        OPERATION_SECONDS.labels(namespace, pool, entry.type).observe(entry.duration_seconds)
        if entry.forced_drains:
            FORCED_DRAINS.labels(namespace, pool).inc(entry.forced_drains)


def forget_pool(namespace: str, pool: str) -> None:
    """Drop every series of a deleted pool, so dashboards do not show ghosts."""
    for metric in PER_POOL:
        for labels in list(metric._metrics):  # prometheus_client keeps children keyed by label values
            if labels[:2] == (namespace, pool):
                metric.remove(*labels)

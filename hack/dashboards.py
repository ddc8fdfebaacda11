"""Generate the Grafana dashboards shipped with the Helm chart.

Usage: ``python hack/dashboards.py`` rewrites ``charts/genrm-operator/dashboards/*.json``;
``--check`` exits non-zero when a committed file differs from the generated one.

Why code and not hand-edited JSON: every panel gets the same datasource variable, label
filters, units and ``$__rate_interval`` by construction, and tests can lint the output
(tests/dashboards). The JSON is committed because Helm can only embed files in the chart.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genrm_contract.sidecar import Series

OUT_DIR = Path(__file__).resolve().parents[1] / "charts" / "genrm-operator" / "dashboards"
JSON = dict[str, Any]
DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
POOL = 'namespace=~"$namespace", pool=~"$pool"'
POD = POOL + ', pod=~"$pod"'
WIDTH = 24


@dataclass(frozen=True)
class Target:
    """One PromQL query and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time series panel; ``width`` in grid units (24 per row)."""

    title: str
    description: str
    unit: str
    targets: tuple[Target, ...]
    width: int = 12
    max: float | None = None
    stack: bool = False


@dataclass(frozen=True)
class Row:
    """A titled group of panels, laid out left to right."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    """A whole dashboard: its template variables are always datasource, namespace, pool (and pod)."""

    uid: str
    title: str
    description: str
    variable_metric: str
    rows: tuple[Row, ...]
    per_pod: bool = False
    tags: tuple[str, ...] = field(default=("genrm",))


def _query_variable(name: str, label: str, query: str) -> JSON:
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"}, "definition": query,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def _variables(dashboard: Dashboard) -> list[JSON]:
    metric = dashboard.variable_metric
    variables: list[JSON] = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "refresh": 1, "current": {}},
        _query_variable("namespace", "Namespace", f"label_values({metric}, namespace)"),
        _query_variable("pool", "Pool", f'label_values({metric}{{namespace=~"$namespace"}}, pool)'),
    ]
    if dashboard.per_pod:
        variables.append(_query_variable("pod", "Pod", f"label_values({metric}{{{POOL}}}, pod)"))
    return variables


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> JSON:
    defaults: JSON = {"unit": panel.unit, "min": 0,
                      "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                 "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"}}}
    if panel.max is not None:
        defaults["max"] = panel.max
    return {
        "id": panel_id, "type": "timeseries", "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"datasource": DATASOURCE, "expr": t.expr, "legendFormat": t.legend, "refId": chr(ord("A") + i)}
                    for i, t in enumerate(panel.targets)],
    }


def _layout(rows: Iterable[Row]) -> list[JSON]:
    """Grafana's grid: a row header, then panels wrapping at 24 units."""
    out: list[JSON] = []
    panel_id, y = 1, 0
    for row in rows:
        out.append({"id": panel_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                    "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y}})
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > WIDTH:
                x, y = 0, y + 8
            out.append(_panel(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    return out


def render(dashboard: Dashboard) -> JSON:
    """The dashboard model Grafana's sidecar provisions (id null, stable uid, not editable)."""
    return {
        "id": None, "uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
        "tags": list(dashboard.tags), "editable": False, "graphTooltip": 1, "schemaVersion": 39,
        "version": 1, "refresh": "30s", "time": {"from": "now-3h", "to": "now"}, "timezone": "browser",
        "timepicker": {}, "annotations": {"list": []}, "links": [], "fiscalYearStartMonth": 0,
        "liveNow": False, "weekStart": "",
        "templating": {"list": _variables(dashboard)},
        "panels": _layout(dashboard.rows),
    }


def _quantiles(metric: str, selector: str, by: str, legend: str) -> tuple[Target, ...]:
    return tuple(
        Target(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
                 f"p{round(q * 100)} {legend}")
        for q in (0.5, 0.99))


POOL_OVERVIEW = Dashboard(
    uid="genrm-pool-overview",
    title="GenRM / Pool overview",
    description="GenRMPool replicas, scale operations, the built-in autoscaler and the operator's reconcile loop.",
    variable_metric="genrm_pool_replicas",
    rows=(
        Row("Replicas", (
            Panel("Replicas by state",
                  "desired = spec.replicas; current = pods; ready = pods passing readiness; serving = published "
                  "for routing; draining = being removed.", "short",
                  (Target(f"max by (namespace, pool, state) (genrm_pool_replicas{{{POOL}}})",
                          "{{pool}} {{state}}"),), width=WIDTH),
        )),
        Row("Scale operations", (
            Panel("Finished operations", "Scale operations finished per interval, by type and outcome.", "short",
                  (Target(f"sum by (pool, type, outcome) (increase(genrm_pool_operations_total{{{POOL}}}[{RATE}]))",
                          "{{pool}} {{type}} {{outcome}}"),), stack=True),
            Panel("Operation duration", "Median and 99th percentile time from start to finish of a scale "
                  "operation, by type.", "s",
                  _quantiles("genrm_pool_operation_duration_seconds", POOL, "type", "{{type}}")),
            Panel("Forced drains", "Replicas deleted after their drain timed out (drain.onTimeout=Force): "
                  "requests may have been cut.", "short",
                  (Target(f"sum by (pool) (increase(genrm_pool_forced_drains_total{{{POOL}}}[{RATE}]))",
                          "{{pool}}"),)),
            Panel("Verification failures", "New replicas whose probe answers differed from a serving replica "
                  "(non-deterministic judge).", "short",
                  (Target(f"sum by (pool) (increase(genrm_pool_verification_failures_total{{{POOL}}}[{RATE}]))",
                          "{{pool}}"),)),
        )),
        Row("Autoscaler", (
            Panel("Autoscaler replicas", "What the autoscaler asks for against what the pool has, and the floor "
                  "the pool's demand hints (or requests held at zero) hold it at.", "short",
                  (Target(f"max by (pool) (genrm_autoscaler_desired_replicas{{{POOL}}})", "{{pool}} desired"),
                   Target(f"max by (pool) (genrm_autoscaler_current_replicas{{{POOL}}})", "{{pool}} current"),
                   Target(f"max by (pool) (genrm_autoscaler_demand_floor_replicas{{{POOL}}})",
                          "{{pool}} demand floor"))),
            Panel("Metric vs target", "Each autoscaling signal's observed value against its target.", "short",
                  (Target(f"max by (pool, metric) (genrm_autoscaler_metric_value{{{POOL}}})",
                          "{{pool}} {{metric}} value"),
                   Target(f"max by (pool, metric) (genrm_autoscaler_metric_target{{{POOL}}})",
                          "{{pool}} {{metric}} target"))),
            Panel("Decisions", "Autoscaler decisions per interval, by outcome.", "short",
                  (Target(f"sum by (pool, outcome) (increase(genrm_autoscaler_decisions_total{{{POOL}}}[{RATE}]))",
                          "{{pool}} {{outcome}}"),), width=WIDTH, stack=True),
        )),
        Row("Operator", (
            Panel("Reconcile rate", "Reconcile steps per second, by result.", "ops",
                  (Target(f"sum by (result) (rate(genrm_operator_reconcile_total{{{POOL}}}[{RATE}]))",
                          "{{result}}"),
                   Target(f"sum(rate(genrm_operator_reconcile_errors_total{{{POOL}}}[{RATE}]))", "errors"))),
            Panel("Reconcile duration", "Median and 99th percentile duration of one reconcile step.", "s",
                  _quantiles("genrm_operator_reconcile_duration_seconds", POOL, "pool", "{{pool}}")),
            Panel("Active pools", "Pools with a running reconciler, per operator pod.", "short",
                  (Target("sum by (pod) (genrm_operator_active_pools)", "{{pod}}"),)),
            Panel("Connection sheds", "Client connections the operator asked replicas to hand back per second, "
                  "by reason (balance: above the fair share of connections; load: above 1.5x the mean request "
                  "rate); see the Gateway dashboard's Load spread row for what the replicas did.", "ops",
                  (Target(f"sum by (pool, reason) (rate(genrm_pool_connections_shed_total{{{POOL}}}[{RATE}]))",
                          "{{pool}} {{reason}}"),), stack=True),
            Panel("Sidecar requests", "Requests the operator makes to replica sidecars (state long polls, drains, "
                  "verification probes), per second, by call and answer code; operator-wide.", "reqps",
                  (Target(f"sum by (call, code) (rate(genrm_operator_sidecar_requests_total[{RATE}]))",
                          "{{call}} {{code}}"),)),
        )),
    ),
)

GATEWAY = Dashboard(
    uid="genrm-gateway",
    title="GenRM / Gateway",
    description="The genrm-gateway sidecar of every judge pod: traffic, errors, latency, admission and drains.",
    variable_metric=Series.INFLIGHT,
    per_pod=True,
    rows=(
        Row("Traffic", (
            Panel("Request rate", "Requests answered per second, by route.", "reqps",
                  (Target(f"sum by (route) (rate({Series.REQUESTS}_total{{{POD}}}[{RATE}]))", "{{route}}"),)),
            Panel("Error ratio", "Share of answers with a 5xx status.", "percentunit",
                  (Target(f'sum by (pool) (rate({Series.REQUESTS}_total{{{POD}, code=~"5.."}}[{RATE}])) / '
                          f"sum by (pool) (rate({Series.REQUESTS}_total{{{POD}}}[{RATE}]))", "{{pool}}"),),
                  max=1),
            Panel("Latency per pod", "Median and 99th percentile time from admission to the last response byte.",
                  "s", _quantiles(Series.REQUEST_DURATION, POD, "pod", "{{pod}}"), width=WIDTH),
        )),
        Row("Load spread", (
            Panel("Request share per pod", "Each pod's share of its pool's requests: kube-proxy places connections, "
                  "not requests, so an even share shows that client connections follow the pool (the operator's "
                  "balancer and the maximum connection age hand connections back).", "percentunit",
                  (Target(f"sum by (pod) (rate({Series.REQUESTS}_total{{{POD}}}[{RATE}])) / ignoring(pod) "
                          f"group_left sum(rate({Series.REQUESTS}_total{{{POD}}}[{RATE}]))", "{{pod}}"),),
                  max=1),
            Panel("Client connections per pod", "Open client connections on the traffic port, per pod.", "short",
                  (Target(f"sum by (pod) ({Series.OPEN_CONNECTIONS}{{{POD}}})", "{{pod}}"),)),
            Panel("Connections handed back", "Client connections closed gently per second for the client to "
                  "reconnect elsewhere, by reason (balance, load: asked by the operator; maxAge: the backstop).",
                  "ops", (Target(f"sum by (reason) (rate({Series.HANDED_BACK}_total{{{POD}}}[{RATE}]))",
                                 "{{reason}}"),), stack=True),
        )),
        Row("Admission and drain", (
            Panel("In-flight requests", "Requests admitted and not yet answered, per pod.", "short",
                  (Target(f"sum by (pod) ({Series.INFLIGHT}{{{POD}}})", "{{pod}}"),)),
            Panel("Refusals", "Requests the gateway refused per second, by reason (draining, fenced, engine "
                  "down, too large, ...).", "reqps",
                  (Target(f"sum by (reason) (rate({Series.REFUSED}_total{{{POD}}}[{RATE}]))", "{{reason}}"),),
                  stack=True),
            Panel("Pods by drain state", "Number of pods in each drain state (Serving, SoftDrain, Fenced, Drained).",
                  "short", (Target(f"sum by (state) ({Series.DRAIN_STATE}{{{POD}}})", "{{state}}"),),
                  stack=True),
            Panel("Engine reachable", "1 while the gateway's engine answers HTTP, per pod.", "short",
                  (Target(f"min by (pod) ({Series.ENGINE_UP}{{{POD}}})", "{{pod}}"),), max=1),
        )),
    ),
)

ENGINE = Dashboard(
    uid="genrm-engine",
    title="GenRM / Engine",
    description="SGLang engine load as re-exported by each judge pod's gateway (the engine itself listens "
                "on loopback only).",
    variable_metric=Series.INFLIGHT,
    per_pod=True,
    rows=(
        Row("Load", (
            Panel("Running requests", "Requests in the engine's running batch, per pod.", "short",
                  (Target(f"sum by (pod) ({Series.ENGINE_RUNNING}{{{POD}}})", "{{pod}}"),)),
            Panel("Queued requests", "Requests waiting for a batch slot, per pod: a sustained queue means "
                  "the pool needs more replicas.", "short",
                  (Target(f"sum by (pod) ({Series.ENGINE_QUEUED}{{{POD}}})", "{{pod}}"),)),
            Panel("KV-cache usage", "Share of the KV-cache token pool in use, per pod.", "percentunit",
                  (Target(f"max by (pod) ({Series.ENGINE_KV_CACHE}{{{POD}}})", "{{pod}}"),), max=1),
            Panel("Pool load", "Running and queued requests summed over the pool.", "short",
                  (Target(f"sum by (pool) ({Series.ENGINE_RUNNING}{{{POD}}})", "{{pool}} running"),
                   Target(f"sum by (pool) ({Series.ENGINE_QUEUED}{{{POD}}})", "{{pool}} queued"))),
        )),
    ),
)

DASHBOARDS = (POOL_OVERVIEW, GATEWAY, ENGINE)


def generated() -> dict[str, str]:
    """File name → JSON text of every dashboard, exactly as committed."""
    return {f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generated().items():
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"stale: {path} (run python hack/dashboards.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

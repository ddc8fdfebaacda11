"""Lint the shipped Grafana dashboards the way grafana/dashboard-linter would, plus metric names.

Why: a dashboard that queries a renamed metric, hard-codes a datasource uid or ships invalid JSON
fails silently in the user's Grafana; these checks catch that in CI (operator-craft.md §5.3).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import genrm_operator.shell.handlers  # noqa: F401  (registers every operator metric on import)
import prometheus_client
import promql_parser
import pytest
from genrm_gateway.app import Gateway
from genrm_gateway.config import GatewayConfig
from prometheus_client.registry import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "charts" / "genrm-operator" / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))

# Grafana's interval variables, replaced by a duration so the expression parses as Prometheus sees it.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)")
COUNTER_FUNCTIONS = ("rate", "increase", "irate")
OPERATOR_WIDE = {"genrm_operator_active_pools", "genrm_operator_sidecar_requests_total"}
"""Series of the operator as a whole, not of one pool."""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def load_generator() -> Any:
    """hack/dashboards.py, loaded by path: hack/ is a script directory, not a package."""
    spec = importlib.util.spec_from_file_location("genrm_hack_dashboards", REPO / "hack" / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """The sample names a scrape of this registry can show, including for families without samples yet."""
    names = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def exported_metrics() -> set[str]:
    """Everything the operator and the gateway sidecar export (the engine's load is re-exported by the gateway)."""
    gateway = Gateway(GatewayConfig())
    return exposed_names(prometheus_client.REGISTRY) | exposed_names(gateway.metrics.registry)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield target["expr"]


def selectors(node: Any) -> Iterator[Any]:
    """Every VectorSelector in a promql_parser AST."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from selectors(item)
    else:
        for attribute in ("lhs", "rhs", "expr", "args", "param", "vector_selector"):
            child = getattr(node, attribute, None)
            if child is not None:
                yield from selectors(child)


def parse(expr: str) -> Any:
    return promql_parser.parse(GRAFANA_INTERVALS.sub("5m", expr))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_committed_json_is_the_generated_json() -> None:
    generated = load_generator().generated()
    assert sorted(generated) == [p.name for p in DASHBOARDS], "run python hack/dashboards.py"
    for path in DASHBOARDS:
        assert path.read_text() == generated[path.name], f"{path.name} is stale: run python hack/dashboards.py"


def test_the_three_dashboards_exist() -> None:
    assert {load(p)["uid"] for p in DASHBOARDS} == {"genrm-pool-overview", "genrm-gateway", "genrm-engine"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
class TestDashboard:
    def test_provisioning_shape(self, path: Path) -> None:
        dashboard = load(path)
        assert dashboard["id"] is None and dashboard["uid"] == path.stem
        assert dashboard["editable"] is False and dashboard["schemaVersion"] and dashboard["tags"]
        assert dashboard["refresh"] not in ("1s", "5s")
        ids = [p["id"] for p in panels(dashboard)]
        assert len(ids) == len(set(ids))

    def test_datasource_is_a_prometheus_variable_used_everywhere(self, path: Path) -> None:
        dashboard = load(path)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        expected = {"type": "prometheus", "uid": "${datasource}"}
        for panel in panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == expected, panel["title"]
            assert all(t["datasource"] == expected for t in panel["targets"]), panel["title"]
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"] == expected
        # No concrete uid anywhere: the only uids are the dashboard's own and the variable reference.
        uids = re.findall(r'"uid": "([^"]*)"', path.read_text())
        assert set(uids) <= {dashboard["uid"], "${datasource}"}

    def test_panels_have_units_descriptions_and_targets(self, path: Path) -> None:
        for panel in panels(load(path)):
            if panel["type"] == "row":
                continue
            assert panel["description"], panel["title"]
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
            assert panel["targets"], panel["title"]

    def test_every_expression_parses_and_uses_rate_interval(self, path: Path) -> None:
        for expr in expressions(load(path)):
            parse(expr)
            for function in COUNTER_FUNCTIONS:
                for window in re.findall(rf"\b{function}\([^\[]*\[([^\]]+)\]", expr):
                    assert window == "$__rate_interval", expr

    def test_every_query_filters_by_the_template_variables(self, path: Path) -> None:
        dashboard = load(path)
        names = {v["name"] for v in dashboard["templating"]["list"]} - {"datasource"}
        for expr in expressions(dashboard):
            for selector in selectors(parse(expr)):
                if selector.name in OPERATOR_WIDE:
                    continue  # no namespace or pool label
                labels = {m.name for m in selector.matchers.matchers}
                assert names <= labels, f"{selector.name} in {expr!r} misses {names - labels}"

    def test_every_metric_is_exported_by_the_code(self, path: Path) -> None:
        exported = exported_metrics()
        for expr in expressions(load(path)):
            for selector in selectors(parse(expr)):
                assert selector.name in exported, f"{selector.name} (in {expr!r}) is not exported"

    def test_counters_are_rated_before_aggregation(self, path: Path) -> None:
        for expr in expressions(load(path)):
            for name in re.findall(r"\b(\w+(?:_total|_bucket))\{", expr):
                assert re.search(rf"\b({'|'.join(COUNTER_FUNCTIONS)})\({name}\{{", expr), expr

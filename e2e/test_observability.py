"""A real Prometheus scraping a live pool: every dashboard metric exists and every panel has data.

Aspects: the operator's and a judge pod's live scrapes pass ``promtool check metrics``; after a
pool is driven through the conditions the dashboards chart (scale-out under load, a forced drain
with requests refused by the fenced victim, the autoscaler in Advisory mode), every metric name a
dashboard uses is stored by Prometheus and every panel's query, with Grafana's variables filled
in, returns a sample a graph can draw. Failure counters that nothing incremented (reconcile
errors, verification failures) still answer, with 0: the operator creates them per pool.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboards.test_dashboards import DASHBOARDS, load, panels, parse, selectors

from .harness import TALLY, Cluster, OperatorProcess, pool_manifest, wait_for
from .loadclient import LoadClient
from .prometheus import JUDGE_REVISION_LABEL, Prometheus, promtool_check_metrics, run_prometheus

POOL = "obs"
GATEWAY_PORT = 8000
"""spec.gateway.port's default, which the test pool keeps."""
CONTROL_PORT = 8001
"""spec.gateway.controlPort's default: probes, drain API and /metrics."""
RATE_WINDOW = "2m"
"""Stands for Grafana's ``$__rate_interval``: long enough to span the whole driven scenario."""
SCENARIO = {
    "drain": {"propagationSeconds": 1, "quietSeconds": 1, "timeoutSeconds": 8, "onTimeout": "Force"},
    # Advisory: the autoscaler computes and exports its view without writing /scale, so the test's
    # own kubectl scale stays in charge while the autoscaler panels get data.
    "autoscaling": {"mode": "Advisory", "minReplicas": 1, "maxReplicas": 3,
                    "metrics": [{"type": "InFlight", "target": {"averageValue": "100"}}]},
}


def grafana_substitute(expr: str, namespace: str) -> str:
    """The query as Grafana sends it for this pool: every template and interval variable filled in."""
    values = {"namespace": namespace, "pool": POOL, "pod": ".*",
              "__rate_interval": RATE_WINDOW, "__interval": "1s", "__range": RATE_WINDOW}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def dashboard_targets() -> Iterator[tuple[str, str, str]]:
    """(dashboard title, panel title, expression) of every query in the shipped dashboards."""
    for path in DASHBOARDS:
        dashboard = load(path)
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                yield dashboard["title"], panel["title"], target["expr"]


def gauge(exposition: str, name: str, **labels: str) -> float | None:
    """One sample of a scrape body, None when absent."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def scrape(ip: str) -> str:
    return httpx.get(f"http://{ip}:{CONTROL_PORT}/metrics", timeout=5).text


def hold_request(ip: str) -> socket.socket:
    """A /generate request whose body never finishes: the gateway counts it in flight until the
    socket closes, so a replica holding one cannot drain and its drain times out (forced)."""
    sock = socket.create_connection((ip, GATEWAY_PORT), timeout=5)
    sock.sendall(b"POST /generate HTTP/1.1\r\nhost: judge\r\ncontent-type: application/json\r\n"
                 b"content-length: 64\r\n\r\n{")
    return sock


def live_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace, POOL) if not p["metadata"].get("deletionTimestamp")]


def follow_pods(cluster: Cluster, prometheus: Prometheus, namespace: str) -> None:
    """Point the gateway job at the pool's current pods and wait until each was scraped, its series
    labelled with the pod's judge revision."""
    pods = live_pods(cluster, namespace)
    prometheus.scrape_gateways(pods)
    revisions = "|".join({p["metadata"]["labels"][JUDGE_REVISION_LABEL] for p in pods})
    wait_for(f"{len(pods)} gateway targets up",
             lambda: len(prometheus.query(f'up{{job="genrm-gateways", pool="{POOL}", revision=~"{revisions}"}} == 1'))
             == len(pods), timeout=30)


def last_outcome(cluster: Cluster, namespace: str) -> dict[str, Any]:
    history = (cluster.pool(namespace, POOL).get("status") or {}).get("history") or []
    return history[-1] if history else {}


def force_a_drain(cluster: Cluster, namespace: str) -> None:
    """Scale 2 -> 1 while both replicas hold an unfinished request: the victim is fenced, refuses
    requests with 503 (the error-ratio and refusal panels), and is deleted when its drain times out."""
    with ExitStack() as holds:
        for pod in live_pods(cluster, namespace):
            holds.callback(hold_request(pod["status"]["podIP"]).close)
        cluster.scale(namespace, POOL, 1)

        def victim() -> str | None:
            operation = (cluster.pool(namespace, POOL).get("status") or {}).get("operation") or {}
            victims = operation.get("victims") or []
            return victims[0]["name"] if operation.get("type") == "ScaleIn" and victims else None
        name = wait_for("a scale-in victim", victim, timeout=30, interval=0.2)
        ip = next(p["status"]["podIP"] for p in cluster.pods(namespace, POOL) if p["metadata"]["name"] == name)
        wait_for(f"{name} fenced", lambda: gauge(scrape(ip), "genrm_gateway_drain_state", state="Fenced") == 1,
                 timeout=30, interval=0.2)
        for _ in range(3):  # spread over scrapes, so the refusal counters have a rate
            refused = httpx.post(f"http://{ip}:{GATEWAY_PORT}/generate", json={"text": "too late"}, timeout=5)
            assert refused.status_code == 503, refused.text
            time.sleep(1.2)
        cluster.wait_serving(namespace, POOL, 1, timeout=60)
    entry = last_outcome(cluster, namespace)
    assert entry["type"] == "ScaleIn" and entry["forcedDrains"] == 1, entry


@pytest.mark.timeout(600)
def test_prometheus_sees_every_dashboard_metric_and_every_panel_has_data(
    cluster: Cluster, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    problems: list[str] = []
    with run_prometheus(tmp_path, operator.metrics_port) as prometheus:
        manifest = pool_manifest(POOL, namespace, replicas=1, **SCENARIO)
        cluster.kubectl("apply", "-f", "-", input=manifest)
        cluster.wait_serving(namespace, POOL, 1)
        follow_pods(cluster, prometheus, namespace)
        with LoadClient(cluster.api, namespace, POOL, workers=2) as load:
            wait_for("first requests", lambda: load.stats.ok > 20)
            cluster.scale(namespace, POOL, 2)
            cluster.wait_serving(namespace, POOL, 2)
            follow_pods(cluster, prometheus, namespace)
            wait_for("traffic on both replicas", lambda: len(load.stats.by_endpoint) >= 2, timeout=30)
            force_a_drain(cluster, namespace)
            follow_pods(cluster, prometheus, namespace)
        TALLY.requests += load.stats.sent
        TALLY.failed += load.stats.failed
        assert load.stats.failed == 0, load.stats.failures[:10]

        serving_ip = live_pods(cluster, namespace)[0]["status"]["podIP"]
        for source, body in (("operator", httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics").text),
                             ("gateway", scrape(serving_ip))):
            lint = promtool_check_metrics(body)
            if lint.returncode != 0 or lint.findings:
                problems.append(f"promtool check metrics on the live {source} scrape: {lint}")

        time.sleep(3)  # a few more scrapes after the last events

        stored = prometheus.metric_names()
        for dashboard, panel, expr in dashboard_targets():
            for selector in selectors(parse(expr)):
                if selector.name not in stored:
                    problems.append(f"{dashboard} / {panel}: {selector.name} is in no live scrape")
            query = grafana_substitute(expr, namespace)
            if not prometheus.has_data(query):
                problems.append(f"{dashboard} / {panel}: no data for {query}")
    assert not problems, "\n".join(problems)

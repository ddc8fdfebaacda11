"""``promtool check metrics`` on live scrapes of the operator, the gateway and the simulator.

Why: a malformed or unconventional exposition (a counter without ``_total``, a missing HELP, a
non-base unit) breaks recording rules and dashboards in the user's Prometheus without any error
here. Each component runs as it does in production (real processes, real HTTP scrapes on
loopback) after some traffic, so histograms and labelled counters have samples to lint.

The simulator mirrors SGLang's own series names (``sglang:…``), a compatibility requirement:
promtool flags the colon, which Prometheus reserves for recording rules. That is the only finding
allowed for it; with the prefix mapped to ``sglang_`` its exposition must be clean.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import genrm_operator.shell.handlers  # noqa: F401  (registers every operator metric on import)
import httpx
import prometheus_client
import pytest
from genrm_operator.shell import metrics
from genrm_testing import RunningSim, free_port, launched, run_sim, wait_ready
from prometheus_client.metrics import MetricWrapperBase

from e2e.prometheus import Lint, promtool_check_metrics

NAMESPACE, POOL = "promtool", "lint"
SGLANG_COLON = re.compile(r"^sglang:\w+ metric names should not contain ':'$")
PROMTOOL_LINT_FAILED = 3
"""promtool's exit code when the exposition parses but has lint findings (1: it does not parse)."""


@dataclass(frozen=True)
class Stack:
    """A simulator and the gateway in front of it, as in a judge pod."""

    sim: RunningSim
    gateway_control_url: str


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Both processes, after answered requests and refusals of each kind the gateway counts."""
    with run_sim(ready_path=None) as sim:
        port, control_port = free_port(), free_port()
        with launched([sys.executable, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1",
                       "--port", str(port), "--control-port", str(control_port), "--engine-url", sim.url]):
            url = f"http://127.0.0.1:{port}"
            wait_ready(f"http://127.0.0.1:{control_port}/healthz/ready")
            with httpx.Client(base_url=url, timeout=10) as http:
                for i in range(3):
                    assert http.post("/generate", json={"text": f"judge {i}"}).status_code == 200
                assert http.post("/v1/completions", json={"model": "judge-sim", "prompt": "x"}).status_code == 200
                assert http.get("/generate").status_code == 405
                assert http.post("/generate", content=b"{not json").status_code == 400
            yield Stack(sim, f"http://127.0.0.1:{control_port}")


@pytest.fixture
def operator_url() -> Iterator[str]:
    """The operator's registry served over HTTP as ``genrm-operator`` serves it, one sample per family.

    Every per-pool family gets a child (placeholder label values past namespace and pool), so the
    lint sees samples of each type, not only HELP and TYPE lines.
    """
    metrics.start_pool(NAMESPACE, POOL)
    family: MetricWrapperBase
    for family in metrics.PER_POOL:
        extra = ("x",) * (len(family._labelnames) - 2)  # prometheus_client keeps label names here
        child = family.labels(NAMESPACE, POOL, *extra)
        if isinstance(child, prometheus_client.Histogram):
            child.observe(0.5)
        elif isinstance(child, prometheus_client.Counter):
            child.inc()
        elif isinstance(child, prometheus_client.Gauge):
            child.set(1)
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        thread.join(10)
        metrics.forget_pool(NAMESPACE, POOL)


def scrape(url: str) -> str:
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def test_the_operator_scrape_is_clean(operator_url: str) -> None:
    body = scrape(operator_url)
    assert f'genrm_pool_replicas{{namespace="{NAMESPACE}",pool="{POOL}",state="x"}}' in body
    assert promtool_check_metrics(body) == Lint(0, ())


def test_the_gateway_scrape_is_clean(stack: Stack) -> None:
    body = scrape(stack.gateway_control_url)
    assert 'genrm_gateway_refused_total{reason="methodNotAllowed"}' in body
    assert "genrm_gateway_request_duration_seconds_bucket" in body and "genrm_engine_running_requests" in body
    assert promtool_check_metrics(body) == Lint(0, ())


def test_the_simulator_scrape_has_only_sglangs_colon_names_to_report(stack: Stack) -> None:
    body = scrape(stack.sim.url)
    assert "sglang:e2e_request_latency_seconds_bucket" in body
    lint = promtool_check_metrics(body)
    assert lint.returncode == PROMTOOL_LINT_FAILED and lint.findings
    assert [f for f in lint.findings if not SGLANG_COLON.match(f)] == []
    assert promtool_check_metrics(body.replace("sglang:", "sglang_")) == Lint(0, ())

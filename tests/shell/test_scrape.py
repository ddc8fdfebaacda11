"""Tests of ``genrm_operator.shell.scrape``: the autoscaler's metric sources.

Aspects under test: exposition parsing (every label set of a gauge kept, latency buckets summed
over routes, absent engine series stay absent, series no metric reads dropped); Direct scraping
of a live gateway in front of a live simulator (in-flight requests while requests run, queue,
KV cache, latency after the second scrape, the answers per second between two scrapes, staleness
of a dead target); and the Prometheus
source against a real Prometheus scraping that gateway (per-pod values by ``pod`` label,
pool-level and one-number queries, ambiguous or failed queries are missing).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from genrm_contract.sidecar import Series
from genrm_operator.api.autoscaling import MetricSpec
from genrm_operator.shell.scrape import DirectSource, PrometheusSource, parse, replica_values
from genrm_testing import free_port, launched, run_sim, wait_ready

PROMETHEUS = "/usr/bin/prometheus"


def metric(type_: str, **extra: object) -> MetricSpec:
    target = {"type": "Value", "value": "1"} if type_ == "Prometheus" else {"averageValue": "1"}
    return MetricSpec.model_validate({"type": type_, "target": target, **extra})


PER_REPLICA = (metric("InFlight"), metric("Queue"), metric("KVCache"), metric("Latency", quantile="0.5"))

EXPOSITION = """\
# TYPE genrm_gateway_inflight_requests gauge
genrm_gateway_inflight_requests{shard="a"} 1.0
genrm_gateway_inflight_requests{shard="b"} 2.0
# TYPE genrm_engine_running_requests gauge
genrm_engine_running_requests 2.0
# TYPE genrm_engine_queued_requests gauge
genrm_engine_queued_requests 5.0
# TYPE genrm_gateway_open_connections gauge
genrm_gateway_open_connections 9.0
# TYPE genrm_gateway_request_duration_seconds histogram
genrm_gateway_request_duration_seconds_bucket{le="0.5",route="generate"} 1.0
genrm_gateway_request_duration_seconds_bucket{le="1.0",route="generate"} 3.0
genrm_gateway_request_duration_seconds_bucket{le="+Inf",route="generate"} 4.0
genrm_gateway_request_duration_seconds_count{route="generate"} 4.0
genrm_gateway_request_duration_seconds_sum{route="generate"} 3.0
genrm_gateway_request_duration_seconds_bucket{le="0.5",route="chat"} 1.0
genrm_gateway_request_duration_seconds_bucket{le="1.0",route="chat"} 1.0
genrm_gateway_request_duration_seconds_bucket{le="+Inf",route="chat"} 1.0
genrm_gateway_request_duration_seconds_count{route="chat"} 1.0
genrm_gateway_request_duration_seconds_sum{route="chat"} 0.1
"""


def test_parse_reads_the_autoscaler_series_and_sums_routes() -> None:
    scrape = parse(EXPOSITION)
    assert scrape.gauges == {"genrm_gateway_inflight_requests": (1.0, 2.0), "genrm_engine_running_requests": (2.0,),
                             "genrm_engine_queued_requests": (5.0,)}
    assert scrape.histograms == {Series.REQUEST_DURATION: ((0.5, 2.0), (1.0, 4.0), (math.inf, 5.0))}


def test_absent_engine_series_are_missing_not_zero() -> None:
    values = replica_values(PER_REPLICA, parse(EXPOSITION), previous=None)
    assert values == {"InFlight": 3.0, "Queue": 7.0}  # no KV series; latency needs a previous scrape


@dataclass(frozen=True)
class Gateway:
    url: str
    """Judge traffic."""
    control: str
    """Probes and /metrics."""


@contextmanager
def gateway() -> Iterator[Gateway]:
    """A gateway in front of a simulator slow enough (80 ms per token, answers of 15-40 tokens) that
    requests stay in flight for a second or more."""
    with run_sim("--sim-itl-ms", "80", ready_path=None) as sim:
        port, control_port = free_port(), free_port()
        command = [sys.executable, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--control-port", str(control_port), "--engine-url", sim.url, "--engine-poll-seconds", "0.1"]
        with launched(command, env=os.environ | {"GENRM_CONTROL_TOKEN": "t"}):
            live = Gateway(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}")
            wait_ready(f"{live.control}/healthz/ready")
            yield live


@pytest.fixture(scope="module")
def live() -> Iterator[Gateway]:
    with gateway() as gw:
        yield gw


def generate(url: str, tokens: int) -> None:
    httpx.post(f"{url}/generate", json={"text": "judge", "sampling_params": {"max_new_tokens": tokens}},
               timeout=30).raise_for_status()


@contextmanager
def in_flight(url: str, requests: int, tokens: int = 100) -> Iterator[None]:
    """``requests`` concurrent requests running while inside (the answer ends well before ``tokens``)."""
    threads = [threading.Thread(target=generate, args=(url, tokens)) for _ in range(requests)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        for t in threads:
            t.join()


async def test_direct_source_scrapes_a_live_gateway(live: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        source = DirectSource(http)
        targets = {"judge-0": f"{live.control}/metrics"}
        first = await source.sample(PER_REPLICA, targets, now=0.0, interval=2.0)
        assert first["judge-0"]["InFlight"] == 0.0
        assert "Latency" not in first["judge-0"]            # one scrape says nothing about recent latency
        with in_flight(live.url, 3):
            busy = await source.sample(PER_REPLICA, targets, now=2.0, interval=2.0)
        assert busy["judge-0"]["InFlight"] == 3.0
        assert busy["judge-0"]["Queue"] >= 1.0
        assert 0.0 <= busy["judge-0"]["KVCache"] <= 1.0
        after = await source.sample(PER_REPLICA, targets, now=4.0, interval=2.0)
        assert 1.0 < after["judge-0"]["Latency"] < 5.0      # 15-40 tokens x 80 ms
        assert source.throughputs() == {"judge-0": 1.5}     # the 3 answers over the 2 s between scrapes


async def test_direct_source_keeps_a_sample_until_it_is_stale(live: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        source = DirectSource(http)
        metrics = [metric("InFlight")]
        assert await source.sample(metrics, {"judge-0": f"{live.control}/metrics"}, now=0.0, interval=1.0)
        dead = {"judge-0": f"http://127.0.0.1:{free_port()}/metrics"}
        assert await source.sample(metrics, dead, now=2.0, interval=1.0) == {"judge-0": {"InFlight": 0.0}}
        assert await source.sample(metrics, dead, now=3.5, interval=1.0) == {}  # older than 3 intervals


@contextmanager
def prometheus(directory: Path, target: str) -> Iterator[str]:
    """Debian's Prometheus scraping ``target`` every second, labelled like a pod of pool ``judge``."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "gateways", "static_configs": [
            {"targets": [target], "labels": {"namespace": "ml", "pod": "judge-0"}}]}],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with launched([PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}",
                   f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                   "--log.level=warn"]):
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/-/ready", seconds=60)
        yield url


async def test_prometheus_source_against_a_real_prometheus(tmp_path: Path) -> None:
    assert shutil.which(PROMETHEUS), "needs Debian's prometheus package: run `make tools`"
    requests = 'sum(genrm_gateway_requests_total{route="/generate",code="200"})'
    with gateway() as gw, prometheus(tmp_path, gw.control.removeprefix("http://")) as url:
        for _ in range(5):
            generate(gw.url, 1)
        async with httpx.AsyncClient() as http:
            source = PrometheusSource(http, url, "ml")
            for _ in range(60):                              # the first scrape comes a few seconds in
                if await source.value(requests) == 5.0:
                    break
                await asyncio.sleep(0.5)
            assert await source.value(requests) == 5.0
            values = await source.sample(PER_REPLICA[:3], dict.fromkeys(["judge-0", "judge-1"], ""), now=0.0,
                                         interval=2.0)
            assert values["judge-0"]["InFlight"] == 0.0
            assert values["judge-0"]["Queue"] == 0.0
            assert set(values["judge-0"]) == {"InFlight", "Queue", "KVCache"}
            assert values["judge-1"] == {}                   # no series: missing for the control law
            pool = metric("Prometheus", query=requests)
            assert await source.pool_values([pool], interval=2.0) == {"Prometheus": 5.0}
            assert await source.value("genrm_gateway_drain_state") is None   # one sample per state: ambiguous
            assert await source.value("sum(rate(") is None                  # a bad query is a failed metric
            assert await PrometheusSource(http, f"http://127.0.0.1:{free_port()}", "ml").value("1") is None

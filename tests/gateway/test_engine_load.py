"""The engine load the gateway reads counts each request once, in SGLang's own exposition.

SGLang's ``/metrics`` is prometheus_client's ``MultiProcessCollector`` over gauges declared with
``multiprocess_mode="mostrecent"`` (``utils/common.py: add_prometheus_middleware``,
``observability/metrics_collector.py``); each scheduler (one per DP rank) sets its gauges under its
``labels`` dict, which holds ``priority=""`` under ``--enable-priority-scheduling`` and ``dp_rank``
with data parallelism, and ``_log_gauge_queue_count`` adds one series per priority. The scrape
here is rendered by that same machinery, so label order, quoting and number format are SGLang's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from genrm_gateway.engine import parse_sglang_metrics
from genrm_testing import run_sim

pytestmark = pytest.mark.timeout(30)

# One scheduler's part of SGLang's exposition: its labels, then per gauge what it sets.
_RENDER = """
import json, sys
from prometheus_client import CollectorRegistry, Gauge, generate_latest, multiprocess

ranks = json.loads(sys.argv[1])
names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")
gauges = {name: Gauge(name, "doc", labelnames=list(ranks[0]["labels"]), multiprocess_mode="mostrecent")
          for name in names}
for rank in ranks:
    labels = rank["labels"]
    for name in names[:2]:  # _log_gauge_queue_count: the total, then each priority's count
        total, by_priority = rank[name]
        gauges[name].labels(**labels).set(total)
        for priority, value in (by_priority or {}).items():
            gauges[name].labels(**(labels | {"priority": priority})).set(value)
    gauges[names[2]].labels(**labels).set(rank[names[2]])  # _log_gauge
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
"""


def sglang_scrape(tmp_path: Path, ranks: list[dict[str, object]]) -> str:
    """What SGLang's ``/metrics`` answers for these schedulers' gauges."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    result = subprocess.run([sys.executable, "-c", _RENDER, json.dumps(ranks)], capture_output=True, text=True,
                            check=True, env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(directory)})
    return result.stdout


def scheduler_labels(priority: bool, dp_rank: int | None) -> dict[str, object]:
    """SGLang's ``SchedulerMetricsCollector`` labels (``init_new``), in its order."""
    labels: dict[str, object] = {"model_name": "judge", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
                                 "moe_ep_rank": 0}
    if priority:
        labels["priority"] = ""
    if dp_rank is not None:
        labels["dp_rank"] = dp_rank
    return labels


def test_priority_scheduling_counts_the_total_not_the_breakdown_again(tmp_path: Path) -> None:
    scrape = sglang_scrape(tmp_path, [{
        "labels": scheduler_labels(priority=True, dp_rank=None),
        "sglang:num_running_reqs": (3, {"0": 2, "5": 1}),
        "sglang:num_queue_reqs": (4, {"0": 0, "5": 1, "None": 3}),
        "sglang:token_usage": 0.25}])
    assert 'priority=""' in scrape and 'priority="5"' in scrape and 'priority="None"' in scrape
    load = parse_sglang_metrics(scrape)
    assert (load.running, load.queued, load.token_usage) == (3, 4, 0.25)


def test_data_parallel_ranks_add_their_counts_and_the_fullest_kv_pool_is_the_replicas(tmp_path: Path) -> None:
    scrape = sglang_scrape(tmp_path, [
        {"labels": scheduler_labels(priority=False, dp_rank=rank), "sglang:num_running_reqs": (running, None),
         "sglang:num_queue_reqs": (queued, None), "sglang:token_usage": usage}
        for rank, (running, queued, usage) in enumerate([(3, 0, 0.2), (1, 2, 0.7), (0, 0, 0.0)])])
    assert 'dp_rank="2"' in scrape
    load = parse_sglang_metrics(scrape)
    assert (load.running, load.queued, load.token_usage) == (4, 2, 0.7)


def test_data_parallel_with_priority_scheduling(tmp_path: Path) -> None:
    scrape = sglang_scrape(tmp_path, [
        {"labels": scheduler_labels(priority=True, dp_rank=rank), "sglang:num_running_reqs": (running, {"1": running}),
         "sglang:num_queue_reqs": (queued, {"1": queued}), "sglang:token_usage": usage}
        for rank, (running, queued, usage) in enumerate([(2, 1, 0.5), (5, 0, 0.4)])])
    load = parse_sglang_metrics(scrape)
    assert (load.running, load.queued, load.token_usage) == (7, 1, 0.5)


def test_the_simulator_exports_the_priority_breakdown_and_the_gateway_reads_the_total() -> None:
    with run_sim("--enable-priority-scheduling", "--default-priority-value", "2", "--sim-ttft-ms", "2000",
                 "--max-running-requests", "1") as sim:
        with httpx.Client(timeout=10) as client:
            threads = [threading.Thread(target=client.post, args=(f"{sim.url}/generate",),
                                        kwargs={"json": {"text": "x", **extra}})
                       for extra in ({}, {"priority": 7}, {"priority": 7})]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                scrape = client.get(f"{sim.url}/metrics").text
                if parse_sglang_metrics(scrape).queued == 2:
                    break
                time.sleep(0.05)
            assert 'priority="7"' in scrape and 'priority="2"' in scrape
            load = parse_sglang_metrics(scrape)
            assert (load.running, load.queued) == (1, 2)
            client.post(f"{sim.url}/abort_request", json={"abort_all": True})
            for thread in threads:
                thread.join()

"""SGLang's Prometheus series (``sglang:`` prefix), so dashboards and the autoscaler see one schema.

Why: the gateway re-exports the engine's load and the autoscaler and dashboards read it; all must
work the same against the simulator and real SGLang, so names, types and label names follow the
pinned SGLang's metrics collectors (checked against ``sglang_contract.json`` by the contract tests):
scheduler series carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``, request series
``model_name, engine_type, is_streaming``. Gauges are computed at scrape time from the scheduler, so
the request path pays nothing for them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from genrm_sim.config import SimConfig

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 400.0)


class LoadView(Protocol):
    """What the gauges read from the scheduler."""

    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def used_tokens(self) -> int: ...
    def by_priority(self, running: bool) -> dict[int | None, int]: ...


class FinishedJob(Protocol):
    prompt_tokens: int
    generated: int
    stream: bool


def _streaming(job: FinishedJob) -> str:
    return "true" if job.stream else "false"


class _LoadCollector(Collector):
    def __init__(self, load: LoadView, config: SimConfig, metrics: SimMetrics) -> None:
        self._load = load
        self._config = config
        self._metrics = metrics
        self._priorities: dict[str, set[int | None]] = {"num_running_reqs": set(), "num_queue_reqs": set()}
        """Every priority seen per count: SGLang keeps exporting one at 0 once it is gone."""

    def collect(self) -> Iterator[Metric]:
        used = self._load.used_tokens
        values = {
            "num_running_reqs": ("Requests in the running batch", self._load.running),
            "num_queue_reqs": ("Requests in the waiting queue", self._load.queued),
            "num_used_tokens": ("KV-cache tokens in use", used),
            "max_total_num_tokens": ("KV-cache token pool size", self._config.max_total_tokens),
            "token_usage": ("KV-cache usage fraction", used / self._config.max_total_tokens),
            "gen_throughput": ("Decode throughput in tokens per second", self._metrics.throughput()),
        }
        labels = self._metrics.scheduler_labels
        for name, (doc, value) in values.items():
            family = GaugeMetricFamily(f"sglang:{name}", doc, labels=list(labels))
            family.add_metric(list(labels.values()), float(value))
            known = self._priorities.get(name)
            if known is not None and "priority" in labels:
                # SGLang's _log_gauge_queue_count: the total under priority="" (above), then one
                # series per priority ever seen ("None" for requests without one).
                counts = self._load.by_priority(running=name == "num_running_reqs")
                known.update(counts)
                for priority in known:
                    family.add_metric([*list(labels.values())[:-1], str(priority)], float(counts.get(priority, 0)))
            yield family


class SimMetrics:
    """The simulator's registry: request counters and latency histograms plus load gauges."""

    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self.registry = CollectorRegistry()
        self.scheduler_labels = {"model_name": config.served_model_name, "engine_type": "unified",
                                 "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        if config.enable_priority_scheduling:
            self.scheduler_labels["priority"] = ""  # last: the per-priority series replace it
        request_labels = ["model_name", "engine_type", "is_streaming"]

        def histogram(name: str, doc: str, labels: list[str]) -> Histogram:
            return Histogram(f"sglang:{name}", doc, labels, registry=self.registry, buckets=_LATENCY_BUCKETS)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sglang:{name}", doc, request_labels, registry=self.registry)

        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token", request_labels)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "End-to-end request latency",
                                             request_labels)
        self.queue_time = histogram("queue_time_seconds", "Time spent in the waiting queue",
                                    list(self.scheduler_labels)).labels(**self.scheduler_labels)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.num_requests = counter("num_requests", "Requests finished")
        for streaming in ("false", "true"):  # series exist (at zero) before the first request
            labels = {"model_name": config.served_model_name, "engine_type": "unified", "is_streaming": streaming}
            for family in (self.time_to_first_token, self.e2e_request_latency, self.prompt_tokens,
                           self.generation_tokens, self.num_requests):
                family.labels(**labels)
        self._generated = 0
        self._rate_mark = (time.monotonic(), 0)
        self._rate = 0.0

    def _request(self, job: FinishedJob) -> dict[str, str]:
        return {"model_name": self._config.served_model_name, "engine_type": "unified",
                "is_streaming": _streaming(job)}

    def watch(self, load: LoadView) -> None:
        """Export the scheduler's live load as gauges."""
        self.registry.register(_LoadCollector(load, self._config, self))

    def first_token(self, job: FinishedJob, seconds: float) -> None:
        self.time_to_first_token.labels(**self._request(job)).observe(seconds)

    def finished(self, job: FinishedJob, seconds: float) -> None:
        labels = self._request(job)
        self.e2e_request_latency.labels(**labels).observe(seconds)
        self.prompt_tokens.labels(**labels).inc(job.prompt_tokens)
        self.generation_tokens.labels(**labels).inc(job.generated)
        self.num_requests.labels(**labels).inc()
        self._generated += job.generated

    def throughput(self) -> float:
        """Tokens per second since the previous estimate at least a second ago."""
        now = time.monotonic()
        mark_time, mark_tokens = self._rate_mark
        if now - mark_time >= 1.0:
            self._rate = (self._generated - mark_tokens) / (now - mark_time)
            self._rate_mark = (now, self._generated)
        return self._rate

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Metric sources of the autoscaler: each replica's sidecar ``/metrics``, or a Prometheus server.

Both implement :class:`MetricSource`, the one interface the autoscaler samples through
(HPA's ``MetricsClient`` in ``metrics/interfaces.go``), and both read what the pure table
:data:`~genrm_operator.autoscaling.signals.SIGNALS` says a metric type means; this
module only moves bytes.

Direct (the default) scrapes every serving replica's gateway sidecar at
``http://<podIP>:<gateway control port>/metrics`` once per decision, like AIBrix and
Knative do, so a decision sees numbers one interval old instead of the
scrape-interval + rule-evaluation + adapter-cache lag of an HPA on a metrics
adapter. The gateway re-exports the engine's load, so one endpoint per pod is
enough. Scrapes run with bounded concurrency and a timeout, and a failed
scrape falls back to the replica's last good sample while it is younger than
:data:`STALE_INTERVALS` intervals; after that the replica has no sample and
the control law applies HPA's missing-pod rules.

Prometheus serves clusters that forbid the operator from reaching pods, and
``Prometheus``-type metrics (one number per pool). Per-replica series are
grouped by the ``pod`` label and selected by ``namespace`` and ``pod``: the
labels a Kubernetes pod scrape config or PodMonitor attaches.

Per-replica values are keyed by ``MetricSpec.key``, the shape
:class:`~genrm_operator.autoscaling.ReplicaSample` wants.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..api.autoscaling import MetricSpec
from ..autoscaling.histogram import Buckets
from ..autoscaling.signals import SERIES, SIGNALS, Scrape, finished_requests

log = logging.getLogger(__name__)
STALE_INTERVALS = 3
"""A sample older than this many intervals is missing, not merely late."""
SCRAPE_CONCURRENCY = 16


class MetricSource(Protocol):
    """Where per-replica metric values come from (HPA's ``MetricsClient.GetRawMetric``)."""

    async def sample(self, metrics: Sequence[MetricSpec], targets: Mapping[str, str], now: float,
                     interval: float) -> dict[str, dict[str, float]]:
        """Values of the per-replica ``metrics`` by replica, then by ``MetricSpec.key``.

        ``targets`` maps each replica to sample (by pod name) to its sidecar's ``/metrics`` URL;
        ``now`` is a monotonic clock and ``interval`` the decision interval, both in seconds. A
        value nobody could read is left out, so the control law sees it as missing.
        """
        ...


def parse(text: str) -> Scrape:
    """The series the autoscaler reads from a sidecar's exposition text (histograms summed over routes)."""
    gauges: dict[str, tuple[float, ...]] = {}
    histograms: dict[str, Buckets] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in SERIES:
            continue
        if family.type == "histogram":
            bounds: dict[float, float] = {}
            for sample in family.samples:
                if sample.name == f"{family.name}_bucket":
                    le = float(sample.labels["le"])
                    bounds[le] = bounds.get(le, 0.0) + sample.value
            histograms[family.name] = tuple(sorted(bounds.items()))
        elif family.samples:
            gauges[family.name] = tuple(sample.value for sample in family.samples)
    return Scrape(gauges, histograms)


def replica_values(metrics: Sequence[MetricSpec], scrape: Scrape, previous: Scrape | None) -> dict[str, float]:
    """One replica's values from a scrape (and the one before, for latency); missing ones left out."""
    values = {m.key: SIGNALS[m.type].value(m, scrape, previous) for m in metrics}
    return {key: value for key, value in values.items() if value is not None}


@dataclass
class _Memory:
    """What is kept per replica between decisions."""

    last: Scrape | None = None
    last_at: float = -math.inf
    values: dict[str, float] = field(default_factory=dict)
    values_at: float = -math.inf
    throughput: float | None = None
    """Requests per second answered between the last two scrapes (None without two, or after a restart)."""


def _rate(before: Scrape | None, before_at: float, after: Scrape, now: float) -> float | None:
    """Answers per second between two scrapes of one replica; None for a first scrape or a counter reset."""
    if before is None or now <= before_at:
        return None
    start, end = finished_requests(before), finished_requests(after)
    if end < start:
        return None
    return (end - start) / (now - before_at)


class DirectSource:
    """Scrapes sidecars; remembers each replica's previous scrape and last good values."""

    def __init__(self, http: httpx.AsyncClient, concurrency: int = SCRAPE_CONCURRENCY) -> None:
        self._http = http
        self._limit = asyncio.Semaphore(concurrency)
        self._memory: dict[str, _Memory] = {}

    async def sample(self, metrics: Sequence[MetricSpec], targets: Mapping[str, str], now: float,
                     interval: float) -> dict[str, dict[str, float]]:
        """Values by replica for ``targets``, fresh or within staleness (see :class:`MetricSource`).

        Replicas no longer targeted are forgotten, so a recreated pod of the same name never
        has its latency computed against its predecessor's histogram.
        """
        self._memory = {name: self._memory.get(name, _Memory()) for name in targets}
        limit = min(2.0, max(0.5, interval / 2))
        scrapes = await asyncio.gather(*(self._scrape(url, limit) for url in targets.values()))
        out: dict[str, dict[str, float]] = {}
        for name, scrape in zip(targets, scrapes, strict=True):
            memory = self._memory[name]
            if scrape is not None:
                memory.values, memory.values_at = replica_values(metrics, scrape, memory.last), now
                memory.throughput = _rate(memory.last, memory.last_at, scrape, now)
                memory.last, memory.last_at = scrape, now
            if now - memory.values_at <= STALE_INTERVALS * interval:
                out[name] = memory.values
        return out

    def throughputs(self) -> dict[str, float]:
        """Each replica's requests per second between its last two scrapes, where known."""
        return {name: m.throughput for name, m in self._memory.items() if m.throughput is not None}

    async def _scrape(self, url: str, seconds: float) -> Scrape | None:
        async with self._limit:
            try:
                response = await self._http.get(url, timeout=seconds)
                response.raise_for_status()
                return parse(response.text)
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("scrape of %s failed: %s", url, exc)
                return None


class PrometheusSource:
    """Instant queries against a Prometheus server's HTTP API, for the pods of one namespace."""

    def __init__(self, http: httpx.AsyncClient, url: str, namespace: str, timeout: float = 2.0) -> None:
        self._http, self._url, self._namespace, self._timeout = http, url.rstrip("/"), namespace, timeout

    async def query(self, promql: str) -> list[tuple[dict[str, str], float]] | None:
        """The instant vector (or scalar, as one unlabelled sample) of ``promql``; None on any failure."""
        try:
            response = await self._http.get(f"{self._url}/api/v1/query", params={"query": promql},
                                            timeout=self._timeout)
            response.raise_for_status()
            body = response.json()
            data = body["data"]
            if body.get("status") != "success":
                return None
            if data["resultType"] == "scalar":
                return [({}, float(data["result"][1]))]
            if data["resultType"] != "vector":
                return None
            return [(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            log.info("Prometheus query %r failed: %s", promql, exc)
            return None

    async def value(self, promql: str) -> float | None:
        """The single finite number a query must return; None if it returns anything else."""
        result = await self.query(promql)
        if result is None or len(result) != 1 or not math.isfinite(result[0][1]):
            return None
        return result[0][1]

    async def pool_values(self, metrics: Sequence[MetricSpec], interval: float) -> dict[str, float]:
        """The pool-level ``metrics``' values (HPA's ``GetExternalMetric``); failed queries left out."""
        queries = [SIGNALS[m.type].promql(m, "", interval) for m in metrics]
        values = await asyncio.gather(*(self.value(q) for q in queries))
        return {m.key: v for m, v in zip(metrics, values, strict=True) if v is not None}

    async def sample(self, metrics: Sequence[MetricSpec], targets: Mapping[str, str], now: float,
                     interval: float) -> dict[str, dict[str, float]]:
        """Per-replica values of the ``targets``' pods, one query per metric (see :class:`MetricSource`)."""
        out: dict[str, dict[str, float]] = {pod: {} for pod in targets}
        if not targets:
            return out
        # Pod names are DNS-1123 names: "." is their only regex metacharacter, escaped once for the
        # regex and once for the PromQL string (re.escape would also escape "-", which PromQL rejects).
        names = "|".join(p.replace(".", "\\\\.") for p in targets)
        selector = f'namespace="{self._namespace}",pod=~"{names}"'
        queries = [SIGNALS[m.type].promql(m, selector, interval) for m in metrics]
        results = await asyncio.gather(*(self.query(q) for q in queries))
        for metric, result in zip(metrics, results, strict=True):
            for labels, value in result or ():
                if labels.get("pod") in out and math.isfinite(value):
                    out[labels["pod"]][metric.key] = value
        return out

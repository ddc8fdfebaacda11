"""Metric sources of the autoscaler: each replica's sidecar ``/metrics``, or a Prometheus server.

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

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..api.autoscaling import MetricSpec, quantity_value

log = logging.getLogger(__name__)
STALE_INTERVALS = 3
"""A sample older than this many intervals is missing, not merely late."""
SCRAPE_CONCURRENCY = 16
INFLIGHT = "genrm_gateway_inflight_requests"
RUNNING = "genrm_engine_running_requests"
QUEUED = "genrm_engine_queued_requests"
KV_CACHE = "genrm_engine_kv_cache_usage_ratio"
DURATION = "genrm_gateway_request_duration_seconds"
Buckets = tuple[tuple[float, float], ...]
"""A cumulative histogram: (upper bound, count) pairs sorted by bound, ending with +Inf."""


@dataclass(frozen=True)
class Scrape:
    """One replica's ``/metrics`` at one moment: gauges summed over label sets, latency buckets summed over routes."""

    gauges: Mapping[str, float]
    buckets: Buckets


def parse(text: str) -> Scrape:
    """The series the autoscaler reads from a sidecar's exposition text."""
    gauges: dict[str, float] = {}
    bounds: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (INFLIGHT, RUNNING, QUEUED, KV_CACHE):
            for sample in family.samples:
                gauges[family.name] = gauges.get(family.name, 0.0) + sample.value
        elif family.name == DURATION:
            for sample in family.samples:
                if sample.name == f"{DURATION}_bucket":
                    le = float(sample.labels["le"])
                    bounds[le] = bounds.get(le, 0.0) + sample.value
    return Scrape(gauges, tuple(sorted(bounds.items())))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q.

    None when the histogram is empty (no request finished: the latency is unknown, not 0).
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def delta(now: Buckets, before: Buckets) -> Buckets | None:
    """Requests observed between two scrapes; None when the counters went backwards (a restart).

    A bound absent before counts as 0: a route's histogram appears with its first request.
    """
    previous = dict(before)
    out = tuple((bound, count - previous.get(bound, 0.0)) for bound, count in now)
    return None if any(count < 0 for _, count in out) else out


def replica_values(metrics: Sequence[MetricSpec], scrape: Scrape, previous: Scrape | None) -> dict[str, float]:
    """Per-replica metric values from a scrape (and the one before, for latency rates).

    A metric whose series is absent is left out, so it counts as missing. Latency needs two
    scrapes: the histogram is cumulative over the replica's life, and only the requests
    since the previous scrape say anything about now.
    """
    values: dict[str, float] = {}
    g = scrape.gauges
    for metric in metrics:
        value: float | None = None
        if metric.type == "InFlight":
            value = g.get(INFLIGHT)
        elif metric.type == "Queue" and RUNNING in g and QUEUED in g:
            value = g[RUNNING] + g[QUEUED]
        elif metric.type == "KVCache":
            value = g.get(KV_CACHE)
        elif metric.type == "Latency" and metric.quantile and previous is not None:
            window = delta(scrape.buckets, previous.buckets)
            value = histogram_quantile(quantity_value(metric.quantile), window) if window else None
        if value is not None:
            values[metric.key] = value
    return values


@dataclass
class _Memory:
    """What is kept per replica between decisions."""

    last: Scrape | None = None
    values: dict[str, float] = field(default_factory=dict)
    values_at: float = -math.inf


class DirectSource:
    """Scrapes sidecars; remembers each replica's previous scrape and last good values."""

    def __init__(self, http: httpx.AsyncClient, concurrency: int = SCRAPE_CONCURRENCY) -> None:
        self._http = http
        self._limit = asyncio.Semaphore(concurrency)
        self._memory: dict[str, _Memory] = {}

    async def sample(self, metrics: Sequence[MetricSpec], targets: Mapping[str, str], now: float,
                     interval: float) -> dict[str, dict[str, float]]:
        """Values by replica for ``targets`` (replica name -> ``/metrics`` URL), fresh or within staleness.

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
                memory.last = scrape
            if now - memory.values_at <= STALE_INTERVALS * interval:
                out[name] = memory.values
        return out

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
    """Instant queries against a Prometheus server's HTTP API."""

    def __init__(self, http: httpx.AsyncClient, url: str, timeout: float = 2.0) -> None:
        self._http, self._url, self._timeout = http, url.rstrip("/"), timeout

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
        """The single number a ``Prometheus`` metric's query must return; None if it returns anything else."""
        result = await self.query(promql)
        if result is None or len(result) != 1 or math.isnan(result[0][1]):
            return None
        return result[0][1]

    async def sample(self, metrics: Sequence[MetricSpec], namespace: str, pods: Sequence[str],
                     interval: float) -> dict[str, dict[str, float]]:
        """Per-replica values of ``pods`` from Prometheus, one query per metric."""
        out: dict[str, dict[str, float]] = {pod: {} for pod in pods}
        if not pods:
            return out
        # Pod names are DNS-1123 names: "." is their only regex metacharacter, escaped once for the
        # regex and once for the PromQL string (re.escape would also escape "-", which PromQL rejects).
        names = "|".join(p.replace(".", "\\\\.") for p in pods)
        selector = f'namespace="{namespace}",pod=~"{names}"'
        results = await asyncio.gather(*(self.query(per_pod_query(m, selector, interval)) for m in metrics))
        for metric, result in zip(metrics, results, strict=True):
            for labels, value in result or ():
                if labels.get("pod") in out and not math.isnan(value):
                    out[labels["pod"]][metric.key] = value
        return out


def per_pod_query(metric: MetricSpec, selector: str, interval: float) -> str:
    """PromQL giving ``metric`` per pod; latency over a window of several scrapes (rate needs two)."""
    if metric.type == "InFlight":
        return f"sum by (pod) ({INFLIGHT}{{{selector}}})"
    if metric.type == "Queue":
        return f"sum by (pod) ({RUNNING}{{{selector}}}) + sum by (pod) ({QUEUED}{{{selector}}})"
    if metric.type == "KVCache":
        return f"max by (pod) ({KV_CACHE}{{{selector}}})"
    window = max(30, math.ceil(4 * interval))
    return (f"histogram_quantile({quantity_value(metric.quantile or '0.5')}, sum by (pod, le) "
            f"(rate({DURATION}_bucket{{{selector}}}[{window}s])))")

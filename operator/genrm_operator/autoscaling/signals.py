"""What each autoscaler metric type reads: its series, its PromQL and how one replica's series combine.

The one table behind every metric source (the series are the gateway's, named in
:class:`genrm_contract.sidecar.Series`), as HPA puts its sources behind one
``MetricsClient`` (``metrics/interfaces.go``): the direct source reads a sidecar's
``/metrics`` and combines the series with :meth:`Signal.value`; the Prometheus source
sends :meth:`Signal.promql`, which asks Prometheus for the same combination. So a metric
means the same thing whichever source reads it, and a new metric type is one row in
:data:`SIGNALS` (plus its name in the API's ``MetricType``). The control law takes the
metric's role (driver, guard, pool-level) from the same row.

Pure: the shell parses exposition text into a :class:`Scrape` and talks HTTP; the
meaning of the numbers lives here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from genrm_contract.sidecar import Series

from genrm_operator.api.autoscaling import MetricSpec, MetricType, quantity_value

from .histogram import Buckets, delta, histogram_quantile


class Aggregation(StrEnum):
    """How a metric's samples become one number."""

    SUM = "sum"
    """Counts (requests): every series of the replica adds up, and each listed series must be there,
    because a count with a term missing would read as less load than there is."""
    MAX = "max"
    """A usage ratio of one shared resource (one series): the fullest of its label sets."""
    QUANTILE = "quantile"
    """A latency histogram (one series): the metric's quantile over the requests finished since the
    previous look, since the histogram is cumulative over the replica's life."""
    QUERY = "query"
    """The metric's own PromQL, one number for the whole pool (HPA's External metric)."""


@dataclass(frozen=True)
class Scrape:
    """One replica's ``/metrics`` at one moment, reduced to the series :data:`SIGNALS` reads.

    ``gauges`` holds every label set's value of each gauge (a gauge with no sample is absent);
    ``histograms`` each histogram's buckets summed over label sets (routes).
    """

    gauges: Mapping[str, tuple[float, ...]]
    histograms: Mapping[str, Buckets]


@dataclass(frozen=True)
class Signal:
    """One metric type: where its numbers come from and what role it plays in the control law."""

    series: tuple[str, ...]
    aggregation: Aggregation
    guard: bool = False
    """A saturation guard, not a driver (see ``metrics._kv_guard``): it never decides alone."""

    def __post_init__(self) -> None:
        single = self.aggregation in (Aggregation.MAX, Aggregation.QUANTILE)
        if single and len(self.series) != 1:
            raise ValueError(f"{self.aggregation} reads exactly one series")

    @property
    def per_replica(self) -> bool:
        """True when every serving replica reports its own value (HPA's Pods metric)."""
        return self.aggregation is not Aggregation.QUERY

    def value(self, metric: MetricSpec, scrape: Scrape, previous: Scrape | None) -> float | None:
        """The replica's value from its scrape (and the one before, for latency); None when missing.

        Missing means the control law applies HPA's missing-pod rules: an absent series, a
        latency with no previous scrape or no finished request, a counter reset, a non-finite number.
        """
        value: float | None = None
        if self.aggregation is Aggregation.SUM and all(scrape.gauges.get(s) for s in self.series):
            value = sum(sum(scrape.gauges[s]) for s in self.series)
        elif self.aggregation is Aggregation.MAX and scrape.gauges.get(self.series[0]):
            value = max(scrape.gauges[self.series[0]])
        elif self.aggregation is Aggregation.QUANTILE and previous is not None:
            name = self.series[0]
            window = delta(scrape.histograms.get(name, ()), previous.histograms.get(name, ()))
            value = histogram_quantile(_quantile(metric), window) if window else None
        return value if value is not None and math.isfinite(value) else None

    def promql(self, metric: MetricSpec, selector: str, interval: float) -> str:
        """PromQL for ``metric``: per pod (grouped by ``pod``) within ``selector``, or the metric's own query.

        Latency is a rate over several scrape intervals (a rate needs two samples), like the
        direct source's difference between two scrapes.
        """
        if self.aggregation is Aggregation.SUM:
            return " + ".join(f"sum by (pod) ({s}{{{selector}}})" for s in self.series)
        if self.aggregation is Aggregation.MAX:
            return f"max by (pod) ({self.series[0]}{{{selector}}})"
        if self.aggregation is Aggregation.QUANTILE:
            window = max(30, math.ceil(4 * interval))
            return (f"histogram_quantile({_quantile(metric)}, sum by (pod, le) "
                    f"(rate({self.series[0]}_bucket{{{selector}}}[{window}s])))")
        if metric.query is None:
            raise ValueError(f"metric {metric.key} has no query")
        return metric.query


def _quantile(metric: MetricSpec) -> float:
    """The quantile a latency metric asks for (the API requires one on Latency metrics)."""
    if metric.quantile is None:
        raise ValueError(f"metric {metric.key} has no quantile")
    return quantity_value(metric.quantile)


SIGNALS: Mapping[MetricType, Signal] = {
    "InFlight": Signal((Series.INFLIGHT,), Aggregation.SUM),
    "Queue": Signal((Series.ENGINE_RUNNING, Series.ENGINE_QUEUED), Aggregation.SUM),
    "KVCache": Signal((Series.ENGINE_KV_CACHE,), Aggregation.MAX, guard=True),
    "Latency": Signal((Series.REQUEST_DURATION,), Aggregation.QUANTILE),
    "Prometheus": Signal((), Aggregation.QUERY),
}
"""Every metric type of ``spec.autoscaling.metrics``: the autoscaler's whole vocabulary of signals."""

SERIES: frozenset[str] = frozenset(s for signal in SIGNALS.values() for s in signal.series)
"""The series the direct source keeps from an exposition."""


def finished_requests(scrape: Scrape) -> float:
    """Requests the replica has answered since it started: the latency histogram's count (its +Inf
    bucket), which every answer lands in (no sample yet: none answered). The rate of this between
    scrapes is the replica's throughput."""
    buckets = scrape.histograms.get(Series.REQUEST_DURATION)
    return buckets[-1][1] if buckets else 0.0

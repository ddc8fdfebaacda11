"""The gateway's Prometheus series, and the engine's load re-exported under ``genrm_`` names.

Why re-export: the autoscaler then scrapes one endpoint per pod and never reaches the engine
(which listens on loopback only). State-derived gauges are computed at scrape time, so the
request path pays only for one counter and one histogram update.

``genrm_gateway_drain_state`` is one-hot: one sample per state (``state`` label), 1 for the
current state and 0 for the others. Engine load series are omitted while the load is unknown,
because a missing series must never read as an idle engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from genrm_contract.peers import ForwardOutcome
from genrm_contract.sidecar import DrainState, HandBack, RefusalReason, Series
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from genrm_gateway.admission import Admission
from genrm_gateway.drain import DrainController
from genrm_gateway.engine import EngineMonitor

if TYPE_CHECKING:
    from genrm_gateway.connection import Connections

_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                     30.0, 60.0, 120.0, 300.0, 600.0)


class _StateCollector(Collector):
    def __init__(self, admission: Admission, drain: DrainController, engine: EngineMonitor,
                 connections: Connections) -> None:
        self._admission = admission
        self._drain = drain
        self._engine = engine
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(Series.INFLIGHT,
                                "Requests admitted and not yet fully answered",
                                value=self._admission.inflight)
        current = self._drain.state
        drain = GaugeMetricFamily(Series.DRAIN_STATE,
                                  "Drain state, one-hot: 1 for the current state", labels=["state"])
        for state in DrainState:
            drain.add_metric([state.value], 1.0 if state is current else 0.0)
        yield drain
        yield GaugeMetricFamily(Series.ENGINE_UP, "Whether the engine answers HTTP",
                                value=1.0 if self._engine.up else 0.0)
        yield GaugeMetricFamily(Series.OPEN_CONNECTIONS, "Open client connections on the traffic port",
                                value=len(self._connections))
        yield CounterMetricFamily(Series.OPENED_CONNECTIONS, "Client connections accepted on the traffic port",
                                  value=self._connections.opened_total)
        load = self._engine.load
        for name, doc, value in (
            (Series.ENGINE_RUNNING, "Requests in the engine's running batch", load.running),
            (Series.ENGINE_QUEUED, "Requests in the engine's waiting queue", load.queued),
            (Series.ENGINE_KV_CACHE, "Engine KV-cache token usage (0..1)", load.token_usage),
        ):
            family = GaugeMetricFamily(name, doc)
            if value is not None:
                family.add_metric([], float(value))
            yield family


class GatewayMetrics:
    """Per-request counters and histograms, with label children cached for the hot path."""

    def __init__(self, admission: Admission, drain: DrainController, engine: EngineMonitor,
                 connections: Connections) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(Series.REQUESTS, "Requests answered, by route and status code",
                                 ["route", "code"], registry=self.registry)
        self._duration = Histogram(Series.REQUEST_DURATION,
                                   "Time from admission to the last response byte", ["route"],
                                   registry=self.registry, buckets=_DURATION_BUCKETS)
        self._refused = Counter(Series.REFUSED, "Requests refused by the gateway, by reason",
                                ["reason"], registry=self.registry)
        self._handed_back = Counter(Series.HANDED_BACK,
                                    "Client connections handed back (closed gently for the client to "
                                    "reconnect elsewhere), by reason", ["reason"], registry=self.registry)
        for reason in HandBack:  # zeros from the start: a rate over a series born later misses its first step
            self._handed_back.labels(reason.value)
        self._forwarded = Counter(Series.FORWARDED, "Requests that found the engine down and were offered to "
                                  "peer replicas, by outcome", ["outcome"], registry=self.registry)
        for outcome in ForwardOutcome:
            self._forwarded.labels(outcome.value)
        self.registry.register(_StateCollector(admission, drain, engine, connections))
        self._request_children: dict[tuple[str, int], Counter] = {}
        self._duration_children: dict[str, Histogram] = {}

    def observe(self, route: str, code: int, seconds: float) -> None:
        child = self._request_children.get((route, code))
        if child is None:
            child = self._request_children[(route, code)] = self._requests.labels(route, str(code))
        child.inc()
        histogram = self._duration_children.get(route)
        if histogram is None:
            histogram = self._duration_children[route] = self._duration.labels(route)
        histogram.observe(seconds)

    def refused(self, reason: RefusalReason) -> None:
        self._refused.labels(reason).inc()

    def forwarded(self, outcome: ForwardOutcome) -> None:
        self._forwarded.labels(outcome.value).inc()

    def handed_back(self, reason: HandBack) -> None:
        self._handed_back.labels(reason.value).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

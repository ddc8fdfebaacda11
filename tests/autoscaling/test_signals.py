"""The metric table both sources read (``genrm_operator.autoscaling.signals``) and latency histograms.

Aspects under test: every API metric type has exactly one row, and its role (driver, guard,
pool-level) is what the control law applies; every PromQL the table writes parses, selects only
the gateway's series within the given selector and groups by pod; a replica's value from a
scrape (counts add up and need every series, a ratio takes its fullest series, non-finite or
absent numbers are missing); Prometheus' ``histogram_quantile`` interpolation, and latency from
the bucket deltas between two scrapes (first scrape and counter reset missing).
"""

from __future__ import annotations

import math
import typing

import promql_parser
import pytest
from genrm_contract.sidecar import Series
from genrm_operator.api.autoscaling import MetricSpec, MetricType
from genrm_operator.autoscaling.histogram import delta, histogram_quantile
from genrm_operator.autoscaling.signals import SERIES, SIGNALS, Aggregation, Scrape, Signal


def metric(type_: str, **extra: object) -> MetricSpec:
    target = {"type": "Value", "value": "1"} if type_ == "Prometheus" else {"averageValue": "1"}
    return MetricSpec.model_validate({"type": type_, "target": target, **extra})


METRICS = {
    "InFlight": metric("InFlight"),
    "Queue": metric("Queue"),
    "KVCache": metric("KVCache"),
    "Latency": metric("Latency", quantile="0.99"),
    "Prometheus": metric("Prometheus", query='sum(rate(genrm_gateway_requests_total{namespace="ml"}[1m]))'),
}
SELECTOR = 'namespace="ml",pod=~"judge-0|judge\\\\.1"'


def test_every_metric_type_has_one_row() -> None:
    assert set(SIGNALS) == set(typing.get_args(MetricType)) == set(METRICS)
    assert SERIES <= set(Series)
    assert [t for t, s in SIGNALS.items() if s.guard] == ["KVCache"]
    assert [t for t, s in SIGNALS.items() if not s.per_replica] == ["Prometheus"]


def test_single_series_aggregations_refuse_two_series() -> None:
    with pytest.raises(ValueError, match="exactly one series"):
        Signal((Series.ENGINE_KV_CACHE, Series.INFLIGHT), Aggregation.MAX)


def selectors(node: object) -> list[promql_parser.VectorSelector]:
    """Every vector selector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    children = [getattr(node, name, None) for name in ("expr", "lhs", "rhs", "vector_selector")]
    children += list(getattr(node, "args", None) or ())
    return [found for child in children if child is not None for found in selectors(child)]


@pytest.mark.parametrize("kind", [t for t, s in SIGNALS.items() if s.per_replica])
def test_per_replica_promql_parses_and_selects_only_the_signal_series_per_pod(kind: str) -> None:
    query = SIGNALS[kind].promql(METRICS[kind], SELECTOR, interval=5.0)
    found = selectors(promql_parser.parse(query))
    names = {s.name.removesuffix("_bucket") for s in found}
    assert names == set(SIGNALS[kind].series)
    for selector in found:
        assert {m.name for m in selector.matchers.matchers} >= {"namespace", "pod"}
    assert "by (pod" in query


def test_latency_rate_window_spans_several_intervals() -> None:
    assert "[30s]" in SIGNALS["Latency"].promql(METRICS["Latency"], SELECTOR, interval=5.0)
    assert "[40s]" in SIGNALS["Latency"].promql(METRICS["Latency"], SELECTOR, interval=10.0)


def test_a_pool_metric_is_its_own_query() -> None:
    query = METRICS["Prometheus"].query
    assert SIGNALS["Prometheus"].promql(METRICS["Prometheus"], SELECTOR, interval=5.0) == query


def scrape(**gauges: tuple[float, ...]) -> Scrape:
    return Scrape({getattr(Series, name): values for name, values in gauges.items()}, {})


def test_counts_add_up_and_need_every_series() -> None:
    full = scrape(INFLIGHT=(2.0, 1.0), ENGINE_RUNNING=(2.0,), ENGINE_QUEUED=(5.0,))
    assert SIGNALS["InFlight"].value(METRICS["InFlight"], full, None) == 3.0
    assert SIGNALS["Queue"].value(METRICS["Queue"], full, None) == 7.0
    no_queue = scrape(ENGINE_RUNNING=(2.0,))
    assert SIGNALS["Queue"].value(METRICS["Queue"], no_queue, None) is None   # half a count is no count


def test_a_ratio_takes_its_fullest_series_and_non_finite_is_missing() -> None:
    assert SIGNALS["KVCache"].value(METRICS["KVCache"], scrape(ENGINE_KV_CACHE=(0.2, 0.7)), None) == 0.7
    assert SIGNALS["KVCache"].value(METRICS["KVCache"], scrape(ENGINE_KV_CACHE=(math.nan,)), None) is None
    assert SIGNALS["InFlight"].value(METRICS["InFlight"], scrape(INFLIGHT=(math.inf,)), None) is None
    assert SIGNALS["KVCache"].value(METRICS["KVCache"], scrape(), None) is None


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = ((0.5, 2.0), (1.0, 4.0), (math.inf, 5.0))
    assert histogram_quantile(0.2, buckets) == pytest.approx(0.25)  # rank 1 inside [0, 0.5]
    assert histogram_quantile(0.6, buckets) == pytest.approx(0.75)  # rank 3 halfway through (0.5, 1]
    assert histogram_quantile(0.99, buckets) == 1.0                # +Inf bucket: the last finite bound
    assert histogram_quantile(0.5, ((0.5, 0.0), (math.inf, 0.0))) is None


def test_latency_comes_from_the_requests_between_two_scrapes() -> None:
    before = Scrape({}, {Series.REQUEST_DURATION: ((0.5, 10.0), (1.0, 10.0), (math.inf, 10.0))})
    after = Scrape({}, {Series.REQUEST_DURATION: ((0.5, 10.0), (1.0, 14.0), (math.inf, 14.0))})
    latency = metric("Latency", quantile="0.5")
    assert SIGNALS["Latency"].value(latency, after, before) == pytest.approx(0.75)
    assert SIGNALS["Latency"].value(latency, after, None) is None     # one scrape says nothing about now
    assert SIGNALS["Latency"].value(latency, after, after) is None    # no request finished: unknown, not 0
    assert delta(before.histograms[Series.REQUEST_DURATION], after.histograms[Series.REQUEST_DURATION]) is None

"""The autoscaler's shell: scrape a pool's metrics when a decision is due, write the decided count.

:class:`PoolAutoscaler` lives inside a pool's :class:`~.reconciler.PoolReconciler`
(the pool's single writer). Once per ``intervalSeconds`` it scrapes the published
replicas (:mod:`.scrape`) into :class:`~genrm_operator.core.model.MetricSamples`
before the reconcile step; the step's pure autoscaler stage
(:mod:`genrm_operator.core.autoscale`) decides, and its ``status.autoscaler`` and
conditions go into the step's one optimistic-concurrency status PUT, so the
recommendation history survives an operator restart and a decision is never acted
on unless the state it was made from was still current. Only after that PUT does
:meth:`PoolAutoscaler.actuate` write ``spec.replicas`` through the scale subresource
(as HPA does, so ``kubectl scale``, an HPA or KEDA remain interoperable), and post a
``SuccessfulRescale`` Event; :meth:`PoolAutoscaler.committed` updates the
``genrm_autoscaler_*`` metrics.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence

import httpx
from genrm_contract.sidecar import METRICS_PATH

from ..api.autoscaling import AutoscalingSpec
from ..api.status import EventReason
from ..autoscaling import Decision
from ..autoscaling.signals import SIGNALS
from ..core.model import Event, MetricSamples
from . import metrics
from .kube import Conflict, Kube
from .scrape import DirectSource, MetricSource, PrometheusSource
from .sidecar import Endpoint

log = logging.getLogger(__name__)


class PoolAutoscaler:
    """One pool's autoscaler: decides once per interval, writes through the scale subresource."""

    def __init__(self, kube: Kube, namespace: str, name: str, http: httpx.AsyncClient | None = None) -> None:
        """``http``: the client to scrape and query with; one is opened on first use (and closed) when None."""
        self.kube, self.namespace, self.name = kube, namespace, name
        self._own_http = http is None
        self._http = http
        self._direct = DirectSource(http) if http is not None else None
        self._last_decision = -math.inf
        self._interval: float | None = None

    async def close(self) -> None:
        """Close the scrape client, if one was opened."""
        if self._own_http and self._http is not None:
            await self._http.aclose()

    def seconds_until_due(self) -> float:
        """How long the reconciler may sleep before the next decision is due (inf when off)."""
        if self._interval is None:
            return math.inf
        return max(0.0, self._last_decision + self._interval - time.monotonic())

    async def sample(self, scaling: AutoscalingSpec, published: Sequence[str],
                     endpoints: Mapping[str, Endpoint], now: bool = False) -> MetricSamples | None:
        """The samples of the published replicas when a decision is due (or ``now``: something the
        decision must see at once, such as a new demand hint); None when not (or when off)."""
        if scaling.mode == "Off":
            self._interval = None
            return None
        self._interval = float(scaling.interval_seconds)
        if self.seconds_until_due() > 0 and not now:
            return None
        values, pool_values = await self._sample(scaling, published, endpoints)
        throughput = self._direct.throughputs() if self._direct is not None else {}
        return MetricSamples(values, pool_values, {n: t for n, t in throughput.items() if n in published})

    async def _sample(self, scaling: AutoscalingSpec, published: Sequence[str], endpoints: Mapping[str, Endpoint],
                      ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """Per-replica values of the published replicas and the pool-level query values."""
        interval = float(scaling.interval_seconds)
        if self._http is None:
            self._http = httpx.AsyncClient()
            self._direct = DirectSource(self._http)
        assert self._direct is not None
        prometheus = (PrometheusSource(self._http, scaling.prometheus_url, self.namespace)
                      if scaling.prometheus_url else None)
        source: MetricSource = prometheus if scaling.source == "Prometheus" and prometheus else self._direct
        per_replica = [m for m in scaling.metrics if SIGNALS[m.type].per_replica]
        pool = [m for m in scaling.metrics if not SIGNALS[m.type].per_replica]
        targets = {n: endpoints[n].control + METRICS_PATH for n in published if n in endpoints}
        values = await source.sample(per_replica, targets, time.monotonic(), interval) if per_replica else {}
        pool_values = await prometheus.pool_values(pool, interval) if prometheus is not None and pool else {}
        return values, pool_values

    def committed(self, decision: Decision | None) -> None:
        """The step's status was written: the interval restarts and the gauges follow the decision."""
        if decision is None:
            return
        self._last_decision = time.monotonic()
        ns, pool = self.namespace, self.name
        metrics.AUTOSCALER_DESIRED.labels(ns, pool).set(decision.desired_replicas)
        metrics.AUTOSCALER_CURRENT.labels(ns, pool).set(decision.current_replicas)
        metrics.AUTOSCALER_DEMAND_FLOOR.labels(ns, pool).set(decision.status.demand_floor or 0)
        for outcome in decision.metrics:
            metrics.AUTOSCALER_METRIC_TARGET.labels(ns, pool, outcome.key).set(outcome.target)
            if outcome.value is not None:
                metrics.AUTOSCALER_METRIC_VALUE.labels(ns, pool, outcome.key).set(outcome.value)
            elif (ns, pool, outcome.key) in metrics.AUTOSCALER_METRIC_VALUE._metrics:
                metrics.AUTOSCALER_METRIC_VALUE.remove(ns, pool, outcome.key)  # unknown, not a stale number
        change = decision.desired_replicas - decision.current_replicas
        result = "ScaleUp" if change > 0 else "ScaleDown" if change < 0 else "NoChange"
        metrics.AUTOSCALER_DECISIONS.labels(ns, pool, result).inc()

    async def actuate(self, decision: Decision | None, resource_version: str) -> list[Event]:
        """Write the decided count through the scale subresource; the Events to post about the write.

        The write is bound to ``resource_version`` (the pool as this decision saw and wrote it),
        so a count another writer set in between is never overwritten: the API server refuses,
        and the next turn sees that write as external. A failed write is only logged: the status
        already says what was decided, and the next decision recognises the lost write (see the
        module docstring) and repeats it.
        """
        events: list[Event] = []
        if decision is None or not decision.apply:
            return events
        try:
            await self.kube.scale(self.namespace, self.name, decision.desired_replicas, resource_version)
        except Conflict:
            log.info("autoscaler write of %s/%s lost to another writer; re-deciding", self.namespace, self.name)
            return events
        except Exception as exc:
            log.exception("autoscaler write of %s/%s failed", self.namespace, self.name)
            events.append(Event("Warning", EventReason.FAILED_RESCALE,
                                f"New size: {decision.desired_replicas}; error: {exc}"))
            return events
        events.append(Event("Normal", EventReason.SUCCESSFUL_RESCALE,
                            f"New size: {decision.desired_replicas}; reason: {_reason(decision)}"))
        return events


def _reason(decision: Decision) -> str:
    """HPA-style Event reason text: which metric drove the count, and what limited it."""
    driver = max(decision.metrics, key=lambda o: o.replicas or 0, default=None)
    text = f"decision {decision.record.id}" if decision.record else "repeating the last decision"
    if driver is not None and driver.value is not None:
        text += f", {driver.key} {driver.value:.3g} per replica against target {driver.target:.3g}"
    if decision.limited_by:
        text += f", limited by {decision.limited_by}"
    return text

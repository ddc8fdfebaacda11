"""The autoscaler's shell: observe a pool's metrics, call the pure control law, persist, actuate.

:class:`PoolAutoscaler` lives inside a pool's :class:`~.reconciler.PoolReconciler`
(the pool's single writer) and takes a turn in every reconcile step. Once per
``intervalSeconds`` the turn scrapes the serving replicas (:mod:`.scrape`),
builds an :class:`~genrm_operator.autoscaling.Observation` and calls
:func:`~genrm_operator.autoscaling.decide`. Its ``status.autoscaler`` and
conditions go into the same optimistic-concurrency status PUT as the core's
status, so the recommendation history survives an operator restart and a
decision is never acted on unless the state it was made from was still current.
Only after that PUT does :meth:`PoolAutoscaler.actuate` write ``spec.replicas``
through the scale subresource (as HPA does, so ``kubectl scale``, an HPA or KEDA
remain interoperable), post a ``SuccessfulRescale`` Event and update the
``genrm_autoscaler_*`` metrics.

Another writer of ``spec.replicas`` (``kubectl scale``, an HPA, KEDA, a GitOps sync) is
adopted, never fought: the pure rule is :mod:`genrm_operator.autoscaling.override`; this
shell sets condition ``AutoscalerOverridden`` and posts the Warning Event it calls for.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from genrm_contract.sidecar import METRICS_PATH

from ..api.autoscaling import AutoscalerStatus, AutoscalingSpec
from ..api.pool import GenRMPoolStatus
from ..api.status import Condition, ConditionStatus, ConditionType, Reason
from ..autoscaling import Decision, Observation, ReplicaSample, ReplicaState, decide
from ..autoscaling.override import adopt, external_write
from ..autoscaling.signals import SIGNALS
from ..core.classify import Replica, Role, classify
from ..core.conditions import find, set_condition
from ..core.model import Event, Observed
from . import metrics
from .kube import Conflict, Kube
from .scrape import DirectSource, MetricSource, PrometheusSource
from .sidecar import Endpoint

log = logging.getLogger(__name__)
OVERRIDDEN = ConditionType.AUTOSCALER_OVERRIDDEN
CONDITION_TYPES = frozenset({"ScalingActive", "AbleToScale", "ScalingLimited", OVERRIDDEN})
"""Conditions the autoscaler owns; the core recomputes only Available, Progressing and Degraded."""
_STATE = {Role.SERVING: ReplicaState.SERVING, Role.STARTING: ReplicaState.STARTING}


@dataclass(frozen=True)
class Turn:
    """The autoscaler's part of one reconcile step: what goes into the status PUT, what to do after it."""

    conditions: tuple[Condition, ...]
    autoscaler: AutoscalerStatus | None = None
    """The new ``status.autoscaler``; None keeps the one the core copied through."""
    decision: Decision | None = None
    external: int | None = None
    """The ``spec.replicas`` another writer set, when this turn noticed one."""

    def applied_to(self, status: GenRMPoolStatus) -> GenRMPoolStatus:
        """``status`` (the core's) with the autoscaler's conditions and memory."""
        kept = [c for c in status.conditions if c.type not in CONDITION_TYPES]
        update: dict[str, object] = {"conditions": kept + list(self.conditions)}
        if self.autoscaler is not None:
            update["autoscaler"] = self.autoscaler
        return status.model_copy(update=update)


def replicas_of(observed: Observed) -> list[Replica]:
    """The core's roles of the pool's pods (the same classification the reconcile step uses)."""
    return classify(observed.pods, observed.sidecars, observed.now,
                    float(observed.spec.engine.startup_timeout_seconds))


def observation(observed: Observed, replicas: list[Replica], values: dict[str, dict[str, float]],
                pool_values: dict[str, float]) -> Observation:
    """The control law's view of the pool: serving and starting replicas (draining ones are not capacity)."""
    samples = [
        ReplicaSample(r.pod.name, _STATE[r.role], values.get(r.pod.name, {}) if r.role is Role.SERVING else {})
        for r in replicas if r.role in _STATE
    ]
    return Observation(
        now=datetime.fromtimestamp(observed.now, UTC),
        current_replicas=observed.spec.replicas,
        replicas=samples,
        unschedulable=sum(1 for r in replicas if r.role is Role.STARTING and r.pod.unschedulable),
        pool_values=pool_values,
    )


def conditions(decision: Decision, overridden: bool | None, previous: list[Condition], now: float,
               generation: int) -> tuple[Condition, ...]:
    """HPA's three conditions from the decision, plus ``AutoscalerOverridden`` (None: not mode Auto, left out)."""
    out = [set_condition(previous, c.type, c.status, c.reason, c.message, now, generation)
           for c in decision.conditions]
    if overridden:
        out.append(set_condition(previous, OVERRIDDEN, ConditionStatus.TRUE, Reason.EXTERNAL_WRITE,
                                 "spec.replicas was set by another writer; the autoscaler adopted it as its "
                                 "current count and changes it only when its own decision differs",
                                 now, generation))
    elif overridden is not None:
        out.append(set_condition(previous, OVERRIDDEN, ConditionStatus.FALSE, Reason.AUTOSCALER_IN_CHARGE,
                                 "spec.replicas is what the autoscaler last decided", now, generation))
    return tuple(out)


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

    async def turn(self, observed: Observed, endpoints: Mapping[str, Endpoint]) -> Turn:
        """Decide if the interval is up; between decisions keep the last conditions."""
        spec, previous = observed.spec.autoscaling, observed.status
        if spec.mode == "Off":
            self._interval = None
            return Turn(conditions=())
        self._interval = float(spec.interval_seconds)
        if self.seconds_until_due() > 0:
            return Turn(conditions=tuple(c for c in previous.conditions if c.type in CONDITION_TYPES))
        replicas = replicas_of(observed)
        serving = sorted(r.pod.name for r in replicas if r.role is Role.SERVING)
        values, pool_values = await self._sample(spec, serving, endpoints)
        seen = observation(observed, replicas, values, pool_values)
        memory = previous.autoscaler or AutoscalerStatus()
        external = external_write(spec, seen.current_replicas, previous.autoscaler)
        if external:
            memory = adopt(spec, memory, seen.current_replicas, seen.now)
        decision = decide(spec, seen, memory)
        was_overridden = (c := find(previous.conditions, OVERRIDDEN)) is not None and c.status == "True"
        overridden = external or (was_overridden and not decision.apply) if spec.mode == "Auto" else None
        conds = conditions(decision, overridden, previous.conditions, observed.now, observed.generation)
        return Turn(conds, decision.status, decision, seen.current_replicas if external else None)

    async def _sample(self, scaling: AutoscalingSpec, serving: list[str], endpoints: Mapping[str, Endpoint],
                      ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """Per-replica values of the serving replicas and the pool-level query values."""
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
        targets = {n: endpoints[n].control + METRICS_PATH for n in serving if n in endpoints}
        values = await source.sample(per_replica, targets, time.monotonic(), interval) if per_replica else {}
        pool_values = await prometheus.pool_values(pool, interval) if prometheus is not None and pool else {}
        return values, pool_values

    def committed(self, turn: Turn) -> None:
        """The turn's status was written: the interval restarts and the gauges follow the decision."""
        decision = turn.decision
        if decision is None:
            return
        self._last_decision = time.monotonic()
        ns, pool = self.namespace, self.name
        metrics.AUTOSCALER_DESIRED.labels(ns, pool).set(decision.desired_replicas)
        metrics.AUTOSCALER_CURRENT.labels(ns, pool).set(decision.current_replicas)
        for outcome in decision.metrics:
            metrics.AUTOSCALER_METRIC_TARGET.labels(ns, pool, outcome.key).set(outcome.target)
            if outcome.value is not None:
                metrics.AUTOSCALER_METRIC_VALUE.labels(ns, pool, outcome.key).set(outcome.value)
            elif (ns, pool, outcome.key) in metrics.AUTOSCALER_METRIC_VALUE._metrics:
                metrics.AUTOSCALER_METRIC_VALUE.remove(ns, pool, outcome.key)  # unknown, not a stale number
        change = decision.desired_replicas - decision.current_replicas
        result = "ScaleUp" if change > 0 else "ScaleDown" if change < 0 else "NoChange"
        metrics.AUTOSCALER_DECISIONS.labels(ns, pool, result).inc()

    async def actuate(self, turn: Turn, resource_version: str) -> list[Event]:
        """Write the decided count through the scale subresource; the Events to post about the turn.

        The write is bound to ``resource_version`` (the pool as this decision saw and wrote it),
        so a count another writer set in between is never overwritten: the API server refuses,
        and the next turn sees that write as external. A failed write is only logged: the status
        already says what was decided, and the next decision recognises the lost write (see the
        module docstring) and repeats it.
        """
        events: list[Event] = []
        if turn.external is not None:
            events.append(Event("Warning", OVERRIDDEN,
                                f"spec.replicas set to {turn.external} by another writer; adopted as the "
                                "autoscaler's current count"))
        decision = turn.decision
        if decision is None or not decision.apply:
            return events
        try:
            await self.kube.scale(self.namespace, self.name, decision.desired_replicas, resource_version)
        except Conflict:
            log.info("autoscaler write of %s/%s lost to another writer; re-deciding", self.namespace, self.name)
            return events
        except Exception as exc:
            log.exception("autoscaler write of %s/%s failed", self.namespace, self.name)
            events.append(Event("Warning", "FailedRescale", f"New size: {decision.desired_replicas}; error: {exc}"))
            return events
        events.append(Event("Normal", "SuccessfulRescale",
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

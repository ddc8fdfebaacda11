"""An independent model of HPA v2's replica calculator and behavior normalization, for parity tests only.

Written from the structure of kube-controller-manager's podautoscaler package
(``replica_calculator.go``: ``groupPods``, ``calcPlainMetricReplicas``, ``GetMetricUsageRatio``;
``horizontal.go``: ``computeReplicasForMetrics``, ``stabilizeRecommendationWithBehaviors``,
``convertDesiredReplicasWithBehaviorRate`` and the two limit calculators), keeping its
integer milli-unit arithmetic and its separate up/down event lists. It shares no code
with the production control law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Pod:
    """A pod as HPA sees it: phase and, per metric name, a sample in milli-units (absent: missing)."""

    name: str
    phase: str  # "Running" or "Pending"
    milli: dict[str, int]


@dataclass(frozen=True)
class Policy:
    kind: str  # "Pods" or "Percent"
    value: int
    period: int


@dataclass(frozen=True)
class Rules:
    window: int
    policies: tuple[Policy, ...]
    select: str = "Max"


HPA_UP = Rules(0, (Policy("Percent", 100, 15), Policy("Pods", 4, 15)))
HPA_DOWN = Rules(300, (Policy("Percent", 100, 15),))


class MetricError(Exception):
    """computeReplicasForMetrics could not produce a count."""


@dataclass
class Hpa:
    """One HorizontalPodAutoscaler with Pods metrics (name -> target milli) and default behavior."""

    targets: dict[str, int]
    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    up: Rules = HPA_UP
    down: Rules = HPA_DOWN
    recommendations: list[tuple[datetime, int]] = field(default_factory=list)
    up_events: list[tuple[datetime, int]] = field(default_factory=list)
    down_events: list[tuple[datetime, int]] = field(default_factory=list)

    def _within(self, ratio: float) -> bool:
        return (1.0 - self.tolerance) <= ratio <= (1.0 + self.tolerance)

    def plain_metric_replicas(self, pods: list[Pod], metric: str, current: int) -> int:
        """calcPlainMetricReplicas for one Pods metric."""
        target = self.targets[metric]
        metrics: dict[str, int] = {}
        ready = 0
        unready: list[str] = []
        missing: list[str] = []
        for pod in pods:
            if pod.phase == "Pending":
                unready.append(pod.name)
                continue
            if metric not in pod.milli:
                missing.append(pod.name)
                continue
            metrics[pod.name] = pod.milli[metric]
            ready += 1
        if not metrics:
            raise MetricError("did not receive metrics for targeted pods")
        ratio = (sum(metrics.values()) // len(metrics)) / target
        with_unready = bool(unready) and ratio > 1.0
        if not with_unready and not missing:
            if self._within(ratio):
                return current
            return math.ceil(ratio * ready)
        for name in missing:
            metrics[name] = target if ratio < 1.0 else 0
        if with_unready:
            for name in unready:
                metrics[name] = 0
        new_ratio = (sum(metrics.values()) // len(metrics)) / target
        if self._within(new_ratio) or (ratio > 1.0 and new_ratio < 1.0) or (ratio < 1.0 and new_ratio > 1.0):
            return current
        replicas = math.ceil(new_ratio * len(metrics))
        if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
            return current
        return replicas

    def replicas_for_metrics(self, pods: list[Pod], current: int) -> int:
        """computeReplicasForMetrics: the max over metrics; a failed metric only stops a scale-down."""
        replicas, invalid = 0, 0
        for metric in self.targets:
            try:
                replicas = max(replicas, self.plain_metric_replicas(pods, metric, current))
            except MetricError:
                invalid += 1
        if invalid >= len(self.targets) or (invalid > 0 and replicas < current):
            raise MetricError("invalid metrics")
        return replicas

    def reconcile(self, now: datetime, pods: list[Pod], current: int) -> int:
        """One sync: the new spec.replicas (recording events as if it were written)."""
        if current == 0:
            return 0
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            try:
                proposal = self.replicas_for_metrics(pods, current)
            except MetricError:
                return current
            desired = self._rate(now, current, self._stabilize(now, current, proposal))
        if desired > current:
            self.up_events.append((now, desired - current))
        elif desired < current:
            self.down_events.append((now, current - desired))
        return desired

    def _stabilize(self, now: datetime, current: int, proposal: int) -> int:
        up_cut = now - timedelta(seconds=self.up.window)
        down_cut = now - timedelta(seconds=self.down.window)
        up, down = proposal, proposal
        old = None
        for i, (t, rec) in enumerate(self.recommendations):
            if t > up_cut:
                up = min(up, rec)
            if t > down_cut:
                down = max(down, rec)
            if t < up_cut and t < down_cut:
                old = i
        result = min(max(current, up), down)
        if old is None:
            self.recommendations.append((now, proposal))
        else:
            self.recommendations[old] = (now, proposal)
        return result

    def _changes(self, now: datetime, period: int, events: list[tuple[datetime, int]]) -> int:
        cut = now - timedelta(seconds=period)
        return sum(c for t, c in events if t > cut)

    def _rate(self, now: datetime, current: int, desired: int) -> int:
        if desired > current:
            limit = self._limit(now, current, self.up, up=True)
            limit = max(limit, current)
            return min(desired, min(self.max_replicas, limit))
        if desired < current:
            limit = self._limit(now, current, self.down, up=False)
            limit = min(limit, current)
            return max(desired, max(self.min_replicas, limit))
        return desired

    def _limit(self, now: datetime, current: int, rules: Rules, up: bool) -> int:
        if rules.select == "Disabled":
            return current
        pick_biggest = rules.select == "Max"
        result: int | None = None
        for p in rules.policies:
            start = (
                current
                - self._changes(now, p.period, self.up_events)
                + self._changes(now, p.period, self.down_events)
            )
            if p.kind == "Pods":
                proposed = start + p.value if up else start - p.value
            elif up:
                proposed = math.ceil(start * (1 + p.value / 100))
            else:
                proposed = int(start * (1 - p.value / 100))
            if result is None:
                result = proposed
            elif up:
                result = max(result, proposed) if pick_biggest else min(result, proposed)
            else:
                result = min(result, proposed) if pick_biggest else max(result, proposed)
        assert result is not None
        return result

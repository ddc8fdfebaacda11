"""Builders shared by the autoscaler tests: specs, observations and a tick loop."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from genrm_operator.api.autoscaling import AutoscalerStatus, AutoscalingSpec
from genrm_operator.autoscaling import Decision, Observation, ReplicaSample, ReplicaState, decide

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TARGET = 10


def at(seconds: float) -> datetime:
    """The test clock: ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)


def spec(**overrides: Any) -> AutoscalingSpec:
    """An Auto spec following InFlight at TARGET per replica, with the given wire-format overrides."""
    wire: dict[str, Any] = {
        "mode": "Auto",
        "minReplicas": 1,
        "maxReplicas": 20,
        "metrics": [{"type": "InFlight", "target": {"averageValue": str(TARGET)}}],
    }
    wire.update(overrides)
    return AutoscalingSpec.model_validate(wire)


def hpa_like(**overrides: Any) -> AutoscalingSpec:
    """Configured like an HPA: tolerance 0.1 both ways, windows 0 s / 300 s, HPA's default policies."""
    behavior = {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "tolerance": "0.1",
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "tolerance": "0.1",
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
    }
    return spec(behavior=behavior, **overrides)


def serving(*loads: float | None, metric: str = "InFlight") -> list[ReplicaSample]:
    """Serving replicas with these values (None: no sample)."""
    return [
        ReplicaSample(f"r{i}", ReplicaState.SERVING, {} if v is None else {metric: v})
        for i, v in enumerate(loads)
    ]


def starting(count: int, first: int = 100) -> list[ReplicaSample]:
    """Replicas still loading their model."""
    return [ReplicaSample(f"s{first + i}", ReplicaState.STARTING) for i in range(count)]


def observe(
    seconds: float, replicas: Sequence[ReplicaSample], current: int | None = None, **kwargs: Any
) -> Observation:
    """An observation at ``seconds``; the current count defaults to the replicas passed."""
    return Observation(
        now=at(seconds),
        current_replicas=len(replicas) if current is None else current,
        replicas=list(replicas),
        **kwargs,
    )


def wire_round_trip(status: AutoscalerStatus) -> AutoscalerStatus:
    """What an operator restart sees: the status as stored by the API server, parsed again."""
    return AutoscalerStatus.model_validate(json.loads(json.dumps(status.to_wire())))


def run_trace(
    scaling: AutoscalingSpec,
    loads: Iterable[float],
    *,
    interval: float = 5.0,
    replicas: int = 1,
    restart_every: int | None = None,
) -> list[Decision]:
    """Drive the control law with a total InFlight per tick, spread over instantly-serving replicas.

    With ``restart_every`` the status goes through its wire form every that many ticks.
    """
    status = AutoscalerStatus()
    decisions = []
    for tick, total in enumerate(loads):
        if restart_every and tick % restart_every == 0:
            status = wire_round_trip(status)
        observation = observe(tick * interval, serving(*([total / replicas] * replicas)))
        decision = decide(scaling, observation, status)
        decisions.append(decision)
        status = decision.status
        if decision.apply:
            replicas = decision.desired_replicas
    return decisions


def counts(decisions: Iterable[Decision]) -> list[int]:
    """The desired count after each tick."""
    return [d.desired_replicas for d in decisions]


def flaps(decisions: Iterable[Decision]) -> int:
    """Direction changes among the applied decisions."""
    directions = [
        1 if d.desired_replicas > d.current_replicas else -1 for d in decisions if d.apply
    ]
    return sum(1 for a, b in pairwise(directions) if a != b)


def condition(decision: Decision, kind: str) -> tuple[bool, str]:
    """(status, reason) of one of the decision's conditions."""
    found = next(c for c in decision.conditions if c.type == kind)
    return found.status == "True", found.reason

"""A closed-loop simulation of a pool under a load profile, for tests.

Load is in units of one replica's capacity, which is the InFlight target. Closed loop
(the default, like an RL trainer that keeps a batch of judge calls outstanding): ``rate``
x target requests are in flight whatever the pool size. Open loop: requests arrive at
``rate`` x target / ``service_s`` per second into a fluid queue; each takes ``service_s``
while its replica is not saturated and a serving replica completes at most
``target / service_s`` per second, so a backlog builds while capacity is short. A new
replica serves ``startup_s`` after it is created. The controller is :func:`decide`, called every ``interval_s`` with the
InFlight each serving replica would report; its decisions are applied at once, removing
starting replicas before serving ones (the operator's victim order).

It measures, in simulated time, the figures ``make bench-autoscaler`` measures on the local
cluster (``bench/autoscaler.py``): reaction (load step to the first scale-up), settle (load
step to enough serving replicas), flaps (direction changes while the load holds) and overshoot
(replicas beyond the need while it holds). ``tests/autoscaling/test_simulation.py`` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from genrm_operator.api.autoscaling import AutoscalerStatus, AutoscalingSpec
from genrm_operator.autoscaling.decide import Decision, decide
from genrm_operator.autoscaling.observation import Observation, ReplicaSample, ReplicaState

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LoadProfile:
    """Load in replica capacities: ``base``, then ``peak`` from ``step_at_s``, then ``after`` from ``drop_at_s``."""

    peak: float = 4.0
    step_at_s: float = 10.0
    drop_at_s: float = 190.0
    base: float = 0.5
    after: float = 0.0

    def rate(self, t: float) -> float:
        """Arrival rate at ``t`` seconds."""
        if t < self.step_at_s:
            return self.base
        return self.peak if t < self.drop_at_s else self.after


@dataclass
class SimResult:
    """The trace of a run and the benchmark's figures."""

    reaction_s: float | None
    settle_s: float | None
    flaps: int
    overshoot_replicas: int
    decisions: list[Decision] = field(default_factory=list)
    replicas: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, spec replicas, serving replicas) after each decision."""


def simulate(
    spec: AutoscalingSpec,
    profile: LoadProfile,
    *,
    duration_s: float = 300.0,
    interval_s: float = 2.0,
    startup_s: float = 20.0,
    service_s: float = 1.0,
    dt_s: float = 0.1,
    initial_replicas: int = 1,
    closed_loop: bool = True,
) -> SimResult:
    """Run ``spec`` against ``profile`` and score it (see the module docstring)."""
    target = next(m.target.amount() for m in spec.metrics if m.type == "InFlight")
    per_replica_throughput = target / service_s
    ready_at: list[float] = [0.0] * initial_replicas
    in_flight, status, t = 0.0, AutoscalerStatus(), 0.0
    next_tick, steps = interval_s, round(duration_s / dt_s)
    result = SimResult(reaction_s=None, settle_s=None, flaps=0, overshoot_replicas=0)
    need = math.ceil(profile.peak - 1e-9)
    last_direction = 0
    for step in range(steps):
        t = step * dt_s
        serving = sum(1 for r in ready_at if r <= t)
        if closed_loop:
            in_flight = profile.rate(t) * target
        else:
            completions = min(in_flight / service_s, serving * per_replica_throughput)
            in_flight = max(0.0, in_flight + (profile.rate(t) * per_replica_throughput - completions) * dt_s)
        if t + 1e-9 < next_tick:
            continue
        next_tick += interval_s
        decision = decide(spec, _observe(t, ready_at, in_flight), status)
        status = decision.status
        result.decisions.append(decision)
        if decision.apply:
            ready_at = _resize(ready_at, decision.desired_replicas, t + startup_s)
            direction = 1 if decision.desired_replicas > decision.current_replicas else -1
            holding = profile.step_at_s <= t < profile.drop_at_s
            if direction > 0 and result.reaction_s is None and t >= profile.step_at_s:
                result.reaction_s = t - profile.step_at_s
            if holding and last_direction and direction != last_direction:
                result.flaps += 1
            last_direction = direction
        serving = sum(1 for r in ready_at if r <= t)
        result.replicas.append((t, len(ready_at), serving))
        if profile.step_at_s <= t < profile.drop_at_s:
            result.overshoot_replicas = max(result.overshoot_replicas, len(ready_at) - need)
            if result.settle_s is None and serving >= need:
                result.settle_s = t - profile.step_at_s
    return result


def _observe(t: float, ready_at: Sequence[float], in_flight: float) -> Observation:
    """What the shell would see: the load spread evenly over the serving replicas."""
    serving = sum(1 for r in ready_at if r <= t)
    replicas = [
        ReplicaSample(
            name=f"replica-{i}",
            state=ReplicaState.SERVING if r <= t else ReplicaState.STARTING,
            values={"InFlight": in_flight / serving} if r <= t else {},
        )
        for i, r in enumerate(ready_at)
    ]
    return Observation(now=EPOCH + timedelta(seconds=t), current_replicas=len(ready_at), replicas=replicas)


def _resize(ready_at: list[float], desired: int, new_ready_at: float) -> list[float]:
    """Add replicas ready at ``new_ready_at``, or remove the latest-ready (starting first)."""
    if desired > len(ready_at):
        return ready_at + [new_ready_at] * (desired - len(ready_at))
    return sorted(ready_at)[:desired]

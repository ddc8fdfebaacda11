"""What the operator shell saw in one interval: the control law's only view of the world.

Plain dataclasses so the control law can be driven from recorded or synthetic traces
without a cluster, and so the shell (which scrapes sidecars or queries Prometheus)
stays the only place that knows where numbers come from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from genrm_contract.demand import DemandHint


class ReplicaState(StrEnum):
    """Where a replica is in its life, as far as capacity is concerned."""

    STARTING = "Starting"
    """Created but not serving yet (Pending, pulling, loading the model): capacity on the way.
    HPA's "unready" pods: their samples are ignored."""
    SERVING = "Serving"
    """Ready and receiving traffic: its samples count."""


@dataclass(frozen=True)
class ReplicaSample:
    """One replica's fresh metric values.

    ``values`` maps a metric's key (``MetricSpec.key``) to the (finite) value scraped this interval.
    A key that is absent means no fresh sample (scrape failed, timed out or is older than
    the shell's staleness bound): the control law then applies HPA's missing-pod rules.
    Replicas that are draining or terminating are not capacity and must not be passed.
    """

    name: str
    state: ReplicaState
    values: Mapping[str, float] = field(default_factory=dict)
    throughput: float | None = None
    """Requests per second it answered over the last interval, when measured (direct scrapes only)."""


@dataclass(frozen=True)
class Observation:
    """Everything one decision needs besides the spec and the previous status.

    ``current_replicas`` is the scale target's ``spec.replicas`` (what the pool is meant to
    have, so replicas not created yet count as on the way); ``replicas`` the pods that exist;
    ``unschedulable`` how many of those the scheduler reported as Unschedulable, and
    ``cannot_start`` how many others have a container the kubelet cannot create as specified;
    ``pool_values`` the (finite) value of each pool-level (Prometheus) metric, absent when the
    query failed or returned nothing; ``hints`` the demand hints reported now (by gateways and the
    pool's annotation) and ``hint_error`` why the annotation was not taken; ``idle_seconds`` how
    long every replica has had nothing in flight, None unless every one is serving, reported and
    idle (so a replica not heard from keeps the pool up).
    """

    now: datetime
    current_replicas: int
    replicas: Sequence[ReplicaSample] = ()
    unschedulable: int = 0
    cannot_start: int = 0
    pool_values: Mapping[str, float] = field(default_factory=dict)
    hints: Sequence[DemandHint] = ()
    hint_error: str | None = None
    idle_seconds: float | None = None
    held: int = 0

    @property
    def blocked(self) -> int:
        """Replicas that cannot start until something outside the operator changes."""
        return self.unschedulable + self.cannot_start

    def count(self, state: ReplicaState) -> int:
        """How many replicas are in ``state``."""
        return sum(1 for r in self.replicas if r.state is state)

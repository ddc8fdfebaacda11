"""Demand hints in the control law: which hints are in force, and the replica floor they ask for.

Why a floor and not a metric: a hint announces load that has not arrived, so no per-replica
average can express it, and the floor must hold through the phase even when stabilization or the
rate policies would hold the pool back. Its rate is what the phase sends on average (requests over
seconds); several concurrent phases (two trainers) add up.

A hint's lifetime counts from the moment the operator first sees it, on the operator's clock, so
no sender's clock matters. Expired ids are remembered (a bounded list), because the gateway that
reported a hint, or an annotation left in place, may go on reporting it after it expired here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from genrm_contract.demand import DemandHint
from pydantic import ValidationError

from genrm_operator.api.autoscaling import (
    MAX_ACTIVE_HINTS,
    MAX_SEEN_HINTS,
    ActiveHint,
    AutoscalerStatus,
    AutoscalingSpec,
    DemandSpec,
    format_quantity,
    quantity_value,
)

from .observation import ReplicaSample, ReplicaState


@dataclass(frozen=True)
class Demand:
    """The hints in force after this interval, the ids that expired, and the floor they ask for."""

    active: tuple[ActiveHint, ...]
    seen: tuple[str, ...]
    floor: int
    """0 when no hint is in force."""


def annotation_hint(value: str | None) -> tuple[DemandHint | None, str | None]:
    """The hint in the pool's annotation, or why there is none to take (None: no annotation)."""
    if value is None:
        return None, None
    try:
        return DemandHint.model_validate_json(value), None
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        return None, f"not a demand hint: {reasons}"[:1024]


def is_new(status: AutoscalerStatus | None, reported: Iterable[DemandHint]) -> bool:
    """Whether any reported hint is neither in force nor expired: then a decision is due at once."""
    known = set(status.demand_seen) | {h.id for h in status.demand} if status is not None else set()
    return any(h.id not in known for h in reported)


BUSY = 0.8
"""A replica at this share of its InFlight target or more serves near its target load: its rate is a
measure of what one replica serves (a less busy one's rate says how much was sent, not what it can do)."""
SMOOTHING = 0.3
"""Weight of one interval's measure in the moving average: a few busy intervals settle it."""


def measured_throughput(spec: AutoscalingSpec, replicas: Sequence[ReplicaSample], previous: str | None) -> str | None:
    """The moving average of one replica's throughput at its InFlight target, updated with this
    interval's busy replicas (unchanged when none was busy, or without an InFlight metric)."""
    inflight = next((m for m in spec.metrics if m.type == "InFlight"), None)
    if inflight is None:
        return previous
    busy_at = BUSY * quantity_value(inflight.target.quantity)
    rates = [r.throughput for r in replicas if r.state is ReplicaState.SERVING and r.throughput is not None
             and r.values.get(inflight.key, 0.0) >= busy_at]
    if not rates:
        return previous
    sample = sum(rates) / len(rates)
    estimate = sample if previous is None else (1 - SMOOTHING) * quantity_value(previous) + SMOOTHING * sample
    return format_quantity(estimate) if estimate > 0 else previous


def demand(spec: DemandSpec, status: AutoscalerStatus, reported: Iterable[DemandHint], now: datetime,
           max_replicas: int) -> Demand:
    """Fold the reported hints into the ones in force, expire the old ones and size the floor.

    A reported hint with an id in force replaces it only when its content changed (the sender
    re-announced the phase): its lifetime then counts again from now. The floor is the summed rate
    over one replica's measured throughput (``status.replicaThroughput``), or the declared
    ``replicaRequestsPerSecond`` until one is measured, rounded up, and never above ``max_replicas``.
    """
    seen = list(status.demand_seen)
    active = {h.id: h for h in status.demand if h.until > now}
    seen.extend(h.id for h in status.demand if h.until <= now)
    for hint in reported:
        held = active.get(hint.id)
        if hint.id in seen or (held is not None and (held.requests, held.for_seconds) == (hint.requests,
                                                                                         hint.for_seconds)):
            continue
        active.pop(hint.id, None)
        active[hint.id] = ActiveHint(id=hint.id, requests=hint.requests, for_seconds=hint.for_seconds,
                                     seen_at=now, until=now + timedelta(seconds=hint.lifetime))
    kept = tuple(active.values())[-MAX_ACTIVE_HINTS:]
    rate = sum(h.requests / h.for_seconds for h in kept)
    measured = status.replica_throughput
    capacity = quantity_value(measured) if measured else quantity_value(spec.replica_requests_per_second)
    floor = min(max_replicas, math.ceil(rate / capacity)) if kept else 0
    return Demand(active=kept, seen=tuple(dict.fromkeys(seen))[-MAX_SEEN_HINTS:], floor=floor)

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
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from genrm_contract.demand import DemandHint
from pydantic import ValidationError

from genrm_operator.api.autoscaling import (
    MAX_ACTIVE_HINTS,
    MAX_SEEN_HINTS,
    ActiveHint,
    AutoscalerStatus,
    DemandSpec,
    quantity_value,
)


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


def demand(spec: DemandSpec, status: AutoscalerStatus, reported: Iterable[DemandHint], now: datetime,
           max_replicas: int) -> Demand:
    """Fold the reported hints into the ones in force, expire the old ones and size the floor.

    A reported hint with an id in force replaces it only when its content changed (the sender
    re-announced the phase): its lifetime then counts again from now. The floor is the summed rate
    over ``replicaRequestsPerSecond``, rounded up, and never above ``max_replicas``.
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
    floor = min(max_replicas, math.ceil(rate / quantity_value(spec.replica_requests_per_second))) if kept else 0
    return Demand(active=kept, seen=tuple(dict.fromkeys(seen))[-MAX_SEEN_HINTS:], floor=floor)

"""Standard Kubernetes conditions summarising the pool.

Conditions are observations, not the state machine: they are recomputed from
scratch each step, and ``lastTransitionTime`` moves only when a status flips.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api.status import Condition, ConditionStatus, ConditionType
from .clock import stamp


def set_condition(
    previous: Sequence[Condition],
    type_: ConditionType,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: float,
    generation: int,
) -> Condition:
    """A condition that keeps the previous transition time when its status is unchanged."""
    old = find(previous, type_)
    since = old.last_transition_time if old is not None and old.status == status else stamp(now)
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def find(conditions: Sequence[Condition], type_: ConditionType) -> Condition | None:
    """The condition of this type, if present."""
    return next((c for c in conditions if c.type == type_), None)

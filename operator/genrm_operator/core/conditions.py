"""Standard Kubernetes conditions summarising the pool.

Conditions are observations, not the state machine: they are recomputed from
scratch each step, and ``lastTransitionTime`` moves only when a status flips.
"""

from __future__ import annotations

from typing import Literal

from ..api.status import Condition
from .clock import to_rfc3339

Status = Literal["True", "False", "Unknown"]


def set_condition(
    previous: list[Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: float,
    generation: int,
) -> Condition:
    """A condition that keeps the previous transition time when its status is unchanged."""
    old = next((c for c in previous if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else to_rfc3339(now)
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def find(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of this type, if present."""
    return next((c for c in conditions if c.type == type_), None)

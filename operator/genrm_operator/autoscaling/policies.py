"""HPA's rate policies and replica bounds (``convertDesiredReplicasWithBehaviorRate``).

Each policy allows a change relative to the replica count at the start of its look-back
period, which is reconstructed from the scale events kept in status: a pool cannot take
two full steps in one period by asking twice. Percentages are applied in integers with
HPA's rounding (up when growing, towards zero when shrinking), so +9 % of 100 replicas
allows 109 and -30 % of 90 allows 63, where floats allow 110 and 62.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from fractions import Fraction

from genrm_operator.api.autoscaling import (
    MAX_SCALE_EVENTS,
    Behavior,
    ScaleDownRules,
    ScaleEvent,
    ScaleUpRules,
)

from .milli import ceil_div


def limit(
    desired: int,
    current: int,
    bounds: tuple[int, int],
    behavior: Behavior,
    events: Sequence[ScaleEvent],
    now: datetime,
) -> tuple[int, str | None]:
    """``desired`` within the rate policies and ``bounds`` (min, max), and the limiter that clamped it.

    The reasons are HPA's: ScaleUpLimit / ScaleDownLimit for a policy, TooManyReplicas /
    TooFewReplicas for a bound.
    """
    low, high = bounds
    if desired > current:
        rate = max(_allowed(behavior.scale_up, current, events, now, up=True), current)
        ceiling, reason = (rate, "ScaleUpLimit") if high > rate else (high, "TooManyReplicas")
        return (ceiling, reason) if desired > ceiling else (desired, None)
    if desired < current:
        rate = min(_allowed(behavior.scale_down, current, events, now, up=False), current)
        floor, reason = (rate, "ScaleDownLimit") if low < rate else (low, "TooFewReplicas")
        return (floor, reason) if desired < floor else (desired, None)
    return desired, None


def _allowed(
    rules: ScaleUpRules | ScaleDownRules, current: int, events: Sequence[ScaleEvent], now: datetime, up: bool
) -> int:
    """The furthest count the policies allow in one direction (``current`` when Disabled)."""
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        since = now - timedelta(seconds=policy.period_seconds)
        start = current - sum(e.change for e in events if e.time > since)
        if policy.type == "Pods":
            proposals.append(start + policy.value if up else start - policy.value)
        elif up:
            proposals.append(ceil_div(start * (100 + policy.value), 100))
        else:
            proposals.append(math.trunc(Fraction(start * (100 - policy.value), 100)))
    biggest_change = (max if up else min)(proposals)
    smallest_change = (min if up else max)(proposals)
    return biggest_change if rules.select_policy == "Max" else smallest_change


def record_event(
    events: Sequence[ScaleEvent], change: int, now: datetime, behavior: Behavior
) -> tuple[ScaleEvent, ...]:
    """The events with ``change`` added and those older than every policy period dropped."""
    longest = max(p.period_seconds for p in (*behavior.scale_up.policies, *behavior.scale_down.policies))
    since = now - timedelta(seconds=longest)
    kept = [e for e in events if e.time > since]
    kept.append(ScaleEvent(time=now, change=change))
    return tuple(kept[-MAX_SCALE_EVENTS:])

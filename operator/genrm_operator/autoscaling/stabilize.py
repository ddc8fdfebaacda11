"""HPA's stabilization windows over a recommendation history that lives in status.

Scale up only to the lowest recommendation inside the up window (the demand has to
persist), scale down only to the highest inside the down window (one quiet moment is not
enough). This is HPA's ``stabilizeRecommendationWithBehaviors``; AIBrix's port inverts
the two and picks the most aggressive value instead. Unlike HPA, the history is returned
for the caller to persist, so an operator restart resumes mid-window.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from genrm_operator.api.autoscaling import MAX_RECOMMENDATIONS, TimedReplicas


def stabilize(
    history: Sequence[TimedReplicas],
    raw: int,
    current: int,
    now: datetime,
    up_window: timedelta,
    down_window: timedelta,
) -> int:
    """``raw`` held between the up-window minimum and the down-window maximum (the current count between)."""
    up, down = raw, raw
    for entry in history:
        made = entry.time
        if made > now - up_window:
            up = min(up, entry.replicas)
        if made > now - down_window:
            down = max(down, entry.replicas)
    return min(max(current, up), down)


def remember(
    history: Sequence[TimedReplicas], raw: int, now: datetime, longest_window: timedelta
) -> tuple[TimedReplicas, ...]:
    """The history with ``raw`` added and everything that can no longer matter dropped.

    An entry outside the longest window is dead; so is an entry with the same value as a
    newer one, because the newer one lies inside every window the older one does. That keeps
    the list to at most one entry per distinct value in the window.
    """
    kept = [
        e for e in history if e.time > now - longest_window and e.replicas != raw
    ]
    kept.append(TimedReplicas(time=now, replicas=raw))
    return tuple(kept[-MAX_RECOMMENDATIONS:])

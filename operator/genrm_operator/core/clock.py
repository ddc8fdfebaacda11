"""The status times of the moments the core reasons about (float seconds since the epoch)."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def stamp(seconds: float) -> datetime:
    """Whole seconds, as metav1.Time: what the state machine records in conditions, operations and history."""
    return datetime.fromtimestamp(math.floor(seconds), UTC)


def instant(seconds: float) -> datetime:
    """Milliseconds (the finest the status keeps): for the moments a drain's windows are measured from.

    A window measured from a whole-second stamp would be up to a second shorter than configured:
    an unpublish at x.9 s would let the fence come 1.1 s later under propagationSeconds 2."""
    return datetime.fromtimestamp(math.floor(seconds * 1000) / 1000, UTC)

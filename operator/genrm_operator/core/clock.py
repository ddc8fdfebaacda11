"""The status time of a moment the core reasons about (float seconds since the epoch)."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def stamp(seconds: float) -> datetime:
    """Whole seconds, as metav1.Time: what the state machine records in conditions, operations and history."""
    return datetime.fromtimestamp(math.floor(seconds), UTC)

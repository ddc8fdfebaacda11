"""How many judge calls a batch keeps in flight: additive increase, multiplicative decrease.

Why adaptive: a fixed concurrency is either too low for a warm pool (the step waits on the client)
or too high for a cold or shrinking one (the burst that overwhelms a reward model, THUDM/slime#1582).
The pool says when it has too much (``429``, or an overload refusal: the activator's full hold
queue, a gateway's connection limit); answers that come back fast and whole say it can take more.
So the window grows by about one call per window's worth of fast answers (TCP's congestion
avoidance), halves on an overload signal at most once per ``cooldown_s`` (one refused burst is one
signal, not one per refused call), and holds on slow answers and other failures (a draining replica
or a crash says nothing about load). Pure: :func:`next_window` maps a state and a signal to the next
state; the batch runner (`genrm_client.aio`) applies it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Signal(enum.Enum):
    FAST = "fast"
    """A verdict, within ``slow_s``."""
    SLOW = "slow"
    """A verdict, but slower than ``slow_s``: the pool is at its capacity; hold."""
    OVERLOAD = "overload"
    """A ``429`` or an overload refusal."""
    FAILED = "failed"
    """Any other failure: says nothing about load; hold."""


@dataclass(frozen=True)
class WindowLaw:
    initial: int = 32
    minimum: int = 1
    maximum: int = 1024
    increase: float = 1.0
    """Calls added per window's worth of fast answers."""
    decrease: float = 0.5
    """The factor an overload signal multiplies the window by."""
    slow_s: float = 60.0
    """An answer slower than this does not grow the window."""
    cooldown_s: float = 1.0
    """After a decrease, overload signals are ignored this long (they belong to the same burst)."""

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.initial <= self.maximum:
            raise ValueError("the window law needs 1 <= minimum <= initial <= maximum")
        if not 0 < self.decrease < 1 or self.increase <= 0:
            raise ValueError("the window law needs 0 < decrease < 1 and increase > 0")


@dataclass(frozen=True)
class WindowState:
    size: float
    calm_until: float = -math.inf
    """Overload signals before this time change nothing (the last decrease already answered them)."""

    @property
    def slots(self) -> int:
        """Calls allowed in flight."""
        return max(1, int(self.size))


def signal_of(ok: bool, overloaded: bool, latency_s: float, law: WindowLaw) -> Signal:
    """The signal one call's outcome gives the window."""
    if overloaded:
        return Signal.OVERLOAD
    if not ok:
        return Signal.FAILED
    return Signal.FAST if latency_s <= law.slow_s else Signal.SLOW


def next_window(state: WindowState, signal: Signal, now: float, law: WindowLaw) -> WindowState:
    """The window after ``signal`` at time ``now`` (any monotonic clock)."""
    if signal is Signal.OVERLOAD:
        if now < state.calm_until:
            return state
        return WindowState(max(float(law.minimum), state.size * law.decrease), now + law.cooldown_s)
    if signal is Signal.FAST:
        return WindowState(min(float(law.maximum), state.size + law.increase / state.size), state.calm_until)
    return state

"""The in-flight window's law: additive increase on fast verdicts, halving on overload, once per burst."""

from __future__ import annotations

import pytest
from genrm_client.window import Signal, WindowLaw, WindowState, next_window, signal_of

LAW = WindowLaw(initial=8, minimum=1, maximum=64, slow_s=5.0, cooldown_s=1.0)


def test_a_window_of_fast_verdicts_adds_about_one_slot() -> None:
    state = WindowState(8.0)
    for _ in range(8):
        state = next_window(state, Signal.FAST, 0.0, LAW)
    assert state.slots == 8 and 8.9 < state.size < 9.0
    for _ in range(10):
        state = next_window(state, Signal.FAST, 0.0, LAW)
    assert state.slots == 10


def test_overload_halves_the_window_once_per_burst() -> None:
    state = next_window(WindowState(40.0), Signal.OVERLOAD, 10.0, LAW)
    assert state.size == 20.0
    assert next_window(state, Signal.OVERLOAD, 10.5, LAW) == state, "the same burst's other refusals"
    assert next_window(state, Signal.OVERLOAD, 11.0, LAW).size == 10.0


def test_slow_verdicts_and_other_failures_hold_the_window() -> None:
    state = WindowState(12.0)
    assert next_window(state, Signal.SLOW, 0.0, LAW) == state
    assert next_window(state, Signal.FAILED, 0.0, LAW) == state


def test_the_window_stays_within_its_bounds() -> None:
    state = WindowState(1.5)
    for now in range(10):
        state = next_window(state, Signal.OVERLOAD, float(now * 2), LAW)
    assert state.size == 1.0 and state.slots == 1
    state = WindowState(64.0)
    assert next_window(state, Signal.FAST, 0.0, LAW).size == 64.0


def test_the_signal_of_a_call() -> None:
    assert signal_of(True, False, 0.1, LAW) is Signal.FAST
    assert signal_of(True, False, 9.0, LAW) is Signal.SLOW
    assert signal_of(False, True, 0.0, LAW) is Signal.OVERLOAD
    assert signal_of(False, False, 0.0, LAW) is Signal.FAILED


def test_a_law_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError):
        WindowLaw(initial=0)
    with pytest.raises(ValueError):
        WindowLaw(decrease=1.0)

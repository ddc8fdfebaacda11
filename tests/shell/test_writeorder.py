"""Decisions first (`shell.writeorder`): a recording write waits for the gating writes of every pool,
a little longer for the ones still coming, and never long."""

from __future__ import annotations

import asyncio
import time

from genrm_operator.shell.writeorder import WriteOrder


async def test_a_recording_write_goes_at_once_when_no_decision_is_being_written() -> None:
    order = WriteOrder(quiet_seconds=0.2, hold_seconds=2.0)
    started = time.monotonic()
    await order.recording()
    assert time.monotonic() - started < 0.05


async def test_a_recording_write_waits_for_the_decisions_in_flight_and_a_quiet_gap_after_them() -> None:
    order = WriteOrder(quiet_seconds=0.2, hold_seconds=5.0)
    done: dict[str, float] = {}

    async def decision(name: str, seconds: float) -> None:
        async with order.gating():
            await asyncio.sleep(seconds)
        done[name] = time.monotonic()

    async def record() -> None:
        await asyncio.sleep(0.05)  # the decisions are in flight
        await order.recording()
        done["record"] = time.monotonic()

    await asyncio.gather(decision("a", 0.3), decision("b", 0.5), record())
    assert done["a"] < done["b"] < done["record"]
    assert 0.15 < done["record"] - done["b"] < 0.6, "the quiet gap after the last decision, not much more"


async def test_a_storm_that_does_not_end_holds_a_record_back_no_longer_than_the_hold() -> None:
    order = WriteOrder(quiet_seconds=0.2, hold_seconds=0.5)

    async def endless_decisions() -> None:
        while True:
            async with order.gating():
                await asyncio.sleep(0.05)

    storm = asyncio.create_task(endless_decisions())
    try:
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await order.recording()
        assert 0.45 < time.monotonic() - started < 1.0
    finally:
        storm.cancel()

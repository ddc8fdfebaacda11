"""The contract's drain state machine, the one the gateway, the hollow replicas and the core tests'
world all run: its transitions as pure functions of the state, the call and the idle fact."""

from __future__ import annotations

import pytest
from genrm_contract.drain import DrainConflict, DrainMachine
from genrm_contract.sidecar import DrainPhase, DrainReason, DrainState

SERVING, SOFT, FENCED, DRAINED = DrainState.SERVING, DrainState.SOFT_DRAIN, DrainState.FENCED, DrainState.DRAINED


def machine() -> DrainMachine:
    return DrainMachine(quiet_seconds=2.0, propagation_seconds=5.0)


def test_soft_then_fence_then_drained_after_the_quiet_period() -> None:
    m = machine().drain("d", DrainPhase.SOFT, None, now=10.0, idle_since=None)
    assert (m.state, m.drain_id, m.admitting) == (SOFT, "d", True)
    m = m.drain("d", DrainPhase.FENCE, None, now=15.0, idle_since=None)
    assert (m.state, m.fenced_at, m.admitting) == (FENCED, 15.0, False)
    assert m.at(100.0, None).state is FENCED  # busy: never drained
    assert m.next_change(16.0) == 18.0
    assert m.at(17.9, 16.0).state is FENCED
    assert m.at(18.0, 16.0).state is DRAINED


def test_a_fence_while_serving_soft_drains_for_the_propagation_window_first() -> None:
    m = machine().drain("d", DrainPhase.FENCE, None, now=10.0, idle_since=0.0)
    assert (m.state, m.fence_at, m.admitting) == (SOFT, 15.0, True)
    assert m.next_change(0.0) == 15.0
    # A repeated fence does not rush it.
    assert m.drain("d", DrainPhase.FENCE, None, now=12.0, idle_since=0.0).state is SOFT
    assert m.at(14.9, None).state is SOFT
    fenced = m.at(15.0, None)
    assert (fenced.state, fenced.fenced_at, fenced.fence_at) == (FENCED, 15.0, None)
    # Idle long before the fence came due: Drained as soon as it does.
    assert m.at(15.0, 0.0).state is DRAINED


def test_a_fence_of_an_idle_soft_drained_replica_is_drained_at_once() -> None:
    m = machine().drain("d", DrainPhase.SOFT, None, now=10.0, idle_since=1.0)
    assert m.drain("d", DrainPhase.FENCE, None, now=16.0, idle_since=1.0).state is DRAINED


def test_drain_ids_are_idempotent_and_exclusive() -> None:
    m = machine().drain("d", DrainPhase.SOFT, 0.5, now=1.0, idle_since=None)
    assert m.quiet_seconds == 0.5
    assert m.drain("d", DrainPhase.SOFT, None, now=2.0, idle_since=None) == m
    with pytest.raises(DrainConflict):
        m.drain("other", DrainPhase.FENCE, None, now=2.0, idle_since=None)
    with pytest.raises(DrainConflict):
        m.undrain("other", now=2.0, idle_since=None)


def test_undrain_returns_to_serving_until_drained() -> None:
    m = machine().drain("d", DrainPhase.FENCE, None, now=0.0, idle_since=None).at(6.0, None)
    assert m.state is FENCED
    back = m.undrain("d", now=7.0, idle_since=None)
    assert (back.state, back.drain_id, back.fence_at, back.fenced_at, back.admitting) == (SERVING, None, None, None,
                                                                                        True)
    assert back.undrain("anything", now=8.0, idle_since=None) == back  # already serving: nothing to do
    drained = m.at(9.0, 6.0)
    assert drained.state is DRAINED
    with pytest.raises(DrainConflict):
        drained.undrain("d", now=9.0, idle_since=6.0)
    assert drained.drain("d", DrainPhase.SOFT, None, now=9.0, idle_since=6.0).state is DRAINED  # final


def test_a_judge_switch_fences_at_once_and_holds_the_fence_until_a_plain_call_of_its_drain_releases_it() -> None:
    switched = DrainReason.JUDGE_SWITCHED
    m = machine().drain("d", DrainPhase.FENCE, None, now=10.0, idle_since=0.0, reason=switched, active_revision="b2")
    assert (m.state, m.fenced_at, m.fence_at, m.reason, m.held, m.admitting) == (FENCED, 10.0, None, switched, True,
                                                                                  False)
    # Held: idle for ever, never Drained by itself, so a rollback can still undrain it.
    assert m.at(1000.0, 0.0).state is FENCED and m.next_change(0.0) is None
    back = m.undrain("d", now=20.0, idle_since=0.0)
    assert (back.state, back.reason, back.active_revision, back.held) == (SERVING, None, None, False)
    # Retiring it: a call of the drain that names no reason releases the hold (the reason stays, for the
    # refusals' wording), and the quiet period applies.
    released = m.drain("d", DrainPhase.FENCE, None, now=30.0, idle_since=0.0)
    assert (released.state, released.reason, released.active_revision, released.held) == (DRAINED, switched, "b2",
                                                                                           False)
    busy = m.drain("d", DrainPhase.FENCE, None, now=30.0, idle_since=None)
    assert (busy.state, busy.held, busy.at(31.0, 30.0).state, busy.at(32.0, 30.0).state) == (FENCED, False, FENCED,
                                                                                             DRAINED)


def test_a_soft_drained_replica_fenced_for_a_judge_switch_stops_admitting_at_once() -> None:
    m = machine().drain("d", DrainPhase.SOFT, None, now=10.0, idle_since=None)
    m = m.drain("d", DrainPhase.FENCE, None, now=11.0, idle_since=None, reason=DrainReason.JUDGE_SWITCHED)
    assert (m.state, m.admitting, m.reason, m.held) == (FENCED, False, DrainReason.JUDGE_SWITCHED, True)


def test_a_reason_lands_with_any_call_of_its_drain_and_stays_until_undrained() -> None:
    """Why a drain was asked for (a judge switch) is set by the call that names it, soft or fence, first
    or later, and kept by the drain's other calls (retries and later phases name none); a call of
    another drain changes nothing, Drained keeps it, and an undrain clears it."""
    switched = DrainReason.JUDGE_SWITCHED
    m = machine().drain("d", DrainPhase.SOFT, None, now=1.0, idle_since=None)
    assert (m.reason, m.active_revision) == (None, None)
    soft = m.drain("d", DrainPhase.SOFT, None, now=2.0, idle_since=None, reason=switched, active_revision="b2")
    assert (soft.state, soft.reason, soft.active_revision, soft.held) == (SOFT, switched, "b2", False)
    fenced = soft.drain("d", DrainPhase.FENCE, None, now=2.0, idle_since=None, reason=switched, active_revision="b2")
    assert (fenced.state, fenced.reason, fenced.active_revision) == (FENCED, switched, "b2")
    assert fenced.drain("d", DrainPhase.FENCE, None, now=3.0, idle_since=None, reason=switched,
                        active_revision="b2") == fenced
    with pytest.raises(DrainConflict):
        fenced.drain("other", DrainPhase.FENCE, None, now=3.0, idle_since=None, reason=switched, active_revision="c3")
    released = fenced.drain("d", DrainPhase.FENCE, None, now=3.0, idle_since=None)
    drained = released.at(9.0, 4.0)
    assert (drained.state, drained.reason, drained.active_revision) == (DRAINED, switched, "b2")
    back = fenced.undrain("d", now=4.0, idle_since=None)
    assert (back.state, back.reason, back.active_revision) == (SERVING, None, None)

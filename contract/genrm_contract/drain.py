"""The drain state machine the operator drives: Serving → SoftDrain → Fenced → Drained.

Why this shape: soft drain keeps admitting while endpoints stop routing to the pod (the
propagation window), the fence refuses stragglers before any engine work with a retryable 503,
and Drained is only declared once the exact in-flight count is zero and the engine itself has
been idle for a quiet period, the proof the operator needs before deleting the pod. Every call
carries a drain id so retries are idempotent and a stale caller cannot cancel someone else's drain.

Why pure and here: the gateway serves it (``genrm_gateway.drain``), the hollow replicas of the
local cluster (``genrm_cluster.hollow``) and the core tests' simulated sidecars
(``tests/core/world.py``) imitate it. Each keeps its own clock and its own idle fact and calls
these transitions, so all three drain alike, and a change to the protocol is made once. The
machine is a frozen value: every transition returns the next one, nothing here reads a clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from genrm_contract.sidecar import PROPAGATION_SECONDS, QUIET_SECONDS, DrainPhase, DrainReason, DrainState

ADMITTING = frozenset({DrainState.SERVING, DrainState.SOFT_DRAIN})
"""States in which new requests are admitted (fenced and drained replicas refuse them)."""


class DrainConflict(Exception):
    """The call names another drain than the one in progress, or undrains a drained replica (HTTP 409)."""


@dataclass(frozen=True)
class DrainMachine:
    """One replica's drain: its state and what the transitions need to remember.

    Times are the caller's monotonic clock; ``idle_since`` (a transition's fact) is when the
    replica last became idle: nothing in flight and the engine idle or of unknown load; None while
    it is busy."""

    state: DrainState = DrainState.SERVING
    drain_id: str | None = None
    quiet_seconds: float = QUIET_SECONDS
    """Fenced and idle this long is Drained (a drain call may set it)."""
    propagation_seconds: float = PROPAGATION_SECONDS
    """How long a fence asked for while Serving soft-drains first."""
    fence_at: float | None = None
    """When the deferred fence of such a call comes due (None: no fence is pending)."""
    fenced_at: float | None = None
    """When the replica fenced (for a deferred fence, the time it came due)."""
    reason: DrainReason | None = None
    """Why the drain in progress was asked for, when a call of it said (``DrainRequest.reason``)."""
    active_revision: str | None = None
    """The judge revision serving the pool now, told with a ``judgeSwitched`` reason."""
    held: bool = False
    """A judge switch's fence: at once (the pool's Service already moved to the new revision, so a
    retry lands there, and one more answer from the old judge would mix two in a phase) and held,
    never Drained by itself, while a rollback may still undrain it. A later call of the drain that
    names no reason releases it (the reason stays, for the refusals' wording)."""

    def at(self, now: float, idle_since: float | None) -> DrainMachine:
        """Time passed: a deferred fence comes due, and Fenced turns into Drained (for good) once
        the replica has been idle for the quiet period."""
        machine = self
        if machine.state is DrainState.SOFT_DRAIN and machine.fence_at is not None and now >= machine.fence_at:
            machine = dataclasses.replace(machine, state=DrainState.FENCED, fenced_at=machine.fence_at, fence_at=None)
        if machine.state is DrainState.FENCED and not machine.held and idle_since is not None \
                and now - idle_since >= machine.quiet_seconds:
            machine = dataclasses.replace(machine, state=DrainState.DRAINED)
        return machine

    def drain(self, drain_id: str, phase: DrainPhase, quiet_seconds: float | None, now: float,
              idle_since: float | None, reason: DrainReason | None = None,
              active_revision: str | None = None) -> DrainMachine:
        """A drain call (``POST /v1/drain``); raises :class:`DrainConflict` for another drain id.

        A call that names a ``reason`` sets it and ``active_revision``; one that names none leaves
        them: the calls of one drain id are retries and later phases of one drain. A fence naming
        ``judgeSwitched`` fences at once and holds (`held`); a call naming none releases the hold."""
        machine = self.at(now, idle_since)
        if machine.state is not DrainState.SERVING and drain_id != machine.drain_id:
            raise DrainConflict(f"already draining under drain id {machine.drain_id!r}")
        state, fence_at, fenced_at = machine.state, machine.fence_at, machine.fenced_at
        held = reason is DrainReason.JUDGE_SWITCHED and phase is DrainPhase.FENCE
        if held and state in ADMITTING:
            state, fence_at, fenced_at = DrainState.FENCED, None, now
        elif phase is DrainPhase.FENCE and state is DrainState.SERVING:
            # A fence with no soft drain before it (a crashed replica being retired): clients on
            # kept-alive connections are sent elsewhere first, for the propagation window, as a
            # soft drain would; the fence follows by itself.
            state, fence_at = DrainState.SOFT_DRAIN, now + machine.propagation_seconds
        elif phase is DrainPhase.FENCE and state is DrainState.SOFT_DRAIN and fence_at is None:
            state, fenced_at = DrainState.FENCED, now
        elif phase is DrainPhase.SOFT and state is DrainState.SERVING:
            state = DrainState.SOFT_DRAIN
        quiet = machine.quiet_seconds if quiet_seconds is None else quiet_seconds
        if reason is None:
            reason, active_revision = machine.reason, machine.active_revision
        # Fenced by this call, a replica idle long enough is Drained at once.
        return dataclasses.replace(machine, state=state, drain_id=drain_id, quiet_seconds=quiet, fence_at=fence_at,
                                   fenced_at=fenced_at, reason=reason, active_revision=active_revision,
                                   held=held and state is DrainState.FENCED).at(now, idle_since)

    def undrain(self, drain_id: str, now: float, idle_since: float | None) -> DrainMachine:
        """An undrain call (``POST /v1/undrain``): back to Serving; raises :class:`DrainConflict`
        once Drained or for another drain id."""
        machine = self.at(now, idle_since)
        if machine.state is DrainState.SERVING:
            return machine
        if machine.state is DrainState.DRAINED:
            raise DrainConflict("the replica is drained; it cannot serve again")
        if drain_id != machine.drain_id:
            raise DrainConflict(f"the drain in progress has drain id {machine.drain_id!r}")
        return dataclasses.replace(machine, state=DrainState.SERVING, drain_id=None, fence_at=None, fenced_at=None,
                                   reason=None, active_revision=None, held=False)

    def next_change(self, idle_since: float | None) -> float | None:
        """When the state next changes with time alone (a deferred fence, Drained), or None."""
        if self.state is DrainState.SOFT_DRAIN and self.fence_at is not None:
            return self.fence_at
        if self.state is DrainState.FENCED and not self.held and idle_since is not None:
            return idle_since + self.quiet_seconds
        return None

    @property
    def admitting(self) -> bool:
        """Whether new requests are admitted."""
        return self.state in ADMITTING

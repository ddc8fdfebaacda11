"""The drain state machine the operator drives: Serving → SoftDrain → Fenced → Drained.

Why this shape: soft drain keeps admitting while endpoints stop routing to the pod (the
propagation window), the fence refuses stragglers before any engine work with a retryable 503,
and Drained is only declared once the exact in-flight count is zero and the engine itself has
been idle for a quiet period, the proof the operator needs before deleting the pod. Every call
carries a drain id so retries are idempotent and a stale caller cannot cancel someone else's drain.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from genrm_contract.sidecar import DrainState, Phase

from genrm_gateway.admission import Admission
from genrm_gateway.engine import EngineMonitor


class DrainConflict(Exception):
    """The request names another drain than the one in progress (HTTP 409)."""


class DrainController:
    def __init__(self, admission: Admission, engine: EngineMonitor, quiet_seconds: float,
                 propagation_seconds: float,
                 on_transition: Callable[[DrainState], None] = lambda state: None) -> None:
        self._admission = admission
        self._engine = engine
        self._state = DrainState.SERVING
        self._on_transition = on_transition
        self._fence_at: float | None = None
        self.drain_id: str | None = None
        self.quiet_seconds = quiet_seconds
        self.propagation_seconds = propagation_seconds

    @property
    def state(self) -> DrainState:
        """The current state; a deferred fence comes due, and Fenced turns into Drained (for good)
        once the quiet period held."""
        if self._state is DrainState.SOFT_DRAIN and self._fence_at is not None and time.monotonic() >= self._fence_at:
            self._fence()
        if self._state is DrainState.FENCED:
            idle = self.idle_seconds()
            if idle is not None and idle >= self.quiet_seconds:
                self._state = DrainState.DRAINED
        return self._state

    def idle_seconds(self) -> float | None:
        """How long in-flight has been zero and the engine idle (or of unknown load); else None."""
        gateway_idle, engine_idle = self._admission.idle_since, self._engine.idle_since
        if gateway_idle is None or engine_idle is None:
            return None
        return time.monotonic() - max(gateway_idle, engine_idle)

    def drain(self, drain_id: str, phase: Phase, quiet_seconds: float | None = None) -> None:
        state = self.state
        if state is not DrainState.SERVING and drain_id != self.drain_id:
            raise DrainConflict(f"already draining under drain id {self.drain_id!r}")
        if quiet_seconds is not None:
            self.quiet_seconds = quiet_seconds
        self.drain_id = drain_id
        if phase is Phase.FENCE and state is DrainState.SERVING:
            # A fence with no soft drain before it (a crashed replica being retired): clients on
            # kept-alive connections are sent elsewhere first, for the propagation window, as a
            # soft drain would; the fence follows by itself.
            self._fence_at = time.monotonic() + self.propagation_seconds
            self._enter(DrainState.SOFT_DRAIN)
        elif phase is Phase.FENCE and state is DrainState.SOFT_DRAIN and self._fence_at is None:
            self._fence()
        elif phase is Phase.SOFT and state is DrainState.SERVING:
            self._enter(DrainState.SOFT_DRAIN)

    def _fence(self) -> None:
        self._fence_at = None
        self._admission.open = False
        self._enter(DrainState.FENCED)

    def undrain(self, drain_id: str) -> None:
        state = self.state
        if state is DrainState.SERVING:
            return
        if state is DrainState.DRAINED:
            raise DrainConflict("the replica is drained; it cannot serve again")
        if drain_id != self.drain_id:
            raise DrainConflict(f"the drain in progress has drain id {self.drain_id!r}")
        self._admission.open = True
        self.drain_id = None
        self._fence_at = None
        self._enter(DrainState.SERVING)

    def _enter(self, state: DrainState) -> None:
        """Change state; the listener (the connection registry) acts on it before any await."""
        self._state = state
        self._on_transition(state)

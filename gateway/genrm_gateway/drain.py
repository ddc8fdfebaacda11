"""The gateway's drain: the contract's state machine (``genrm_contract.drain``) driven by this
process's clock, in-flight count and engine load.

Why a wrapper: the transitions are the contract's, shared with the hollow replicas and the core
tests' world; what is the gateway's own is acting on them (a fence closes admission, every entered
state but Drained tells the connection registry) and where its idle fact comes from.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from genrm_contract.drain import DrainConflict as DrainConflict
from genrm_contract.drain import DrainMachine
from genrm_contract.sidecar import DrainPhase, DrainReason, DrainState

from genrm_gateway.admission import Admission
from genrm_gateway.engine import EngineMonitor


class DrainController:
    def __init__(self, admission: Admission, engine: EngineMonitor, quiet_seconds: float,
                 propagation_seconds: float,
                 on_transition: Callable[[DrainState], None] = lambda state: None) -> None:
        self._admission = admission
        self._engine = engine
        self._on_transition = on_transition
        self._machine = DrainMachine(quiet_seconds=quiet_seconds, propagation_seconds=propagation_seconds)

    @property
    def state(self) -> DrainState:
        """The current state; a deferred fence comes due, and Fenced turns into Drained (for good)
        once the quiet period held."""
        self._become(self._machine.at(time.monotonic(), self._idle_since()))
        return self._machine.state

    @property
    def drain_id(self) -> str | None:
        return self._machine.drain_id

    @property
    def reason(self) -> DrainReason | None:
        """Why the drain in progress was asked for, if the operator said (None while Serving)."""
        return self._machine.reason

    @property
    def active_revision(self) -> str | None:
        """The pool's judge revision now, told with a ``judgeSwitched`` reason."""
        return self._machine.active_revision

    @property
    def quiet_seconds(self) -> float:
        return self._machine.quiet_seconds

    @property
    def propagation_seconds(self) -> float:
        return self._machine.propagation_seconds

    def _idle_since(self) -> float | None:
        """Since when in-flight has been zero and the engine idle (or of unknown load); else None."""
        gateway_idle, engine_idle = self._admission.idle_since, self._engine.idle_since
        if gateway_idle is None or engine_idle is None:
            return None
        return max(gateway_idle, engine_idle)

    def idle_seconds(self) -> float | None:
        """How long in-flight has been zero and the engine idle (or of unknown load); else None."""
        idle_since = self._idle_since()
        return None if idle_since is None else time.monotonic() - idle_since

    def drain(self, drain_id: str, phase: DrainPhase, quiet_seconds: float | None = None,
              reason: DrainReason | None = None, active_revision: str | None = None) -> None:
        """Raises DrainConflict for another drain id than the one in progress."""
        self._become(self._machine.drain(drain_id, phase, quiet_seconds, time.monotonic(), self._idle_since(),
                                         reason, active_revision))

    def undrain(self, drain_id: str) -> None:
        """Raises DrainConflict once Drained or for another drain id."""
        self._become(self._machine.undrain(drain_id, time.monotonic(), self._idle_since()))

    def _become(self, machine: DrainMachine) -> None:
        """Take the machine's next value and act on its transition: a fence closes admission, an
        undrain opens it; the listener (the connection registry) acts on every entered state but
        Drained before any await."""
        before, self._machine = self._machine.state, machine
        after = machine.state
        if after is before:
            return
        if after is DrainState.SERVING:
            self._admission.open = True
            self._on_transition(DrainState.SERVING)
            return
        if before is DrainState.SERVING:
            self._on_transition(DrainState.SOFT_DRAIN)  # every drain soft-drains first
        if after in (DrainState.FENCED, DrainState.DRAINED) and before is not DrainState.FENCED:
            self._admission.open = False
            self._on_transition(DrainState.FENCED)

"""uvicorn with the sidecar's SIGTERM policy: close admission in order, then exit at zero in-flight.

Why: the kubelet sends SIGTERM after the preStop hook, or alone (e.g. a hook that failed, a
kubectl delete with a short grace period). Either way the process must not exit while admitted
requests are still being answered; it soft-drains (unless already draining), waits the
propagation window, fences, and exits once in-flight reaches zero. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import sys
from types import FrameType
from typing import Any

import uvicorn
from genrm_contract.sidecar import DrainPhase, DrainState

from genrm_gateway.app import Gateway

SIGTERM_DRAIN_ID = "sigterm"


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self._gateway = gateway
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None:
            self.force_exit = self.should_exit = True
            return
        self._draining = True
        print(f"genrm-gateway: signal {sig}: draining before exit", file=sys.stderr, flush=True)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        task = asyncio.ensure_future(self._drain_then_exit())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain_then_exit(self) -> None:
        drain = self._gateway.drain
        if drain.state is DrainState.SERVING:
            drain.drain(SIGTERM_DRAIN_ID, DrainPhase.SOFT)
            await asyncio.sleep(self._gateway.config.propagation_seconds)
        if drain.state in (DrainState.SERVING, DrainState.SOFT_DRAIN):  # also if undrained meanwhile
            drain.drain(drain.drain_id or SIGTERM_DRAIN_ID, DrainPhase.FENCE)
        await self._gateway.admission.wait_idle()
        self.should_exit = True

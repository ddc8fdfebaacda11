"""The sidecar's SIGTERM policy (`stopping.StoppingServer`): close admission in order, then exit at
zero in-flight.

Why: the kubelet sends SIGTERM after the preStop hook, or alone (e.g. a hook that failed, a
kubectl delete with a short grace period). Either way the process must not exit while admitted
requests are still being answered; it soft-drains (unless already draining), waits the
propagation window, fences, and exits once in-flight reaches zero. A second signal exits at once.
"""

from __future__ import annotations

import asyncio

import uvicorn
from genrm_contract.sidecar import DrainPhase, DrainState

from genrm_gateway.app import Gateway
from genrm_gateway.stopping import StoppingServer

SIGTERM_DRAIN_ID = "sigterm"


class GatewayServer(StoppingServer):
    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config, "genrm-gateway")
        self._gateway = gateway

    async def stop(self) -> None:
        drain = self._gateway.drain
        if drain.state is DrainState.SERVING:
            drain.drain(SIGTERM_DRAIN_ID, DrainPhase.SOFT)
            await asyncio.sleep(self._gateway.config.propagation_seconds)
        if drain.state in (DrainState.SERVING, DrainState.SOFT_DRAIN):  # also if undrained meanwhile
            drain.drain(drain.drain_id or SIGTERM_DRAIN_ID, DrainPhase.FENCE)
        await self._gateway.admission.wait_idle()

"""The gateway's ASGI application: the lean proxied path beside the FastAPI control app.

Why a hand-written dispatcher: one dict lookup sends judge traffic to the raw ASGI proxy; all
other paths (probes, control API, metrics, and every refusal of unknown or admin routes) go to
FastAPI. The lifespan starts the engine pool and monitor that both halves share.
"""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.config import GatewayConfig
from genrm_gateway.control import create_control_app
from genrm_gateway.drain import DrainController
from genrm_gateway.engine import EngineMonitor
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.proxy import Proxy
from genrm_gateway.routes import PROXIED
from genrm_gateway.upstream import EnginePool


class Gateway:
    """The sidecar's ASGI app; its parts are attributes so the server's SIGTERM drain can reach them."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.admission = Admission()
        self.pool = EnginePool(config.engine)
        self.engine = EngineMonitor(self.pool, config.engine_poll_seconds)
        self.drain = DrainController(self.admission, self.engine, config.quiet_seconds)
        self.metrics = GatewayMetrics(self.admission, self.drain, self.engine)
        self._proxy = Proxy(self.admission, self.drain, self.pool, self.metrics, config.max_body_bytes)
        self._control = create_control_app(self.admission, self.drain, self.engine, self.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = PROXIED.get(scope["path"])
            if route is not None:
                await self._proxy.handle(route, scope, receive, send)
                return
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self._control(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.engine.poll()
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.stop()
                self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

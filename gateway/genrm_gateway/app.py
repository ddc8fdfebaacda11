"""The gateway's ASGI application: judge traffic on one port, control on another.

Why two ports: the traffic port is what the Service (and so every judge client) reaches; it
serves only the allowlisted engine routes through the lean proxy and refuses everything else
itself, without a framework, documents or redirects. Probes, the drain API and ``/metrics`` live on
the control port, which the kubelet, the operator and Prometheus use, so a client of the judge
can never reach them (and no judge request competes with a drain call). The judge routes are on the
control port too, under ``PROBE_PREFIX`` and the control token, for the operator's verification
probes: so the operator needs no pool's API key, which the traffic port demands when there is one.
"""

from __future__ import annotations

import asyncio
import contextlib

from genrm_contract.demand import DEMAND_PATH
from genrm_contract.sidecar import PROBE_PREFIX, DrainState, HandBack, RefusalReason
from starlette.types import Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.apikey import ClientAuth
from genrm_gateway.config import GatewayConfig
from genrm_gateway.connection import Connections, GatewayProtocol, protocol_class
from genrm_gateway.control import authenticate, create_control_app
from genrm_gateway.demand import DemandBoard
from genrm_gateway.drain import DrainController
from genrm_gateway.engine import EngineMonitor
from genrm_gateway.errors import CLOSE_HEADER, Refusal, send_error
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.peers import LOOP, Peers, pool_token
from genrm_gateway.proxy import Proxy
from genrm_gateway.revisions import Revisions
from genrm_gateway.routes import BLOCKED_ENGINE_PATHS, GATEWAY_PATHS, PROXIED
from genrm_gateway.upstream import EnginePool

# While a drain runs, connections that have turned idle are looked at this often.
_RETIRE_EVERY_SECONDS = 0.2


class Gateway:
    """The sidecar's ASGI app; its parts are attributes so the server's SIGTERM drain can reach them."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.admission = Admission()
        self.pool = EnginePool(config.engine, config.engine_api_key)
        self._auth = None if config.engine_api_key is None else ClientAuth(config.engine_api_key)
        self.engine = EngineMonitor(self.pool, config.engine_poll_seconds)
        self.connections = Connections(config.port, config.limits, self._refused, self._handed_back)
        self.drain = DrainController(self.admission, self.engine, config.quiet_seconds, config.propagation_seconds,
                                     self.connections.retire)
        self.metrics = GatewayMetrics(self.admission, self.drain, self.engine, self.connections)
        self.peers = Peers(config.peers_valid_seconds, config.loopback_peers)
        self.revisions = Revisions(config.judge_revision)
        self._proxy = Proxy(self.admission, self.drain, self.engine, self.pool, self.metrics, config.limits,
                            self.peers, self.revisions)
        self.demand = DemandBoard()
        self._control = create_control_app(self.admission, self.drain, self.engine, self.metrics, self.connections,
                                           self.demand, self.peers, self.revisions)
        self._retirer: asyncio.Task[None] | None = None

    @property
    def protocol(self) -> type[GatewayProtocol]:
        """The uvicorn protocol class for this gateway's sockets."""
        return protocol_class(self.connections)

    def _refused(self, reason: RefusalReason) -> None:
        self.metrics.refused(reason)

    def _handed_back(self, reason: HandBack) -> None:
        self.metrics.handed_back(reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["server"][1] == self.config.control_port:
            if scope["type"] == "http" and scope["path"].startswith(PROBE_PREFIX + "/"):
                await self._probe(scope, receive, send)
            else:
                await self._control(scope, receive, send)
        elif scope["type"] == "http":
            await self._traffic(scope, receive, send)

    async def _traffic(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        route = PROXIED.get(path)
        refusal = None if self._auth is None else self._auth.refusal(scope)
        if refusal is not None and not (route is not None and _from_peer(scope)):
            self.metrics.refused(refusal.reason)
            if route is not None:
                self.metrics.observe(route.name, refusal.code, 0.0)
            await send_error(send, refusal.code, refusal.reason, str(refusal), refusal.headers)
            return
        if route is not None:
            await self._proxy.handle(route, scope, receive, send)
            return
        if path in GATEWAY_PATHS:
            try:
                if path == DEMAND_PATH:
                    await self.demand.receive(scope, receive, send)
                else:
                    await self.revisions.answer(scope, send)
            except Refusal as refused:
                self.metrics.refused(refused.reason)
                await send_error(send, refused.code, refused.reason, str(refused), refused.headers)
            return
        if path in BLOCKED_ENGINE_PATHS:
            code, reason = 403, RefusalReason.NOT_ALLOWED
            message = "this engine route is not reachable through the gateway"
        else:
            code, reason, message = 404, RefusalReason.NOT_FOUND, "no such route"
        self.metrics.refused(reason)
        await send_error(send, code, reason, message)

    async def _probe(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A judge route on the control port: the control token instead of a client's key, then
        the same proxy as the traffic port (admission, request ids, limits, the engine's key), but
        never a peer: a verification must compare this replica's own answers.
        Its body is the proxy's to bound (a probe prompt may be 64 KiB), not the control API's."""
        try:
            authenticate(scope)
            self.peers.contact()
            route = PROXIED.get(scope["path"][len(PROBE_PREFIX):])
            if route is None:
                raise Refusal(404, RefusalReason.NOT_FOUND, "no such judge route")
        except Refusal as refusal:
            self.metrics.refused(refusal.reason)
            await send_error(send, refusal.code, refusal.reason, str(refusal), (*refusal.headers, CLOSE_HEADER))
            return
        await self._proxy.handle(route, scope, receive, send, probe=True)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.engine.poll()
                self.engine.start()
                self._retirer = asyncio.ensure_future(self._retire_idle())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._retirer is not None:
                    self._retirer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._retirer
                await self.engine.stop()
                self.pool.close()
                self.peers.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _retire_idle(self) -> None:
        """During a drain, or while the engine is unreachable and no peer can answer for it, keep
        closing keep-alive connections as they turn idle: a client's next request then opens a new
        connection, which the Service sends to a replica that can answer, instead of meeting a
        refusal on a kept-alive one.

        While peers answer for a dead engine, the connections stay: this replica's requests are
        served through them, and a new connection could find the Service empty (the crashed replica
        was its last ready endpoint, and the replica the operator puts back is not listed yet)."""
        while True:
            await asyncio.sleep(_RETIRE_EVERY_SECONDS)
            state = self.drain.state
            if state is not DrainState.SERVING:
                self.connections.retire(state)
            elif not self.engine.up and not self.peers.known:
                self.connections.retire(DrainState.FENCED)


def _from_peer(scope: Scope) -> bool:
    """Whether a judge request comes from one of the pool's gateways (the pool's loop tag): on a
    key-protected pool it stands in for the key, which a forward never carries (the sending gateway
    checked its own client's). Looked at only when the key is missing or wrong."""
    return any(name == LOOP and pool_token(value) is not None for name, value in scope["headers"])

"""The activator: where a pool's Service points while the pool has no serving replica.

A request arrives, is told apart by its ``Host`` (the pool's ClusterIP or DNS name, as the operator
pushed in the pool's :class:`~genrm_contract.activator.PoolRoute`), and is held until the route
names a serving replica; the held count is in the state document the operator follows, so the
operator wakes the pool at once. The request is then forwarded to a replica's gateway (admission,
request ids and limits stay the gateway's job) and its answer streamed back with ``Connection:
close``, so the client's next request opens a new connection, which the Service sends straight to
a replica once the operator has taken the activator out of it: the activator is a hop only for the
requests that arrived at zero.

Stopping (SIGTERM, `ActivatorServer`) loses nothing: it goes on taking traffic for the propagation
window, while the pools' Services may still send clients here (the operator takes a terminating
activator out of the pools' slices, then kube-proxy follows), then stops taking it and exits once
it holds nothing: the operator still follows a terminating activator, so its held requests go to
the first replica that serves as always. Every answer given while stopping closes its connection,
so no client keeps one to a process about to go. The kubelet kills the pod at its grace period,
which a cold start (up to the hold timeout) can outlast, so stopping has a deadline
(``--stop-deadline-seconds``, the grace period less a margin): what is still held then is answered
``503 draining`` with ``Retry-After`` (nothing was sent to a replica, so a retry never judges twice)
and no forward starts after it; the margin is what the forwards started before it have to finish. A
killed activator (SIGKILL) loses what it held: the kernel closes those connections, so their
clients learn it at once.

Bounded like the gateway, whose connection protocol it runs on its traffic port (head, body and
connection limits, timers for every idle connection): a pool holds at most ``maxHeld`` requests
(``503 holdQueueFull`` beyond), each at most ``holdTimeoutSeconds`` (``503 holdTimeout``), both
with ``Retry-After``, and a body larger than the gateway's limit is refused before it is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
import uvicorn
from genrm_contract.activator import ROUTES_PATH, ActivatorState, PoolRoute, pool_key
from genrm_contract.demand import DEMAND_PATH, DemandHint
from genrm_contract.sidecar import (
    HELD_HEADER,
    MAX_WAIT_SECONDS,
    PROPAGATION_SECONDS,
    STATE_PATH,
    WAIT_PARAM,
    WATCH_TICK_SECONDS,
    RefusalReason,
)
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from genrm_gateway.body import bounded_body
from genrm_gateway.config import Limits
from genrm_gateway.connection import Connections, GatewayProtocol, protocol_class
from genrm_gateway.demand import DemandBoard
from genrm_gateway.errors import CLOSE_HEADER, Refusal, send_error, send_json
from genrm_gateway.stopping import StoppingServer

# Hop-by-hop fields (RFC 9110 7.6.1), never passed on either way, and the framing the forwarding
# client and the server each write themselves.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                         b"transfer-encoding", b"upgrade"})
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length"}
HELD = HELD_HEADER.encode()
_NOT_RETURNED = _HOP_BY_HOP | {b"content-length", b"date", b"server", HELD}
"""A replica's own answer headers the client does not get: the activator's server sends its own date,
and the hold time is the activator's to say."""
ROUTE_BODY_BYTES = 64 * 1024
FORWARD_TIMEOUT = httpx.Timeout(900.0, connect=5.0)
"""Connecting to a replica fails fast (another may take the request); its answer may take as long as a
long judge generation (the replica's gateway bounds the engine's own silences)."""
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
STOP_DEADLINE_SECONDS = 20.0
"""``--stop-deadline-seconds`` unless given: fits Kubernetes' default grace period (30 s), leaving 10 s
for the forwards started before the deadline (the chart passes its pods' grace period less a margin)."""


def host_key(host: str) -> str:
    """A Host value as routes are matched: lower case, no trailing dot, and a Service's DNS name cut
    after ``.svc`` (``judge.rl.svc.cluster.local:8000`` -> ``judge.rl.svc:8000``), whatever the
    cluster's domain is."""
    name, port = host.lower(), ""
    if not name.startswith("[") and name.count(":") == 1:
        name, port = name.split(":")
    name = name.rstrip(".")
    if ".svc." in name:
        name = name[:name.index(".svc.") + len(".svc")]
    return f"{name}:{port}" if port else name


@dataclass
class _Pool:
    route: PoolRoute
    held: int = 0
    demand: DemandBoard = field(default_factory=DemandBoard)
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    turn: itertools.count[int] = field(default_factory=itertools.count)


class Activator:
    """The activator's ASGI app: held traffic on one port, the operator's routes and state on another."""

    def __init__(self, port: int, control_port: int, token: str, limits: Limits,
                 stop_deadline_seconds: float) -> None:
        self.port, self.control_port = port, control_port
        self._stop_deadline_seconds = stop_deadline_seconds
        self._token = token.encode()
        self.connections = Connections(port, limits, lambda reason: None)
        self._limits = limits
        self._pools: dict[str, _Pool] = {}
        self._hosts: dict[str, str] = {}
        self._boot_id = secrets.token_hex(6)
        self._version = 0
        self._last_held: dict[str, int] = {}
        self._last_demand: dict[str, tuple[DemandHint, ...]] = {}
        self._http: httpx.AsyncClient | None = None
        self._released = asyncio.Event()
        """Set whenever a held request stops being held."""
        self._stopping = False
        """SIGTERM came: every traffic answer closes its connection."""
        self._taking = True
        """New traffic requests are taken (false once the propagation window of a stop is over)."""
        self._past_deadline = asyncio.Event()
        """The stop deadline passed: nothing is held any more and no forward starts."""
        self._exiting = asyncio.Event()
        """Nothing is held and the process exits: waiting state polls are answered now."""

    @property
    def protocol(self) -> type[GatewayProtocol]:
        return protocol_class(self.connections)

    def state(self) -> ActivatorState:
        """The held counts and hints, versioned: the version grows whenever either changes (the long
        poll's tick bounds how often that is sent)."""
        held = {key: pool.held for key, pool in self._pools.items() if pool.held}
        demand = {key: hints for key, pool in self._pools.items() if (hints := pool.demand.active())}
        if held != self._last_held or demand != self._last_demand:
            self._version += 1
        self._last_held, self._last_demand = held, demand
        return ActivatorState(held=held, demand=demand, boot_id=self._boot_id, version=self._version)

    def holding(self) -> int:
        """Requests held now, all pools together."""
        return sum(pool.held for pool in self._pools.values())

    async def nothing_held(self) -> None:
        """Return once no request is held (at once if none is)."""
        while self.holding():
            self._released.clear()
            await self._released.wait()

    def stop_soon(self) -> None:
        """SIGTERM came: close every connection after its answer, and arm the stop deadline."""
        self._stopping = True
        asyncio.get_running_loop().call_later(self._stop_deadline_seconds, self._past_deadline.set)

    def stop_taking(self) -> None:
        """The propagation window is over: a new request on a connection still open is refused
        (retryable), never held, as a new connection now is by the closed listener."""
        self._taking = False

    def exit(self) -> None:
        """Nothing is held: answer the operator's waiting state polls now, so none delays the exit."""
        self._exiting.set()

    def set_route(self, key: str, route: PoolRoute) -> None:
        """Serve ``key``'s clients by ``route`` (idempotent); held requests go as soon as it has targets."""
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(route)
        pool.route = route
        self._index_hosts()
        if route.targets:
            pool.serving.set()
        else:
            pool.serving.clear()

    def delete_route(self, key: str) -> None:
        """Forget ``key``: its held requests are refused as they wake (there is no replica to send them to)."""
        pool = self._pools.pop(key, None)
        if pool is not None:
            pool.serving.set()
        self._index_hosts()

    def _index_hosts(self) -> None:
        """Host -> pool. A Host two pools claim (a bare Service name used in two namespaces) is
        nobody's: guessing would send one pool's judge requests to another."""
        claims: dict[str, set[str]] = {}
        for key, pool in self._pools.items():
            for host in pool.route.hosts:
                claims.setdefault(host_key(host), set()).add(key)
        self._hosts = {host: next(iter(keys)) for host, keys in claims.items() if len(keys) == 1}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            if scope["server"][1] == self.control_port:
                await self._control(scope, receive, send)
            else:
                await self._traffic(scope, receive, self._closing_when_stopping(send))
        except Refusal as refusal:
            await send_error(send, refusal.code, refusal.reason, str(refusal), refusal.headers)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._http = httpx.AsyncClient(timeout=FORWARD_TIMEOUT,
                                               limits=httpx.Limits(max_keepalive_connections=64))
                for default in ("accept", "accept-encoding", "user-agent"):  # only what the client sent goes on
                    self._http.headers.pop(default, None)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._http is not None:
                    await self._http.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _closing_when_stopping(self, send: Send) -> Send:
        """``send`` adding ``Connection: close`` to an answer that starts once stopping (looked at
        then, so a request that began before the signal is covered too)."""

        async def closing(message: Message) -> None:
            if (self._stopping and message["type"] == "http.response.start"
                    and CLOSE_HEADER not in message["headers"]):
                message = {**message, "headers": [*message["headers"], CLOSE_HEADER]}
            await send(message)

        return closing

    async def _traffic(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._taking or self._past_deadline.is_set():
            raise _stopped("the activator is stopping and takes no new request")
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        key = self._hosts.get(host_key(host))
        if key is None:
            raise Refusal(404, RefusalReason.UNKNOWN_POOL, "no pool at zero is reached as this host")
        if scope["path"] == DEMAND_PATH:
            # A hint is answered here, not held: the trainer announcing a phase must not wait for it.
            await self._pools[key].demand.receive(scope, receive, send)
            return
        body = await bounded_body(scope, receive, self._limits.max_body_bytes, "request bodies")
        if body is None:
            return
        pool = self._pools.get(key)
        if pool is None:
            raise Refusal(503, RefusalReason.POOL_REMOVED, "the pool's route was removed while the body was read",
                          close=True)
        arrived = time.monotonic()
        if not pool.serving.is_set() and not await self._hold(pool, receive):
            return  # the client left while held: nothing to forward, nothing to answer
        held = (HELD, f"{time.monotonic() - arrived:.3f}".encode())
        if self._past_deadline.is_set():
            raise _stopped("the activator's stop deadline passed before a replica served")
        current = self._pools.get(key)
        if current is None or not current.route.targets:
            raise Refusal(503, RefusalReason.POOL_REMOVED, "the pool's route was removed while the request was held",
                          close=True)
        await self._forward(current, scope, body, send, held)

    async def _hold(self, pool: _Pool, receive: Receive) -> bool:
        """Wait for a serving replica or the stop deadline, within the pool's bounds; False when the
        client left meanwhile (so a request nobody waits for is never judged, and never counted as
        held)."""
        route = pool.route
        if pool.held >= route.max_held:
            raise Refusal(503, RefusalReason.HOLD_QUEUE_FULL, f"{route.max_held} requests are already held for it",
                          close=True)
        pool.held += 1
        serving = asyncio.ensure_future(pool.serving.wait())
        stopped = asyncio.ensure_future(self._past_deadline.wait())
        gone = asyncio.ensure_future(receive())  # the body is read: only a disconnect comes now
        try:
            done, _ = await asyncio.wait((serving, stopped, gone), timeout=route.hold_timeout_seconds,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            pool.held -= 1
            self._released.set()
            for task in (serving, stopped, gone):
                task.cancel()
        if serving in done or stopped in done:
            return True  # the caller refuses what the deadline stopped
        if gone in done:
            return False
        raise Refusal(503, RefusalReason.HOLD_TIMEOUT, f"no replica served within {route.hold_timeout_seconds:g}s",
                      close=True)

    async def _forward(self, pool: _Pool, scope: Scope, body: bytes, send: Send,
                       held: tuple[bytes, bytes]) -> None:
        """Send the request to one serving replica (the next one after a refused connection) and
        stream its answer back, closing the client's connection after it, with ``held`` (how long
        the request waited here: `HELD_HEADER`)."""
        assert self._http is not None
        listed = _connection_listed(scope["headers"])
        headers = [(k, v) for k, v in scope["headers"] if k not in _NOT_FORWARDED and k not in listed]
        path = scope["raw_path"].decode("latin-1") + (f"?{scope['query_string'].decode('latin-1')}"
                                                      if scope["query_string"] else "")
        targets = pool.route.targets
        first = next(pool.turn)
        for attempt in range(len(targets)):
            target = targets[(first + attempt) % len(targets)]
            request = self._http.build_request(scope["method"], f"http://{target}{path}", headers=headers,
                                               content=body)
            try:
                answer = await self._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                continue  # never reached the replica: nothing was sent, another may take it
            except httpx.TransportError as exc:
                # The request may have reached the replica (and be judged): never sent twice.
                raise Refusal(502, RefusalReason.ENGINE_DISCONNECTED, f"the replica did not answer: {exc}",
                              close=True) from None
            try:
                returned = _connection_listed(answer.headers.raw)
                start = [(k, v) for k, v in answer.headers.raw
                         if k.lower() not in _NOT_RETURNED and k.lower() not in returned]
                await send({"type": "http.response.start", "status": answer.status_code,
                            "headers": [*start, held, CLOSE_HEADER]})
                try:
                    async for chunk in answer.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except httpx.TransportError:
                    return  # cut mid-answer: the unfinished body and the closed connection tell the client
                await send({"type": "http.response.body", "body": b""})
            finally:
                await answer.aclose()
            return
        raise Refusal(503, RefusalReason.ENGINE_UNAVAILABLE, "no serving replica accepted the request", close=True)

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if not hmac.compare_digest(authorization, b"Bearer " + self._token):
            raise Refusal(401, RefusalReason.UNAUTHENTICATED, "the control token is required", close=True)
        path, method = scope["path"], scope["method"]
        if path == STATE_PATH and method == "GET":
            await self._state(scope, send)
            return
        parts = path[len(ROUTES_PATH) + 1:].split("/") if path.startswith(ROUTES_PATH + "/") else []
        if len(parts) != 2 or not all(_LABEL.fullmatch(p) for p in parts):
            raise Refusal(404, RefusalReason.NOT_FOUND, "no such route: /v1/routes/<namespace>/<pool> (DNS labels)")
        key = pool_key(*parts)
        if method == "DELETE":
            self.delete_route(key)
        elif method == "PUT":
            body = await bounded_body(scope, receive, ROUTE_BODY_BYTES, "routes")
            if body is None:
                return
            try:
                self.set_route(key, PoolRoute.model_validate_json(body))
            except ValidationError as exc:
                raise Refusal(400, RefusalReason.BAD_REQUEST, str(exc.errors()[0]["msg"])) from None
        else:
            raise Refusal(405, RefusalReason.METHOD_NOT_ALLOWED, "PUT or DELETE a route")
        await send_json(send, 200, b'{"ok":true}')

    async def _state(self, scope: Scope, send: Send) -> None:
        """The state now, or (a long poll) once its version differs from the one asked about."""
        query = dict(p.split("=", 1) for p in scope["query_string"].decode("latin-1").split("&") if "=" in p)
        try:
            version = int(query["version"]) if "version" in query else None
            wait = min(max(float(query.get(WAIT_PARAM, "0")), 0.0), MAX_WAIT_SECONDS)
        except ValueError:
            raise Refusal(400, RefusalReason.BAD_REQUEST, "version and waitSeconds are numbers") from None
        deadline = time.monotonic() + wait
        state = self.state()
        while (version is not None and state.version == version and not self._exiting.is_set()
               and (left := deadline - time.monotonic()) > 0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exiting.wait(), min(WATCH_TICK_SECONDS, left))
            state = self.state()
        await send_json(send, 200, json.dumps(state.wire()).encode(),
                        (CLOSE_HEADER,) if self._exiting.is_set() else ())


class ActivatorServer(StoppingServer):
    """The activator's way of stopping (see the module docstring): traffic for `PROPAGATION_SECONDS`
    more, then none, and the exit once nothing is held (the stop deadline bounds that); the control
    port stays open throughout, so the operator still sees what it holds and tells it where to send
    it."""

    def __init__(self, config: uvicorn.Config, activator: Activator) -> None:
        super().__init__(config, "genrm-gateway activator")
        self._activator = activator

    async def stop(self) -> None:
        self._activator.stop_soon()
        await asyncio.sleep(PROPAGATION_SECONDS)
        self._activator.stop_taking()
        for server in self.servers:
            if any(sock.getsockname()[1] == self._activator.port for sock in server.sockets):
                server.close()
        await self._activator.nothing_held()
        self._activator.exit()


def _stopped(message: str) -> Refusal:
    """The refusal of a stopping activator: retryable, as nothing was sent to a replica; the retry
    reaches a replica or the other activator through the Service, which no longer lists this one."""
    return Refusal(503, RefusalReason.DRAINING, f"{message}; nothing was sent to a replica: retry", close=True)


def _connection_listed(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """The field names a message's ``Connection`` header lists: hop-by-hop for that message only."""
    return {t.strip().lower().encode("latin-1") for k, v in headers if k.lower() == b"connection"
            for t in v.decode("latin-1").split(",")}

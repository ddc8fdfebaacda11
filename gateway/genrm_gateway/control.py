"""The control port: probes, the drain control API, the pool's peers and revisions, and ``/metrics``, on
FastAPI.

Why separate from the proxied path: these routes need validation and auth more than speed, and
none of them may depend on the engine's request path (liveness never touches the engine at all).
No OpenAPI document and no trailing-slash redirects: nothing here is for browsing.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from genrm_contract.drained import control_token
from genrm_contract.peers import PEERS_PATH, PeersDocument
from genrm_contract.revisions import REVISIONS_PATH, RevisionsDocument
from genrm_contract.sidecar import (
    DRAIN_PATH,
    LIVE_PATH,
    MAX_WAIT_SECONDS,
    METRICS_PATH,
    READY_PATH,
    SHED_PATH,
    STATE_PATH,
    UNDRAIN_PATH,
    WAIT_PARAM,
    WATCH_TICK_SECONDS,
    DrainRequest,
    EngineReport,
    RefusalReason,
    ShedAnswer,
    ShedRequest,
    StateDocument,
    UndrainRequest,
    Versions,
    answers_ready,
)
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from genrm_gateway.admission import Admission
from genrm_gateway.body import bounded_body
from genrm_gateway.connection import Connections
from genrm_gateway.demand import DemandBoard
from genrm_gateway.drain import DrainConflict, DrainController
from genrm_gateway.engine import EngineMonitor
from genrm_gateway.errors import CLOSE_HEADER, Refusal, error_body, refusal_headers, send_error
from genrm_gateway.metrics import GatewayMetrics
from genrm_gateway.peers import Peers
from genrm_gateway.revisions import Revisions

# Control bodies are a drain id and a phase, a shed count, peers or revisions: far below this.
MAX_CONTROL_BODY_BYTES = 64 * 1024


def _error(code: int, reason: RefusalReason, message: str) -> Response:
    return Response(error_body(code, reason, message), code, media_type="application/json",
                    headers={name.decode(): value.decode() for name, value in refusal_headers(reason)})


def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
    """Bearer auth for the control API: missing → 401, wrong → 403, compared in constant time."""
    if not authorization:
        raise Refusal(401, RefusalReason.UNAUTHENTICATED, "a bearer token is required")
    scheme, _, presented = authorization.partition(" ")
    expected = control_token()
    if scheme.lower() != "bearer" or expected is None or not hmac.compare_digest(
            presented.strip().encode(), expected.encode()):
        raise Refusal(403, RefusalReason.FORBIDDEN, "the bearer token is not valid for this gateway")


def authenticate(scope: Scope) -> None:
    """The control token of a request, checked on its head alone (``require_token``'s refusals)."""
    token = next((value for name, value in scope["headers"] if name == b"authorization"), None)
    require_token(None if token is None else token.decode("latin-1"))


class _Guard:
    """Authenticates a control request and bounds its body before FastAPI reads it.

    Why: FastAPI reads and parses a route's body before it runs the route's dependencies, so
    without this a client with no token could make the gateway read and parse a body of any
    size before its 401. Here the token of a protected route is checked on the head alone; then
    the body is read up to ``MAX_CONTROL_BODY_BYTES`` (413 past it, or at once when its declared
    length is over) and handed to the app.
    """

    def __init__(self, app: ASGIApp, protected: frozenset[str], refused: Callable[[RefusalReason], None],
                 contact: Callable[[], None]) -> None:
        self._app = app
        self._protected = protected
        self._refused = refused
        self._contact = contact
        """Called on each authenticated call: the operator is in touch (``Peers.contact``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        try:
            if scope["path"] in self._protected:
                authenticate(scope)
                self._contact()
            body = await bounded_body(scope, receive, MAX_CONTROL_BODY_BYTES, "control bodies")
        except Refusal as refusal:
            self._refused(refusal.reason)
            headers = refusal.headers if CLOSE_HEADER in refusal.headers else (*refusal.headers, CLOSE_HEADER)
            await send_error(send, refusal.code, refusal.reason, str(refusal), headers)
            return
        if body is None:  # the client left
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, send)


def create_control_app(admission: Admission, drain: DrainController, engine: EngineMonitor,
                       metrics: GatewayMetrics, connections: Connections, demand: DemandBoard,
                       peers: Peers, revisions: Revisions) -> FastAPI:
    app = FastAPI(title="genrm-gateway", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    authorized = [Depends(require_token)]
    versions = Versions()

    def state_document() -> StateDocument:
        idle = drain.idle_seconds()
        load = engine.load
        return versions.stamp(StateDocument(
            state=drain.state, drain_id=drain.drain_id, inflight=admission.inflight,
            admitted_total=admission.admitted_total, completed_total=admission.completed_total,
            refused_total=admission.refused_total,
            engine=EngineReport(up=engine.up, healthy=engine.healthy, running_requests=load.running,
                                queued_requests=load.queued, token_usage=load.token_usage),
            idle_since_seconds=None if idle is None else round(idle, 3),
            client_connections=connections.kept, handing_back=len(connections.marked), demand=demand.active(),
            drain_reason=drain.reason,
        ))

    @app.exception_handler(Refusal)
    async def refusal(request: Request, exc: Refusal) -> Response:
        return _error(exc.code, exc.reason, str(exc))

    @app.exception_handler(DrainConflict)
    async def drain_conflict(request: Request, exc: DrainConflict) -> Response:
        return _error(409, RefusalReason.DRAIN_CONFLICT, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return _error(400, RefusalReason.BAD_REQUEST, "; ".join(str(e.get("msg")) for e in exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        reason = {404: RefusalReason.NOT_FOUND,
                  405: RefusalReason.METHOD_NOT_ALLOWED}.get(exc.status_code, RefusalReason.HTTP_ERROR)
        metrics.refused(reason)
        return _error(exc.status_code, reason, str(exc.detail))

    @app.get(LIVE_PATH)
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get(READY_PATH)
    async def ready() -> Response:
        state = drain.state
        if not engine.up:
            reason = RefusalReason.ENGINE_DOWN
        elif not engine.healthy:
            reason = RefusalReason.ENGINE_UNHEALTHY
        elif not answers_ready(state, drain.drain_id):
            reason = RefusalReason.DRAINING
        else:
            return Response(b'{"ready":true}', media_type="application/json")
        return Response(error_body(503, reason, f"not ready: state {state.value}"), 503,
                        media_type="application/json")

    @app.get(STATE_PATH, dependencies=authorized)
    async def get_state(
        version: Annotated[int | None, Query(ge=0)] = None,
        wait_seconds: Annotated[float, Query(alias=WAIT_PARAM, ge=0, le=MAX_WAIT_SECONDS)] = 0.0,
    ) -> dict[str, Any]:
        """The state now, or (a long poll) as soon as its version is not ``version``."""
        deadline = time.monotonic() + wait_seconds
        document = state_document()
        while version is not None and document.version == version and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(WATCH_TICK_SECONDS, left))
            document = state_document()
        return document.wire()

    @app.post(DRAIN_PATH, dependencies=authorized)
    async def post_drain(request: DrainRequest) -> dict[str, Any]:
        drain.drain(request.drain_id, request.phase, request.quiet_seconds, request.reason, request.active_revision)
        return state_document().wire()

    @app.post(UNDRAIN_PATH, dependencies=authorized)
    async def post_undrain(request: UndrainRequest) -> dict[str, Any]:
        drain.undrain(request.drain_id)
        return state_document().wire()

    @app.post(SHED_PATH, dependencies=authorized)
    async def post_shed(request: ShedRequest) -> dict[str, object]:
        """Hand back client connections (the operator's balancer; see ``Connections.shed``)."""
        return ShedAnswer(shed_id=request.shed_id,
                          marked=connections.shed(request.shed_id, request.connections, request.reason)).wire()

    @app.post(PEERS_PATH, dependencies=authorized)
    async def post_peers(request: Request) -> dict[str, object]:
        """The pool's other serving replicas (`genrm_contract.peers`); answers the document held, which
        is an older push's sender's cue that a newer one is already here. Validated here rather than
        by FastAPI: whether a loopback peer is admitted depends on the gateway (``Peers.context``)."""
        try:
            document = PeersDocument.model_validate_json(await request.body(), context=peers.context)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        return peers.update(document).wire()

    @app.post(REVISIONS_PATH, dependencies=authorized)
    async def post_revisions(request: RevisionsDocument) -> dict[str, object]:
        """The pool's active and preview judge revisions (`genrm_contract.revisions`); answers them."""
        return revisions.update(request).wire()

    @app.get(METRICS_PATH)
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    protected = frozenset(route.path for route in app.routes if isinstance(route, APIRoute)
                          and any(depends.dependency is require_token for depends in route.dependencies))
    app.add_middleware(_Guard, protected=protected, refused=metrics.refused, contact=peers.contact)
    return app

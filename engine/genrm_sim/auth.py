"""SGLang's ``--api-key``: every route needs ``Authorization: Bearer <key>`` but the probes' and the scrape's.

Why the simulator enforces it: a key-protected engine refuses whatever reaches it without the key,
including the gateway's own polls and aborts, so a gateway or operator that forgets the key on one
call must fail here as it would on a real pod. The rule is SGLang 0.5.23's ``decide_request_auth``
(``utils/auth.py``) for a server with an API key and no admin key (``--admin-api-key`` is not
modelled): ``OPTIONS`` and paths starting with ``/health``, ``/ready`` or ``/metrics`` pass; every
other request needs the bearer token (scheme case-insensitive, compared in constant time), else
``401 {"error": "Unauthorized"}``.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

_OPEN_PREFIXES = ("/health", "/ready", "/metrics")
_UNAUTHORIZED = b'{"error":"Unauthorized"}'


def allowed(method: str, path: str, authorization: str | None, api_key: str) -> bool:
    """SGLang's decision for one request to a server started with ``--api-key api_key``."""
    if method == "OPTIONS" or path.startswith(_OPEN_PREFIXES):
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and secrets.compare_digest(token, api_key)


class ApiKeyMiddleware:
    """ASGI (not ``BaseHTTPMiddleware``), as SGLang's, so a client's disconnect still reaches the routes."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self._app = app
        self._api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((value for name, value in scope["headers"] if name == b"authorization"), None)
            if not allowed(scope["method"], scope["path"], None if header is None else header.decode("latin-1"),
                           self._api_key):
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode())]})
                await send({"type": "http.response.body", "body": _UNAUTHORIZED})
                return
        await self._app(scope, receive, send)

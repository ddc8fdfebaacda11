"""The one JSON error shape the gateway produces: ``{"error": {"reason", "message", "code"}}``.

Why one shape: clients and the operator branch on ``reason`` (``draining`` is retryable on another
replica, the rest are not), so every refusal, from the hot path or the control API, carries it, and
with it the retry marker its reason implies (``x-should-retry``, and ``Retry-After`` when retryable:
`genrm_contract.sidecar.retry_headers`), added here and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from http import HTTPStatus

from genrm_contract import sidecar
from starlette.types import Send

REASON_HEADER = sidecar.REASON_HEADER.encode()
_RETRY_HEADERS = {reason: tuple((name.encode(), value.encode()) for name, value in sidecar.retry_headers(reason))
                  for reason in sidecar.RefusalReason}
"""Each reason's retry headers, encoded once (the hot path's refusals are written without building them)."""


def refusal_headers(reason: sidecar.RefusalReason) -> tuple[tuple[bytes, bytes], ...]:
    """The headers every refusal for ``reason`` carries: the reason and its retry marker."""
    return ((REASON_HEADER, reason.encode()), *_RETRY_HEADERS[reason])


def error_body(code: int, reason: sidecar.RefusalReason, message: str) -> bytes:
    return json.dumps({"error": {"reason": reason, "message": message, "code": code}}).encode()


CLOSE_HEADER = (b"connection", b"close")
_JSON_CONTENT = (b"content-type", b"application/json")


async def send_json(send: Send, code: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A whole JSON answer through ASGI: every answer the gateway and the activator write
    themselves, refusals or not. A client already gone is not an error here: there is no one
    left to tell."""
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": code,
                    "headers": [_JSON_CONTENT, (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, code: int, reason: sidecar.RefusalReason, message: str,
                     extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """The error shape, with the reason and its retry marker in headers too (for clients that read no
    body)."""
    await send_json(send, code, error_body(code, reason, message), (*refusal_headers(reason), *extra))


class Refusal(Exception):
    """A request the gateway answers itself, with ``code`` and this error shape's ``reason``.

    ``close`` ends the connection after the answer: for refusals that leave the request stream
    in an unknown place (a body not read), or that ask the client to go elsewhere.
    """

    def __init__(self, code: int, reason: sidecar.RefusalReason, message: str,
                 headers: tuple[tuple[bytes, bytes], ...] = (), *, close: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.headers = (*headers, CLOSE_HEADER) if close else headers


def refusal_response(code: int, reason: sidecar.RefusalReason, message: str,
                     defaults: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole HTTP/1.1 error response, for refusals made below the application (the connection
    layer), where no ASGI ``send`` exists; it always closes the connection. ``defaults`` are the
    server's headers on every answer (the date, the judge revision), which the ASGI answers get from
    uvicorn."""
    body = error_body(code, reason, message)
    phrase = HTTPStatus(code).phrase
    fields = b"".join(name + b": " + value + b"\r\n" for name, value in (*defaults, *refusal_headers(reason)))
    return (f"HTTP/1.1 {code} {phrase}\r\n".encode() + fields
            + f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body)

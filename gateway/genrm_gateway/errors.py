"""The one JSON error shape the gateway produces: ``{"error": {"reason", "message", "code"}}``.

Why one shape: clients and the operator branch on ``reason`` (``draining`` is retryable on another
replica, the rest are not), so every refusal, from the hot path or the control API, carries it.
"""

from __future__ import annotations

import json

REASON_HEADER = b"x-genrm-reason"


def error_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"error": {"reason": reason, "message": message, "code": code}}).encode()


class Refusal(Exception):
    """A request the gateway answers itself, with ``code`` and this error shape's ``reason``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason

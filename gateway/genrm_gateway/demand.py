"""The demand hints a gateway was sent, kept until they expire and reported in its state document.

Why the gateway keeps them and does not tell the API server: it has no credentials, and needs
none. The operator already follows every gateway's state with a long poll, so a hint reaches it
within one poll, and the operator (the pool's one writer) is what records it in the pool's status.
"""

from __future__ import annotations

import json
import time

from genrm_contract.demand import MAX_HINT_BODY_BYTES, MAX_HINTS, DemandHint
from genrm_contract.sidecar import RefusalReason
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from genrm_gateway.body import bounded_body
from genrm_gateway.errors import Refusal, send_json


class DemandBoard:
    """Active hints by id; a hint with an id already held replaces it (and its expiry)."""

    def __init__(self) -> None:
        self._hints: dict[str, tuple[DemandHint, float]] = {}

    def active(self) -> tuple[DemandHint, ...]:
        """The hints that have not expired, oldest first (expired ones are forgotten here)."""
        now = time.monotonic()
        self._hints = {k: (h, until) for k, (h, until) in self._hints.items() if until > now}
        return tuple(h for h, _ in self._hints.values())

    def add(self, hint: DemandHint) -> None:
        """Keep ``hint`` for its lifetime; refused (429) when ``MAX_HINTS`` others are active."""
        if hint.id not in self._hints and len(self.active()) >= MAX_HINTS:
            raise Refusal(429, RefusalReason.TOO_MANY_HINTS,
                          f"{MAX_HINTS} demand hints are active; send again with one of their ids, or later")
        self._hints.pop(hint.id, None)
        self._hints[hint.id] = (hint, time.monotonic() + hint.lifetime)

    async def receive(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST`` a hint: read a bounded body, validate it, keep it, answer ``202`` with its id."""
        if scope["method"] != "POST":
            raise Refusal(405, RefusalReason.METHOD_NOT_ALLOWED, "demand hints are sent with POST",
                          ((b"allow", b"POST"),))
        body = await bounded_body(scope, receive, MAX_HINT_BODY_BYTES, "demand hints")
        if body is None:
            return
        try:
            hint = DemandHint.model_validate_json(body)
        except ValidationError as exc:
            raise Refusal(400, RefusalReason.BAD_REQUEST, "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())) from None
        self.add(hint)
        answer = json.dumps({"id": hint.id, "expiresInSeconds": hint.lifetime}).encode()
        await send_json(send, 202, answer)


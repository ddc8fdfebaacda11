"""This replica's judge revision against the pool's (`genrm_contract.revisions`): the revision
document on the traffic port, the pool's revisions as the operator told them, and a request's pin.

Why the gateway checks a pin: a trainer's step must be judged by one judge. Across a blue/green
switch a kept-alive connection may still reach a replica of the old revision, or a retry the new
one; a client that says which revision may answer (``x-genrm-revision`` on its request) is refused
at once by any other (``409 revisionRetired``, never retried, never a verdict), before admission,
the engine or a peer see the request. Why a 409 for a pin on a replica the switch retired, and not
the retryable ``503 judgeSwitched`` it gives other requests: every retry could only reach the new
judge, which must refuse the pin too, so retrying would loop until the client's deadline.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from genrm_contract.revisions import RevisionAnswer, RevisionsDocument
from genrm_contract.sidecar import JUDGE_REVISION_PATTERN, REVISION_HEADER, RefusalReason
from starlette.types import Scope, Send

from genrm_gateway.errors import Refusal, send_json

REVISION = REVISION_HEADER.encode()
_WELL_FORMED = re.compile(JUDGE_REVISION_PATTERN.encode())


class Revisions:
    """This replica's revision (None when the gateway was given none) and the pool's last told."""

    def __init__(self, own: str) -> None:
        self.own = own or None
        self.told = RevisionsDocument()

    def update(self, document: RevisionsDocument) -> RevisionsDocument:
        """Take the operator's push (each replaces the last); returns what is held."""
        self.told = document
        return document

    def pinned(self, headers: list[tuple[bytes, bytes]],
               successor: Callable[[], str | None] = lambda: None) -> bytes | None:
        """A request's pin, checked: None without one; a 400 for a malformed or repeated one (it goes
        into this gateway's answers and a peer's request); a 409 when it is neither this replica's
        revision nor its ``successor`` (the revision that took its place in a judge switch, to which
        it hands the request: `proxy.Proxy._successor`, asked only for a pin to another revision), and
        any pin on a gateway given no revision: it can vouch for none."""
        pin: bytes | None = None
        for name, value in headers:
            if name == REVISION:
                if pin is not None or _WELL_FORMED.fullmatch(value) is None:
                    raise Refusal(400, RefusalReason.INVALID_HEADER,
                                  f"{REVISION_HEADER} is one judge revision, matching {JUDGE_REVISION_PATTERN}")
                pin = value
        if pin is not None and pin.decode() != self.own and pin.decode() != successor():
            raise Refusal(409, RefusalReason.REVISION_RETIRED,
                          f"this pool answers with judge revision {self.own or '(none)'}; revision {pin.decode()} "
                          "is not served here")
        return pin

    def switched(self, active: str | None, pinned: bool) -> Refusal:
        """The refusal of a replica the judge switch fenced: ``409 revisionRetired`` for a request
        pinned to this (retired) revision, else the retryable ``503 judgeSwitched`` that closes the
        connection (the client's retry reaches the new judge). Both name the active revision when
        known: the fence's ``active``, else the operator's last push unless that still names this one."""
        if active is None and self.told.active != self.own:
            active = self.told.active
        changed = "the pool's judge changed" + (f" to {active}" if active else "")
        if pinned:
            return Refusal(409, RefusalReason.REVISION_RETIRED,
                           f"judge revision {self.own} is retired: {changed}", close=True)
        return Refusal(503, RefusalReason.JUDGE_SWITCHED, f"{changed}; send again", close=True)

    async def answer(self, scope: Scope, send: Send) -> None:
        """``GET`` the revision document; other methods are refused (405)."""
        if scope["method"] != "GET":
            raise Refusal(405, RefusalReason.METHOD_NOT_ALLOWED, "the revision document is read with GET",
                          ((b"allow", b"GET"),))
        await send_json(send, 200, RevisionAnswer.of(self.own, self.told).model_dump_json().encode())

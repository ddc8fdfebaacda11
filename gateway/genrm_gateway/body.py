"""The JSON body the engine gets: the client's object, bounded, with request ids the gateway mints.

Why the gateway mints the engine's ``rid``: SGLang refuses a duplicate request id and aborts by
id, so an id a client chooses could collide with, or cancel, another client's request. The
client's id survives only as a correlation value, checked and echoed in ``X-Request-Id``.

Why bounds before parsing: the parser runs on the event loop that also answers the probes, and
its cost grows with the number of containers (each ``[`` or ``{`` becomes a Python object), not
with the bytes; a body within the size limit made of nothing but brackets would stall every other
request for most of a second. So containers are counted first, with bytes methods only (C speed,
linear in the bytes whatever they hold), and nesting is measured on the parsed object only when
it could be too deep.
"""

from __future__ import annotations

import itertools
import json
import os
import re

from genrm_contract.sidecar import RefusalReason
from starlette.types import Receive, Scope

from genrm_gateway.config import Limits
from genrm_gateway.errors import Refusal

# A client's request id: printable, header-safe and short (UUIDs, ULIDs, hex, "job-7/step-3").
CORRELATION_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
# Every byte but a quote and the two opening brackets, deleted to leave a body's structure marks.
_NOT_A_MARK = bytes(sorted(set(range(256)) - set(b'"[{')))
# Marks looked at per step of the refined count, which stops once over the limit (bounds its memory).
_MARKS_PER_STEP = 1 << 16


class RequestIds:
    """Engine request ids: unique per gateway process, never chosen by a client, and none the
    start of another.

    A random prefix per process and a counter: cheap, and unique across restarts of the sidecar
    while the engine (which rejects a duplicate rid) keeps running. Why a fixed width: SGLang's
    scheduler aborts every request whose rid *starts with* the aborted one (``abort_request`` in
    ``managers/scheduler.py``), for ``/abort_request`` and for its own abort of a disconnected
    client alike; with a variable-width counter, aborting ``-2`` also ended ``-20``, ``-2f`` and
    the members ``-2.0`` of a batch, whose clients got a 200 with a truncated answer. Ids of one
    length are prefixes of no other id.
    """

    COUNTER_DIGITS = 16
    """Hex digits of the counter: a 64-bit count never outgrows them."""

    def __init__(self) -> None:
        self._prefix = "gw" + os.urandom(6).hex() + "-"
        self._counter = itertools.count(1)

    def mint(self) -> str:
        return f"{self._prefix}{next(self._counter):0{self.COUNTER_DIGITS}x}"


def member_rids(rid: str, size: int) -> list[str]:
    """The engine ids of a batch's prompts: ``rid`` (minted for this batch alone, and never sent on
    its own) and the member's index, zero-padded to one width per batch so that, as for ``mint``,
    no member's id is the start of another's (``.1`` would be the start of ``.10``)."""
    width = len(str(size - 1))
    return [f"{rid}.{index:0{width}d}" for index in range(size)]


def correlation_id(value: object) -> bytes:
    """A client-supplied id as a header-safe value, or a 400."""
    raw = value.encode("utf-8", "replace") if isinstance(value, str) else value
    if not isinstance(raw, bytes) or CORRELATION_ID.fullmatch(raw) is None:
        raise Refusal(400, RefusalReason.INVALID_REQUEST_ID,
                      "a request id must be 1-128 characters of A-Z a-z 0-9 . _ : / + = @ -")
    return raw


def containers(body: bytes, limit: int) -> int:
    """How many JSON arrays and objects ``body`` holds: over ``limit`` exactly when it holds more,
    and within it an upper bound (the plain bracket count, when that is within the limit).

    Brackets inside strings are not counted against the limit (a prompt full of code is fine).
    Why not step over each string with a scanner: a body of two million tiny strings then costs
    the event loop a second; here every step is a bytes method, so the cost is linear in the
    bytes, at C speed, however they are arranged. For valid JSON the refined count is exact;
    invalid JSON (whose count may be anything) is refused by the parser after it, which builds no
    more containers than the valid prefix it read, and that prefix is counted exactly.

    The refinement runs only when the plain bracket count is over the limit: escapes go first,
    read left to right as JSON reads them (an escaped backslash, then an escaped quote), so each
    remaining quote is a string's edge; then all but quotes and brackets is deleted, and so is
    every pair of adjacent quotes (an empty string, or the gap between two strings: removing two
    marks keeps every other mark's side); what is left of each string then holds a bracket, or
    is the last one, so the quotes left are at most about twice the brackets outside strings,
    and the count stops once those pass the limit.
    """
    bound = body.count(b"[") + body.count(b"{")
    if bound <= limit:
        return bound
    encoding = json.detect_encoding(body)
    if encoding != "utf-8":  # in UTF-16 or UTF-32 a character's bytes can look like a quote or a bracket
        try:
            body = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        except UnicodeError:
            raise Refusal(400, RefusalReason.INVALID_JSON, f"the body is not valid {encoding}") from None
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = body.translate(None, _NOT_A_MARK).replace(b'""', b"")
    count, inside = 0, False
    for start in range(0, len(marks), _MARKS_PER_STEP):
        parts = marks[start:start + _MARKS_PER_STEP].split(b'"')
        count += len(b"".join(parts[inside::2]))  # the parts outside strings: brackets only
        inside ^= len(parts) % 2 == 0  # an odd number of quotes in this step
        if count > limit:
            break
    return count


def exceeds_depth(value: object, limit: int) -> bool:
    """Whether JSON containers nest deeper than ``limit`` (iterative: no recursion to exhaust)."""
    level: list[object] = [value]
    for _ in range(limit):
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())
                 if isinstance(child, dict | list)]
        if not level:
            return False
    return True


def batch_size(payload: dict[str, object]) -> int | None:
    """The number of prompts of a batched native request (``text``, ``input_ids``, ``input``), else None.

    SGLang wants one request id per prompt of a batch; a reward model's batch refuses a single id.
    """
    for key in ("text", "input"):
        value = payload.get(key)
        if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
            return len(value)
    ids = payload.get("input_ids")
    if isinstance(ids, list) and ids and all(isinstance(item, list) for item in ids):
        return len(ids)
    return None


def engine_body(body: bytes, limits: Limits, ids: RequestIds) -> tuple[bytes, str | None, bytes]:
    """The body the engine gets: the client's JSON object with the gateway's ``rid``.

    Returns the new body, the one engine rid to abort if the client leaves (None for a batch: the
    engine aborts a batch itself when its connection closes) and the id to echo: the client's
    own ``rid`` when it sent a single one, else the gateway's.
    """
    count = containers(body, limits.max_json_containers)
    if count > limits.max_json_containers:
        raise Refusal(400, RefusalReason.JSON_TOO_COMPLEX,
                      f"the JSON has more than {limits.max_json_containers} arrays and objects")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise Refusal(400, RefusalReason.INVALID_JSON, "the body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise Refusal(400, RefusalReason.INVALID_JSON, "the body must be a JSON object")
    if count > limits.max_json_depth and exceeds_depth(payload, limits.max_json_depth):
        raise Refusal(400, RefusalReason.JSON_TOO_DEEP, f"the JSON nests deeper than {limits.max_json_depth} levels")
    client_rid = payload.get("rid")
    if isinstance(client_rid, list) and 0 < len(client_rid) <= limits.max_batch_size:
        for item in client_rid:
            correlation_id(item)
    elif client_rid is not None and not isinstance(client_rid, str):
        raise Refusal(400, RefusalReason.INVALID_REQUEST_ID,
                      f"rid must be a string or a list of at most {limits.max_batch_size} strings")
    given = correlation_id(client_rid) if isinstance(client_rid, str) else None
    size = len(client_rid) if isinstance(client_rid, list) else batch_size(payload)
    if size is not None and size > limits.max_batch_size:
        raise Refusal(400, RefusalReason.BATCH_TOO_LARGE, f"a batch may hold at most {limits.max_batch_size} prompts")
    engine_rid = ids.mint()
    echo = given or engine_rid.encode()
    if "rid" not in payload and size is None and json.detect_encoding(body) == "utf-8":
        # The common case, kept cheap: the gateway's id spliced in front of the client's keys (the
        # body parsed as one UTF-8 object, so it stays valid; the id is the gateway's own hex).
        start = body.index(b"{") + 1
        rest = body[start:].lstrip()
        return b'{"rid":"' + engine_rid.encode() + (b'",' if rest[:1] != b"}" else b'"') + rest, engine_rid, echo
    payload["rid"] = engine_rid if size is None else member_rids(engine_rid, size)
    return json.dumps(payload, separators=(",", ":")).encode(), engine_rid if size is None else None, echo


async def bounded_body(scope: Scope, receive: Receive, limit: int, what: str) -> bytes | None:
    """A small body read whole (the control API's, a demand hint), or None when the client left.

    A 413 that closes the connection as soon as the declared length or the bytes read pass
    ``limit``: the rest is never read, so a large body costs nothing but the refusal."""
    too_large = Refusal(413, RefusalReason.BODY_TOO_LARGE, f"{what} are at most {limit} bytes", close=True)
    for name, value in scope["headers"]:
        if name == b"content-length" and int(value) > limit:  # llhttp checked the digits
            raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)

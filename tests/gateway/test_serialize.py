"""The engine request writer, held to h11's judgement (h11 is the well-kept reference).

For any header value: the writer refuses everything h11 refuses (h11 is more permissive: it
takes control characters other than NUL, which RFC 9110 §5.5 does not), its own refusals are
exactly the values outside RFC 9110's field-value, and what it writes is read by h11 as one
request with the same method, target, headers and body, and nothing more.
"""

from __future__ import annotations

import h11
import pytest
from genrm_gateway.config import EngineAddress
from genrm_gateway.upstream import EnginePool, InvalidField
from hypothesis import given, settings
from hypothesis import strategies as st

POOL = EnginePool(EngineAddress("127.0.0.1", 30000))
_interesting = st.sampled_from([b"\r", b"\n", b"\x00", b"\t", b" ", b"\x7f", b"\x80", b"\xff", b":", b"a"])
VALUES = st.one_of(st.binary(max_size=24), st.lists(_interesting, max_size=12).map(b"".join))


def h11_accepts(value: bytes) -> bool:
    try:
        h11.Request(method="POST", target="/generate", headers=[("host", "x"), ("authorization", value)])
    except h11.LocalProtocolError:
        return False
    return True


def rfc9110_field_value(value: bytes) -> bool:
    """The grammar, byte by byte: no control character but inner tabs, no space or tab at the ends."""
    if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        return False
    return all((byte >= 0x20 and byte != 0x7F) or byte == 0x09 for byte in value)


def parsed(data: bytes) -> list[h11.Request | h11.Data]:
    server = h11.Connection(h11.SERVER)
    server.receive_data(data)
    events: list[h11.Request | h11.Data] = []
    while True:
        event = server.next_event()
        if isinstance(event, h11.Request | h11.Data):
            events.append(event)
        elif isinstance(event, h11.EndOfMessage):
            assert server.next_event() is h11.PAUSED or server.their_state is h11.DONE
            return events
        else:
            raise AssertionError(f"incomplete request: {event!r}")


@settings(max_examples=1000, deadline=None)
@given(value=VALUES, body=st.binary(max_size=16))
def test_the_writer_agrees_with_h11(value: bytes, body: bytes) -> None:
    try:
        data = POOL.serialize("POST", "/generate", body, [(b"authorization", value)])
    except InvalidField:
        assert not rfc9110_field_value(value), value
        return
    assert rfc9110_field_value(value) and h11_accepts(value), value
    request, *chunks = parsed(data)
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (b"POST", b"/generate")
    assert dict(request.headers)[b"authorization"] == value
    assert b"".join(c.data for c in chunks if isinstance(c, h11.Data)) == body


@pytest.mark.parametrize("name", [b"x y", b"a:b", b"", b"x\r\ny"])
def test_header_names_must_be_tokens(name: bytes) -> None:
    with pytest.raises(InvalidField):
        POOL.serialize("POST", "/generate", b"", [(name, b"v")])

"""The gateway as an attacker sees it: raw bytes on its traffic port, a spy engine behind it.

The oracle, for every attack in the corpus and every fuzzed request:
- the engine receives only allowlisted routes (or an abort of an id the gateway minted), only the
  headers the gateway writes itself, and JSON bodies whose ``rid`` the gateway minted;
- the engine never receives more requests than the gateway admitted (no smuggled extra request);
- the gateway answers no 5xx of its own making, stays up, and in-flight returns to 0.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import h11
import httpx
import pytest
from conftest import AUTH, Gateway, gateway_process
from genrm_gateway.routes import PROXIED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spy import STREAM_CHUNK, Seen, SpyEngine, running_spy

pytestmark = pytest.mark.timeout(240)

ALLOWED = {(route.method, path) for path, route in PROXIED.items()}
ENGINE_HEADERS = {"host", "content-length", "content-type", "accept"}
MINTED = re.compile(r"gw[0-9a-f]{12}-[0-9a-f]{16}(\.[0-9]+)?")
STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")
VALID = b'{"text": "judge this", "sampling_params": {"max_new_tokens": 4}}'


@dataclass
class Target:
    spy: SpyEngine
    gateway: Gateway
    control: httpx.Client

    def state(self) -> dict[str, object]:
        document: dict[str, object] = self.control.get("/v1/state").json()
        return document


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with running_spy() as spy, gateway_process(
            spy.url, "--engine-poll-seconds", "3600", "--max-body-bytes", "65536", "--max-json-depth", "16",
            "--head-timeout-seconds", "2", "--body-timeout-seconds", "2") as gateway, \
            httpx.Client(base_url=gateway.control, headers=AUTH) as control:
        yield Target(spy, gateway, control)


def exchange(port: int, raw: bytes, half_close: bool = False, seconds: float = 1.5) -> bytes:
    """Send ``raw`` on a fresh connection; everything the gateway answered until it closed or went quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        try:
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the gateway may refuse and close before reading everything
            pass
        received = b""
        deadline = time.monotonic() + seconds
        sock.settimeout(0.3)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if STATUS.search(received):
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        return received


def violations(seen: list[Seen], admitted: int) -> list[str]:
    """What the engine received that it must not have."""
    found: list[str] = []
    minted: set[str] = set()
    proxied = 0
    for request in seen:
        names = {name for name, _ in request.headers}
        if names - ENGINE_HEADERS:
            found.append(f"unexpected headers {sorted(names - ENGINE_HEADERS)} on {request.target}")
        if any(ch in value for _, value in request.headers for ch in "\r\n\0"):
            found.append(f"control character in a header value on {request.target}")
        if request.method == "POST" and request.target == "/abort_request":
            rid = request.json().get("rid")
            if rid not in minted:
                found.append(f"abort of an id the gateway did not mint: {rid!r}")
            continue
        if (request.method, request.target) not in ALLOWED:
            found.append(f"non-allowlisted request {request.method} {request.target}")
            continue
        proxied += 1
        if request.method == "POST":
            rid = request.json().get("rid")
            rids = rid if isinstance(rid, list) else [rid]
            for item in rids:
                if not isinstance(item, str) or not MINTED.fullmatch(item):
                    found.append(f"engine rid not minted by the gateway: {item!r}")
                else:
                    minted.add(item)
    ordered = sorted(minted)
    # SGLang aborts by prefix; sorted, an id that starts another starts the one right after it.
    found += [f"aborting {a!r} would also abort {b!r}" for a, b in itertools.pairwise(ordered) if b.startswith(a)]
    if proxied > admitted:
        found.append(f"the engine got {proxied} requests for {admitted} admitted")
    return found


def settle(target: Target) -> dict[str, object]:
    """The gateway's state once nothing is in flight (raises if it stays busy)."""
    deadline = time.monotonic() + 5
    state = target.state()
    while state["inflight"] != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        state = target.state()
    assert state["inflight"] == 0, state
    return state


def attack(target: Target, raw: bytes, half_close: bool = False) -> tuple[list[int], list[str]]:
    """Statuses the gateway answered and the oracle's findings for one raw attack."""
    before, mark = int(target.state()["admittedTotal"]), len(target.spy.seen)  # type: ignore[call-overload]
    answer = exchange(target.gateway.port, raw, half_close=half_close)
    after = int(settle(target)["admittedTotal"])  # type: ignore[call-overload]
    statuses = [int(code) for code in STATUS.findall(answer)]
    found = violations(target.spy.since(mark), after - before) + target.spy.broken
    found += [f"gateway answered {code}" for code in statuses if code >= 500]
    return statuses, found


def post(body: bytes, *headers: bytes, target: bytes = b"/generate") -> bytes:
    head = [b"POST " + target + b" HTTP/1.1", b"host: judge", b"content-type: application/json",
            b"content-length: " + str(len(body)).encode(), *headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"


PAD = b" " * (100 * 1024)
ADMIN = b"GET /flush_cache HTTP/1.1\r\nhost: engine\r\ncontent-length: 0\r\n\r\n"
SMUGGLE_RID = json.dumps({"rid": "a\r\n\r\n" + ADMIN.decode(), "text": "a"}).encode()

# (name, raw bytes, statuses the gateway may answer); every case is also held to the oracle.
CORPUS: list[tuple[str, bytes, set[int]]] = [
    ("rid with CRLF header injection", post(b'{"rid": "a\\r\\nX-Injected: yes", "text": "a"}'), {400}),
    ("rid with bare LF", post(b'{"rid": "a\\nX-Injected: yes", "text": "a"}'), {400}),
    ("rid with NUL", post(b'{"rid": "a\\u0000b", "text": "a"}'), {400}),
    ("rid with a lone surrogate", post(b'{"rid": "\\ud800", "text": "a"}'), {400}),
    ("rid smuggling a request behind padding", post(SMUGGLE_RID[:-1] + b', "p": "' + PAD[:60000] + b'"}'), {400}),
    ("rid of 200 characters", post(json.dumps({"rid": "r" * 200, "text": "a"}).encode()), {400}),
    ("rid that is a number", post(b'{"rid": 7, "text": "a"}'), {400}),
    ("rid list with an injected element", post(b'{"rid": ["ok", "a\\r\\nb"], "text": ["a", "b"]}'), {400}),
    ("client rid reused: still a minted engine id", post(b'{"rid": "victim-1", "text": "a"}'), {200}),
    ("X-Request-Id with CR", post(VALID, b"x-request-id: a\rX-Injected: yes"), {400}),
    ("X-Request-Id with a space", post(VALID, b"x-request-id: a b"), {400}),
    ("header value with NUL", post(VALID, b"x-note: a\x00b"), {400}),
    ("authorization with bare LF", post(VALID, b"authorization: Bearer a\nX-Injected: yes"), {400}),
    ("CL and TE", post(VALID, b"transfer-encoding: chunked"), {400}),
    ("TE then CL", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n"
     + chunked(VALID), {400}),
    ("duplicate equal Content-Length", post(VALID, b"content-length: %d" % len(VALID)), {400}),
    ("duplicate different Content-Length", post(VALID, b"content-length: 3"), {400}),
    ("signed Content-Length", VALID.join([b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: +%d\r\n\r\n"
                                          % len(VALID), b""]), {400}),
    ("negative Content-Length", b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: -1\r\n\r\n" + VALID, {400}),
    ("Content-Length overflow", b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: 99999999999999999999999"
     b"\r\n\r\n" + VALID, {400}),
    ("TE chunked, identity", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked, identity\r\n\r\n"
     + chunked(VALID), {400}),
    ("TE xchunked", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: xchunked\r\n\r\n" + chunked(VALID),
     {400}),
    ("TE with space before colon", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding : chunked\r\n\r\n"
     + chunked(VALID), {400}),
    ("TE with obs-fold", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding:\r\n chunked\r\n\r\n"
     + chunked(VALID), {400}),
    ("bad chunk size", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n"
     b"zz\r\nabc\r\n0\r\n\r\n", {400}),
    ("chunk size overflow", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n"
     b"fffffffffffffffffffff\r\nabc\r\n0\r\n\r\n", {400}),
    ("chunk extension with bare LF", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n"
     b"3;x=\nGET /flush_cache HTTP/1.1\r\n\r\nabc\r\n0\r\n\r\n", {400}),
    ("trailer carrying a header", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n"
     + chunked(VALID, trailer=b"x-injected: yes\r\n"), {200}),
    ("obs-fold continuation", post(VALID, b"x-note: a\r\n X-Injected: yes"), {400}),
    ("bare LF line endings", post(VALID).replace(b"\r\n", b"\n"), {400}),
    ("bare CR line endings", post(VALID).replace(b"\r\n", b"\r"), {400}),
    ("pipelined admin route", post(VALID) + ADMIN, {200, 403}),
    ("pipelined control route", post(VALID) + b"POST /v1/drain HTTP/1.1\r\nhost: j\r\ncontent-length: 2\r\n\r\n{}",
     {200, 404}),
    ("pipelined engine health", post(VALID) + b"GET /health HTTP/1.1\r\nhost: j\r\n\r\n", {200, 403}),
    ("absolute-form admin target", b"POST http://127.0.0.1:30000/flush_cache HTTP/1.1\r\nhost: j\r\n"
     b"content-length: 0\r\n\r\n", {403}),
    ("absolute-form judge target", post(VALID, target=b"http://engine.internal/generate?x=/flush_cache"), {200}),
    ("percent-encoded admin path", b"GET /flush%5Fcache HTTP/1.1\r\nhost: j\r\n\r\n", {403}),
    ("dot-segment to admin", b"GET /v1/../flush_cache HTTP/1.1\r\nhost: j\r\n\r\n", {404}),
    ("dot-segment after judge route", post(VALID, target=b"/generate/../flush_cache"), {404}),
    ("double slash", b"GET //flush_cache HTTP/1.1\r\nhost: j\r\n\r\n", {404}),
    ("query on a judge route", post(VALID, target=b"/generate?stream=1&rid=x"), {200}),
    ("NUL in the target", b"GET /gen\x00erate HTTP/1.1\r\nhost: j\r\n\r\n", {400}),
    ("space in the target", b"GET /gen erate HTTP/1.1\r\nhost: j\r\n\r\n", {400}),
    ("oversize head", post(VALID, b"x-big: " + b"a" * 100_000), {431}),
    ("too many headers", post(VALID, *[b"x-h%d: v" % i for i in range(150)]), {431}),
    ("oversize declared body", b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: 10000000\r\n\r\n" + PAD,
     {413}),
    ("oversize chunked body", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n"
     + chunked(PAD), {413}),
    ("deeply nested JSON", post(b"[" * 30_000 + b"]" * 30_000), {400}),
    ("brackets past the container limit", post(b'{"text": "a", "x": [' + b"[[]]," * 12_000 + b'[]]}'), {400}),
    ("a batch past the batch limit", post(json.dumps({"text": ["a"] * 5000}).encode()), {400}),
    ("a rid list past the batch limit", post(json.dumps({"text": "a", "rid": ["r"] * 5000}).encode()), {400}),
    ("valid request, then malformed bytes", post(VALID) + b"GET / HTTP/1.1\r\nbad header\r\n\r\n", {200, 400}),
    ("nesting past the depth limit", post(b'{"text": "a", "x": ' + b'{"a": ' * 20 + b"1" + b"}" * 20 + b"}"), {400}),
    ("invalid JSON", post(b"{not json"), {400}),
    ("JSON that is not an object", post(b"[1, 2]"), {400}),
    ("wrong method", b"GET /generate HTTP/1.1\r\nhost: j\r\n\r\n", {405}),
    ("CONNECT", b"CONNECT 127.0.0.1:30000 HTTP/1.1\r\nhost: 127.0.0.1:30000\r\n\r\n", {400, 404}),
    ("websocket upgrade", b"GET /generate HTTP/1.1\r\nhost: j\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
     {400}),
    ("h2c upgrade", post(VALID, b"connection: upgrade, http2-settings", b"upgrade: h2c", b"http2-settings: AAMAAABk"),
     {400}),
    ("HTTP/1.0 without host", b"POST /generate HTTP/1.0\r\ncontent-length: %d\r\n\r\n" % len(VALID) + VALID, {200}),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400}),
    ("OpenAPI document", b"GET /openapi.json HTTP/1.1\r\nhost: j\r\n\r\n", {404}),
    ("docs page", b"GET /docs HTTP/1.1\r\nhost: j\r\n\r\n", {404}),
    ("trailing slash with a hostile Host", b"GET /v1/models/ HTTP/1.1\r\nhost: evil.example\r\n\r\n", {404}),
    ("control API on the traffic port", b"GET /v1/state HTTP/1.1\r\nhost: j\r\nauthorization: Bearer x\r\n\r\n",
     {404}),
    ("engine metrics on the traffic port", b"GET /metrics HTTP/1.1\r\nhost: j\r\n\r\n", {403}),
    # Found by the differential against h11 below: llhttp reads these, RFC 9112 refuses them.
    ("HTTP/1.1 without host", b"GET /v1/models HTTP/1.1\r\n\r\n", {400}),
    ("two hosts", b"GET /v1/models HTTP/1.1\r\nhost: j\r\nhost: k\r\n\r\n", {400}),
    ("TE gzip alone", b"GET /v1/models HTTP/1.1\r\nhost: j\r\ntransfer-encoding: gzip\r\n\r\n", {400}),
    ("TE gzip, chunked", b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
     + chunked(VALID), {400}),
]


@pytest.mark.parametrize(("name", "raw", "allowed"), CORPUS, ids=[name for name, _, _ in CORPUS])
def test_attack_corpus(target: Target, name: str, raw: bytes, allowed: set[int]) -> None:
    statuses, found = attack(target, raw)
    assert not found, found
    assert statuses and set(statuses) <= allowed, statuses
    after = httpx.post(f"http://127.0.0.1:{target.gateway.port}/generate", content=VALID,
                       headers={"content-type": "application/json"})
    assert after.status_code == 200  # still serving


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 40


def test_earlier_pipelined_requests_are_answered_before_a_refusal(target: Target) -> None:
    answer = exchange(target.gateway.port, post(VALID) + post(VALID) + b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
    assert [int(code) for code in STATUS.findall(answer)] == [200, 200, 400]


def test_brackets_inside_strings_do_not_count_as_containers(target: Target) -> None:
    prompt = "def f(x): return [x[i] for i in {'a': [1]}]" * 600  # ~20,000 brackets, one string
    response = httpx.post(f"http://127.0.0.1:{target.gateway.port}/generate", json={"text": prompt})
    assert response.status_code == 200


def test_a_batch_gets_one_engine_id_per_prompt(target: Target) -> None:
    mark = len(target.spy.seen)
    response = httpx.post(f"http://127.0.0.1:{target.gateway.port}/generate", json={"text": ["a", "b", "c"]})
    assert response.status_code == 200
    rid = target.spy.judged(mark)[0].json()["rid"]
    assert isinstance(rid, list) and len(rid) == 3 and all(MINTED.fullmatch(r) for r in rid)


def test_an_http10_client_gets_a_stream_whole_without_chunked_encoding(target: Target) -> None:
    body = b'{"text": "a", "stream": true, "chunks": 3}'
    answer = exchange(target.gateway.port, b"POST /generate HTTP/1.0\r\ncontent-length: %d\r\n\r\n" % len(body)
                      + body, seconds=3)
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding" not in head.lower()
    assert b"content-length: %d" % len(content) in head.lower() and len(content) == 3 * len(STREAM_CHUNK)


def test_no_response_reflects_the_host_header_or_redirects(target: Target) -> None:
    answer = exchange(target.gateway.port, b"GET /v1/models/ HTTP/1.1\r\nhost: evil.example\r\n\r\n")
    assert b"evil.example" not in answer and b"location:" not in answer.lower()


def test_a_client_cannot_abort_another_clients_request(target: Target) -> None:
    """Sending a victim's rid and disconnecting aborts only the gateway's own id for that request."""
    mark = len(target.spy.seen)
    victim = httpx.post(f"http://127.0.0.1:{target.gateway.port}/generate",
                        json={"rid": "victim", "text": "a"})
    assert victim.status_code == 200 and victim.headers["x-request-id"] == "victim"
    exchange(target.gateway.port, post(b'{"rid": "victim", "text": "a", "stream": true, "chunks": 3}'),
             half_close=True)
    settle(target)
    rids = [seen.json().get("rid") for seen in target.spy.since(mark)]
    assert "victim" not in rids and all(isinstance(r, str) and MINTED.fullmatch(r) for r in rids)


# --- fuzzing: requests assembled from hostile parts, and plain random bytes ---

_methods = st.sampled_from([b"GET", b"POST", b"PUT", b"CONNECT", b"OPTIONS", b"POST ", b"P\x00ST", b"HEAD"])
_targets = st.sampled_from([b"/generate", b"/v1/chat/completions", b"/v1/models", b"/flush_cache", b"/health",
                            b"http://x/generate", b"/gener%61te", b"/generate/../shutdown", b"*", b"/v1/state",
                            b"/generate?rid=x", b"/metrics", b"/abort_request"])
_versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"HTTP/9"])
_eols = st.sampled_from([b"\r\n", b"\n", b"\r", b"\r\r\n"])
_header_names = st.sampled_from([b"host", b"content-length", b"transfer-encoding", b"x-request-id", b"connection",
                                 b"content-type", b"authorization", b"expect", b"upgrade", b"x-injected",
                                 b"transfer-encoding ", b" content-length", b"te"])
_header_values = st.one_of(
    st.sampled_from([b"chunked", b"0", b"5", b"+5", b"-1", b"1, 1", b"close", b"keep-alive", b"100-continue",
                     b"websocket", b"application/json", b"a\r\nX-Injected: yes", b"chunked\x00", b" chunked",
                     b"identity, chunked", b"99999999999999999999"]),
    st.binary(max_size=20))
_rids = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(
    ["a\r\nX-Injected: yes", "\ud800", "x" * 300, "ok-1"]), st.integers(), st.lists(st.text(max_size=4), max_size=3))
_bodies = st.one_of(
    st.builds(lambda rid, text: json.dumps({"text": text} | ({} if rid is None else {"rid": rid})).encode(),
              _rids, st.text(max_size=20)),
    st.binary(max_size=64),
    st.builds(lambda depth: b"[" * depth + b"]" * depth, st.integers(1, 3000)))
_tails = st.sampled_from([b"", ADMIN, b"GET /v1/drain HTTP/1.1\r\n\r\n", b"0\r\n\r\n", b"\r\n\r\n"])


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    eol = draw(_eols)
    body = draw(_bodies)
    lines = [draw(_methods) + b" " + draw(_targets) + b" " + draw(_versions)]
    headers = draw(st.lists(st.tuples(_header_names, _header_values), max_size=6))
    if draw(st.booleans()):
        headers.append((b"content-length", str(len(body)).encode()))
    lines += [name + b": " + value for name, value in headers]
    return eol.join(lines) + eol + eol + body + draw(_tails)


def _fuzz_once(target: Target, raw: bytes) -> None:
    _, found = attack(target, raw, half_close=True)
    assert not found, (raw[:300], found)
    assert target.gateway.process.poll() is None


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raw=raw_requests())
def test_fuzzed_requests_keep_the_oracle(target: Target, raw: bytes) -> None:
    _fuzz_once(target, raw)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raw=st.binary(min_size=1, max_size=400))
def test_random_bytes_keep_the_oracle(target: Target, raw: bytes) -> None:
    _fuzz_once(target, raw)


@pytest.mark.parametrize("body", [b'{"text": "a", "rid": null}', b'\xef\xbb\xbf{"text": "a"}',
                                  '{"text": "a"}'.encode("utf-16"), b' {"text": "a"} ', b"{}"])
def test_every_body_reaches_the_engine_with_exactly_the_gateways_rid(target: Target, body: bytes) -> None:
    mark = len(target.spy.seen)
    response = httpx.post(f"http://127.0.0.1:{target.gateway.port}/generate", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    (seen,) = target.spy.since(mark)
    rids = [value for key, value in json.loads(seen.body, object_pairs_hook=list) if key == "rid"]
    assert len(rids) == 1 and MINTED.fullmatch(rids[0]), seen.body


# --- fuzzing: pipelined sequences, and what a connection sends once its answer is out ---

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raws=st.lists(raw_requests(), min_size=2, max_size=6))
def test_fuzzed_pipelined_sequences_keep_the_oracle(target: Target, raws: list[bytes]) -> None:
    _fuzz_once(target, b"".join(raws))


_FIRSTS = st.sampled_from([
    b"GET /v1/models HTTP/1.1\r\nhost: j\r\n\r\n",  # answered 200, kept alive
    b"POST /nope HTTP/1.1\r\nhost: j\r\ncontent-length: 5\r\n\r\n",  # 404 with its body still to come
    b"GET /generate HTTP/1.1\r\nhost: j\r\ncontent-length: 5\r\n\r\n",  # 405, likewise
    b"POST /generate HTTP/1.1\r\nhost: j\r\ntransfer-encoding: chunked\r\n\r\n",  # a body that never ends
])
_IDLE_BYTES = st.one_of(st.sampled_from([b"\r\n", b"\r\n\r\n", b"\n", b" ", b"G", b"GET /", b"0\r\n", b"1\r\nx"]),
                        st.binary(min_size=1, max_size=4))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cases=st.lists(st.tuples(_FIRSTS, _IDLE_BYTES), min_size=12, max_size=12))
def test_fuzzed_idle_bytes_never_keep_a_connection_past_its_timeouts(
        target: Target, cases: list[tuple[bytes, bytes]]) -> None:
    """Whatever a connection sends after (or instead of) finishing a request, the gateway closes it
    within the head or body timeout (2 s here), with no 5xx of its own, and stays up."""
    socks = []
    for first, idle in cases:
        sock = socket.create_connection(("127.0.0.1", target.gateway.port))
        sock.sendall(first)
        time.sleep(0.05)  # the answer (when there is one) goes out before the idle bytes arrive
        try:
            sock.sendall(idle)
        except OSError:
            pass
        socks.append(sock)
    deadline = time.monotonic() + 6
    for (first, idle), sock in zip(cases, socks, strict=True):
        received, closed = b"", False
        sock.settimeout(0.1)
        while not closed and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            received += chunk
            closed = not chunk
        sock.close()
        assert closed, (first, idle, received[:200])
        assert all(int(code) < 500 for code in STATUS.findall(received)), (first, idle, received[:200])
    settle(target)
    assert target.gateway.process.poll() is None


# --- differential: what the gateway forwards is what h11 reads in the same bytes ---


def h11_reading(raw: bytes) -> list[tuple[str, str, bytes]]:
    """The complete requests h11, as a server, reads in ``raw`` followed by the client's close:
    method, path (percent-decoded, without the query, as ASGI gives it) and body, in order, up to
    the first bytes it refuses."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(raw)
    connection.receive_data(b"")
    requests: list[tuple[str, str, bytes]] = []
    head: h11.Request | None = None
    body = b""
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError:
            return requests
        if isinstance(event, h11.Request):
            head, body = event, b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(head.target.decode("latin-1")).path)
            requests.append((head.method.decode(), path, body))
            connection.send(h11.Response(status_code=404, headers=[("content-length", "0")]))  # no protocol switch
            connection.send(h11.EndOfMessage())
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:  # the request asked to close the connection
                return requests
        else:  # NEED_DATA, ConnectionClosed, PAUSED: nothing more can be read
            return requests


def without_rid(body: bytes) -> object:
    document = json.loads(body)
    if isinstance(document, dict):
        document.pop("rid", None)
    return document


def _differential_once(target: Target, raw: bytes) -> None:
    mark = len(target.spy.seen)
    exchange(target.gateway.port, raw, half_close=True)
    settle(target)
    forwarded = [seen for seen in target.spy.since(mark) if seen.target != "/abort_request"]
    reading = iter(h11_reading(raw))
    for seen in forwarded:
        # Each forwarded request is one h11 also read, in the same order (the gateway may refuse
        # some that h11 reads, never forward one that h11 does not); the body is the client's,
        # but for the rid the gateway writes.
        match = next((read for read in reading if read[:2] == (seen.method, seen.target)), None)
        assert match is not None, (raw[:300], seen)
        if seen.method == "POST":
            assert without_rid(seen.body) == without_rid(match[2]), (raw[:300], seen.body, match[2])


_near_framings = st.sampled_from(["length", "chunked", "both", "length twice", "none"])
_near_headers = st.lists(st.sampled_from([
    b"connection: close", b"connection: keep-alive", b"expect: 100-continue", b"x-request-id: ok-1",
    b"content-type: application/json", b"accept: */*", b"te: trailers", b"upgrade: h2c", b"transfer-encoding: gzip",
    b"x-pad:" + b" " * 40, b"x-tab:\tv", b"x-obs:\x80", b" x-space: 1", b"x-empty:"]), max_size=3)


@st.composite
def near_valid_requests(draw: st.DrawFn) -> bytes:
    """Requests a judge client would send, each with at most a few hostile variations: the
    differential needs many requests that both parsers read, not only refusals."""
    body = json.dumps({"text": draw(st.text(max_size=12)), "sampling_params": {"max_new_tokens": 4}}).encode()
    method, path = draw(st.sampled_from([(b"POST", b"/generate"), (b"POST", b"/v1/chat/completions"),
                                         (b"GET", b"/v1/models"), (b"POST", b"/gener%61te"),
                                         (b"POST", b"/generate?x=1"), (b"POST", b"/nope")]))
    framing = draw(_near_framings) if method == b"POST" else "none"
    headers = [b"host: judge", *draw(_near_headers)]
    if framing in ("length", "both", "length twice"):
        headers.append(b"content-length: %d" % len(body))
    if framing == "length twice":
        headers.append(b"content-length: %d" % len(body))
    if framing in ("chunked", "both"):
        headers.append(b"transfer-encoding: chunked")
    content = chunked(body) if framing in ("chunked", "both") else body if framing != "none" else b""
    eol = draw(st.sampled_from([b"\r\n"] * 6 + [b"\n"]))
    return eol.join([method + b" " + path + b" HTTP/1.1", *headers]) + eol + eol + content


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raws=st.lists(st.one_of(near_valid_requests(), raw_requests()), min_size=1, max_size=5))
def test_the_gateway_forwards_only_what_h11_reads_in_the_same_bytes(target: Target, raws: list[bytes]) -> None:
    _differential_once(target, b"".join(raws))


@pytest.mark.parametrize("name, raw", [(name, raw) for name, raw, _ in CORPUS])
def test_the_attack_corpus_forwards_only_what_h11_reads(target: Target, name: str, raw: bytes) -> None:
    _differential_once(target, raw)

"""Attacks on what the gateway holds for a client: engine connections, event-loop time, memory.

Each scenario runs a real ``genrm-gateway serve`` process in front of the spy engine and checks
what an attacker would: the attack is refused or bounded with its own status (or a clean close)
and a ``genrm_gateway_refused_total{reason}`` count, in-flight returns to 0, a drain still reaches
Drained, and a bystander client is served meanwhile and afterwards.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
from conftest import TOKEN, Gateway, gateway_process, sent_unread
from genrm_contract.sidecar import RefusalReason
from genrm_gateway.connection import MAX_PIPELINED
from genrm_testing import free_port
from spy import SpyEngine, running_spy
from test_limits import JUDGE, LIMITS, answer, rss_mb, served

pytestmark = pytest.mark.timeout(120)

HEAD = b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


def refused(gateway: Gateway, reason: str) -> float:
    """``genrm_gateway_refused_total{reason}``; 0 while the reason has never been counted."""
    try:
        return gateway.metric(f'genrm_gateway_refused_total{{reason="{reason}"}}')
    except KeyError:
        return 0.0


def drains(gateway: Gateway, seconds: float = 8.0) -> None:
    """Soft drain, fence, and Drained with nothing in flight within ``seconds``."""
    for phase in ("soft", "fence"):
        assert gateway.drain("d", phase).status_code == 200
    deadline = time.monotonic() + seconds
    while gateway.state()["state"] != "Drained" and time.monotonic() < deadline:
        time.sleep(0.05)
    state = gateway.state()
    assert state["state"] == "Drained" and state["inflight"] == 0, state


def settled(gateway: Gateway, seconds: float = 5.0) -> None:
    """In-flight back to 0 within ``seconds``."""
    deadline = time.monotonic() + seconds
    while gateway.state()["inflight"] != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gateway.state()["inflight"] == 0


def quickly_served(gateway: Gateway, within: float = 2.0) -> None:
    started = time.monotonic()
    assert served(gateway)
    assert time.monotonic() - started < within


def slow_read(sock: socket.socket, until: bytes, step: int = 1024, pause: float = 0.002) -> bytes:
    """Read ``step`` bytes at a time with a pause between reads, until the data ends with ``until``."""
    received = b""
    sock.settimeout(10)
    while not received.endswith(until):
        chunk = sock.recv(step)
        if not chunk:
            break
        received += chunk
        time.sleep(pause)
    return received


@pytest.fixture
def spy() -> Iterator[SpyEngine]:
    with running_spy() as engine:
        yield engine


# --- 1. a slow reader must not leave an engine connection paused for the next client ---

@pytest.mark.parametrize(("buffer", "events", "event_bytes"), [
    ("4096", 12, 2048),  # a 24 KiB stream the gateway reads in one go: past the buffer and complete at once
    ("1048576", 19, 64 * 1024),  # a ~1.2 MiB stream at the default buffer
])
def test_a_slow_reader_of_a_stream_never_affects_the_next_client(
        spy: SpyEngine, buffer: str, events: int, event_bytes: int) -> None:
    with gateway_process(spy.url, *LIMITS, "--stream-buffer-bytes", buffer) as gateway:
        body = json.dumps({"text": "long", "stream": True, "chunks": events, "eventBytes": event_bytes,
                           "burst": True}).encode()
        for _ in range(3):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", gateway.port))
                sock.sendall(HEAD % len(body) + body)
                time.sleep(0.2)  # the engine has sent it all; the client has read nothing yet
                quickly_served(gateway)  # a bystander meanwhile
                received = slow_read(sock, b"0\r\n\r\n", step=16 * 1024 if events > 12 else 1024)
            assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b"0\r\n\r\n")
            assert received.count(b"data: ") == events
            quickly_served(gateway)  # the next request, on the engine connection the stream used
        settled(gateway)
        drains(gateway)


# --- 2. an engine that stops answering costs its client a 504, not a hang ---

ENGINE_TIMEOUTS = ("--engine-head-timeout-seconds", "1", "--engine-read-timeout-seconds", "1")


def test_an_engine_that_never_answers_gets_504_at_the_engine_head_timeout(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, *ENGINE_TIMEOUTS) as gateway:
        spy.misbehave = "silent"
        mark = len(spy.seen)
        started = time.monotonic()
        response = httpx.post(f"{gateway.url}/generate", content=b'{"text": "judge"}',
                              headers={"content-type": "application/json"}, timeout=10)
        assert response.status_code == 504, response.text
        assert response.json()["error"]["reason"] == RefusalReason.ENGINE_TIMEOUT
        assert 0.9 < time.monotonic() - started < 4
        rid = spy.judged(mark)[0].json()["rid"]
        assert any(s.target == "/abort_request" and s.json()["rid"] == rid for s in spy.since(mark))
        assert refused(gateway, RefusalReason.ENGINE_TIMEOUT) == 1
        settled(gateway)
        spy.misbehave = ""
        quickly_served(gateway)
        drains(gateway)


def test_a_stream_the_engine_stops_is_cut_at_the_engine_read_timeout(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, *ENGINE_TIMEOUTS) as gateway:
        spy.misbehave = "stalled"
        body = b'{"text": "judge", "stream": true}'
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(HEAD % len(body) + body)
            started = time.monotonic()
            received = answer(sock, 6)  # until the gateway closes the connection
            elapsed = time.monotonic() - started
        assert received.startswith(b"HTTP/1.1 200 ") and b"data: {}" in received
        assert not received.endswith(b"0\r\n\r\n")  # cut, not ended as if complete
        assert 0.9 < elapsed < 4
        assert refused(gateway, RefusalReason.ENGINE_TIMEOUT) == 1
        settled(gateway)
        spy.misbehave = ""
        quickly_served(gateway)
        drains(gateway)


def test_many_slow_readers_and_a_bystander_share_the_engine(spy: SpyEngine) -> None:
    """Slow readers of large streams hold their own engine connections, never a bystander's."""
    with gateway_process(spy.url, *LIMITS, "--write-timeout-seconds", "10") as gateway:
        body = json.dumps({"text": "long", "stream": True, "chunks": 40}).encode()  # 2.5 MiB each
        readers = [socket.socket() for _ in range(4)]
        results: list[bytes] = []
        for sock in readers:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
            sock.connect(("127.0.0.1", gateway.port))
            sock.sendall(HEAD % len(body) + body)
        threads = [threading.Thread(target=lambda s=sock: results.append(slow_read(s, b"0\r\n\r\n", 64 * 1024,
                                                                                     0.01)))
                   for sock in readers]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            quickly_served(gateway, within=1.0)
            time.sleep(0.05)
        for sock in readers:
            sock.close()
        assert len(results) == 4 and all(r.endswith(b"0\r\n\r\n") for r in results)
        for _ in range(8):
            quickly_served(gateway, within=1.0)
        settled(gateway)
        drains(gateway)


# --- 3. the control API authenticates before it reads a body, and bounds bodies ---

def during(gateway: Gateway, attack: Callable[[], bytes]) -> tuple[bytes, float]:
    """``attack``'s answer and the gateway's peak resident memory growth (MiB) while it ran."""
    baseline = rss_mb(gateway)
    peak = [baseline]
    results: list[bytes] = []
    thread = threading.Thread(target=lambda: results.append(attack()))
    thread.start()
    while thread.is_alive():
        peak[0] = max(peak[0], rss_mb(gateway))
        time.sleep(0.01)
    return results[0], peak[0] - baseline


def control_post(gateway: Gateway, path: bytes, body: bytes, *headers: bytes, chunked: bool = False) -> bytes:
    """A raw POST to the control port; everything it answered until it closed."""
    framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % len(body)
    head = b"\r\n".join([b"POST " + path + b" HTTP/1.1", b"host: c", b"content-type: application/json", framing,
                         *headers]) + b"\r\n\r\n"
    payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked else body
    with socket.create_connection(("127.0.0.1", gateway.control_port)) as sock:
        try:
            sock.sendall(head + payload)
        except OSError:  # refused and closed before everything was sent
            pass
        return answer(sock, 5)


HUGE_DRAIN = json.dumps({"drainId": "d", "phase": "soft", "pad": ["x" * 60] * (16 << 14)}).encode()  # ~16 MiB


@pytest.mark.parametrize(("headers", "code", "reason"), [
    ((), 401, RefusalReason.UNAUTHENTICATED),
    ((b"authorization: Bearer wrong",), 403, RefusalReason.FORBIDDEN),
    ((b"authorization: Bearer " + TOKEN.encode(),), 413, RefusalReason.BODY_TOO_LARGE),
])
def test_a_huge_control_body_is_refused_before_it_is_read(
        spy: SpyEngine, headers: tuple[bytes, ...], code: int, reason: str) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        for chunked in (False, True):
            refused_before = refused(gateway, reason)
            reply, grown = during(gateway, partial(control_post, gateway, b"/v1/drain", HUGE_DRAIN, *headers,
                                                   chunked=chunked))
            assert reply.startswith(b"HTTP/1.1 %d " % code) and reason.encode() in reply, reply[:200]
            assert grown < 12, grown
            assert refused(gateway, reason) == refused_before + 1
        quickly_served(gateway)
        assert gateway.state()["state"] == "Serving"
        drains(gateway)


def test_control_bodies_up_to_64_kib_are_read(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        auth = b"authorization: Bearer " + TOKEN.encode()
        fits = json.dumps({"drainId": "d", "phase": "soft", "pad": "x" * 60_000}).encode()
        read = control_post(gateway, b"/v1/drain", fits, auth)  # read, then judged: no such field as "pad"
        assert read.startswith(b"HTTP/1.1 400 ") and RefusalReason.BAD_REQUEST.encode() in read
        over = json.dumps({"drainId": "d", "phase": "soft", "pad": "x" * (64 * 1024)}).encode()
        assert control_post(gateway, b"/v1/drain", over, auth).startswith(b"HTTP/1.1 413 ")
        assert control_post(gateway, b"/v1/drain", over, auth, chunked=True).startswith(b"HTTP/1.1 413 ")
        drains(gateway)


# --- 4. a chunked body's trailer never reaches the engine, and is held to the head's limits ---

def chunked_post(body: bytes, trailer: bytes) -> bytes:
    return (b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
            b"\r\n%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailer))


def test_trailer_fields_never_reach_the_engine_nor_the_answer(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        mark = len(spy.seen)
        trailer = b"content-type: text/evil\r\nauthorization: Bearer stolen\r\nx-request-id: from-the-trailer\r\n"
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(chunked_post(b'{"text": "judge"}', trailer))
            reply = answer(sock, 1)
        assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
        assert b"from-the-trailer" not in reply
        (seen,) = spy.judged(mark)
        assert dict(seen.headers).get("content-type") == "application/json"
        assert "authorization" not in dict(seen.headers) and b"stolen" not in seen.body
        assert refused(gateway, RefusalReason.TRAILER_DROPPED) == 1
        quickly_served(gateway)
        drains(gateway)


def test_an_endless_trailer_gets_431_with_bounded_memory(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        def endless() -> bytes:
            with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
                try:
                    sock.sendall(chunked_post(b'{"text": "judge"}', b"x-endless: "))
                    for _ in range(256):  # 16 MiB of one trailer field's value
                        sock.sendall(b"a" * 65536)
                except OSError:
                    pass
                return answer(sock, 3)

        reply, grown = during(gateway, endless)
        assert reply.startswith(b"HTTP/1.1 431 ") and RefusalReason.HEAD_TOO_LARGE.encode() in reply, reply[:200]
        assert grown < 12, grown
        assert refused(gateway, RefusalReason.HEAD_TOO_LARGE) == 1
        many = b"".join(b"x-t%d: v\r\n" % i for i in range(200))
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(chunked_post(b'{"text": "judge"}', many))
            assert answer(sock, 3).startswith(b"HTTP/1.1 431 ")
        assert refused(gateway, RefusalReason.TOO_MANY_HEADERS) == 1
        settled(gateway)
        quickly_served(gateway)
        drains(gateway)


# --- 5. a JSON body costs the event loop time linear in its bytes, at C speed ---

def cpu_seconds(gateway: Gateway) -> float:
    """The gateway process's user and system CPU time so far."""
    fields = Path(f"/proc/{gateway.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_stall(gateway: Gateway, attack: Callable[[], object]) -> tuple[float, float]:
    """The gateway's CPU seconds for ``attack`` and the slowest liveness probe while it ran."""
    slowest = [0.0]
    running = threading.Event()
    running.set()

    def probe() -> None:
        with httpx.Client(timeout=10) as client:
            while running.is_set():
                started = time.monotonic()
                assert client.get(f"{gateway.control}/healthz/live").status_code == 200
                slowest[0] = max(slowest[0], time.monotonic() - started)
                time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    before = cpu_seconds(gateway)
    try:
        attack()
    finally:
        spent = cpu_seconds(gateway) - before
        running.clear()
        prober.join()
    return spent, slowest[0]


def judge(gateway: Gateway, body: bytes) -> httpx.Response:
    return httpx.post(f"{gateway.url}/generate", content=body, headers={"content-type": "application/json"},
                      timeout=30)


TINY_STRINGS = b'{"text": [' + b'"a",' * ((8 << 20) - 65536 >> 2) + b'[],' * 10_001 + b'"a"]}'  # just under 8 MiB


def test_a_json_body_of_tiny_strings_is_refused_without_stalling_the_loop(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, "--body-timeout-seconds", "10") as gateway:
        assert len(TINY_STRINGS) < 8 << 20
        spent, stalled = probe_stall(gateway, lambda: judge(gateway, TINY_STRINGS))
        print(f"tiny strings: gateway CPU {spent:.3f} s, slowest liveness probe {stalled:.3f} s")
        three: list[httpx.Response] = []

        def three_at_once() -> None:
            threads = [threading.Thread(target=lambda: three.append(judge(gateway, TINY_STRINGS))) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        spent3, stalled3 = probe_stall(gateway, three_at_once)
        print(f"three at once: gateway CPU {spent3:.3f} s, slowest liveness probe {stalled3:.3f} s")
        assert [r.status_code for r in three] == [400] * 3
        assert all(r.json()["error"]["reason"] == RefusalReason.JSON_TOO_COMPLEX for r in three)
        assert refused(gateway, RefusalReason.JSON_TOO_COMPLEX) == 4
        # Receiving 8 MiB costs the gateway CPU too; the walk over 2 million strings cost a second.
        assert spent < 0.5 and stalled < 0.5, (spent, stalled)
        assert stalled3 < 1.0, stalled3
        quickly_served(gateway)
        settled(gateway)
        drains(gateway)


# --- 6. a large non-streamed answer to a client that does not read is bounded and stays in flight ---

def test_large_answers_to_clients_that_never_read_are_bounded_and_held_in_flight(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, "--write-timeout-seconds", "3") as gateway:
        baseline, peak = rss_mb(gateway), 0.0
        body = b'{"text": "judge", "answerBytes": %d}' % (32 << 20)
        readers = []
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", gateway.port))
            sock.sendall(HEAD % len(body) + body)
            readers.append(sock)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # well within the write timeout: nobody has been cut yet
            peak = max(peak, rss_mb(gateway))
            quickly_served(gateway, within=1.0)
            time.sleep(0.05)
        print(f"4 clients not reading 32 MiB answers: peak growth {peak - baseline:.1f} MiB, "
              f"the engine sent {spy.streamed_bytes / 2**20:.1f} MiB")
        assert gateway.state()["inflight"] == 4  # answers not written are not finished
        # The engine was pushed back: what it sent is the gateway's buffer and the kernel's socket buffers.
        assert spy.streamed_bytes < 4 * (24 << 20), spy.streamed_bytes
        assert peak - baseline < 4 * 6, (baseline, peak)  # before: about twice the answer per client
        settled(gateway, seconds=8)  # cut at the write timeout
        assert refused(gateway, RefusalReason.WRITE_TIMEOUT) == 4
        for sock in readers:
            assert answer(sock, 0.5).startswith(b"HTTP/1.1 200 ")  # what was written, then the cut
            sock.close()
        quickly_served(gateway)
        drains(gateway)


def test_large_answers_are_whole_for_clients_that_read(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, "--stream-buffer-bytes", "65536") as gateway:
        for size in (0, 1, 65535, 65537, 3 << 20):
            response = httpx.post(f"{gateway.url}/generate", content=b'{"text": "j", "answerBytes": %d}' % size,
                                  headers={"content-type": "application/json"}, timeout=10)
            assert response.status_code == 200 and len(response.content) == size
            assert response.headers["content-length"] == str(size)
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:  # HTTP/1.0: no chunked encoding
            body = b'{"text": "j", "answerBytes": 200000}'
            sock.sendall(b"POST /generate HTTP/1.0\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            head, _, content = answer(sock, 3).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 200000" in head and len(content) == 200000
        settled(gateway)


# --- 7. the open-file limit never comes before maxConnections ---

@contextmanager
def soft_open_files(soft: int) -> Iterator[None]:
    """Processes started inside inherit a soft RLIMIT_NOFILE of ``soft`` (the hard one unchanged)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def open_files(gateway: Gateway) -> tuple[int, int]:
    """The gateway process's soft and hard RLIMIT_NOFILE."""
    for line in Path(f"/proc/{gateway.process.pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit")


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096, reason="needs a hard open-file limit "
                    "of 4096 or more")
def test_a_low_soft_open_file_limit_is_raised_so_idle_connections_get_the_documented_503(spy: SpyEngine) -> None:
    with ExitStack() as stack:
        with soft_open_files(1024):  # a container's usual soft limit, for the gateway only
            gateway = stack.enter_context(gateway_process(spy.url, *LIMITS, "--max-connections", "1050",
                                                          "--head-timeout-seconds", "30"))
        idle = [stack.enter_context(socket.create_connection(("127.0.0.1", gateway.port))) for _ in range(1050)]
        assert httpx.get(f"{gateway.control}/healthz/live", timeout=5).status_code == 200
        with socket.create_connection(("127.0.0.1", gateway.port)) as extra:
            assert answer(extra, 3).startswith(b"HTTP/1.1 503 ")
        assert refused(gateway, RefusalReason.TOO_MANY_CONNECTIONS) == 1
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        assert open_files(gateway) == (hard, hard)
        for sock in idle[:50]:
            sock.close()
        time.sleep(0.3)
        quickly_served(gateway)
        for sock in idle[50:]:
            sock.close()
        drains(gateway)


def test_the_gateway_refuses_to_start_when_the_hard_open_file_limit_cannot_hold_max_connections() -> None:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    command = [sys.executable, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(free_port()),
               "--control-port", str(free_port()), "--engine-url", "http://127.0.0.1:9"]
    refused_start = subprocess.run([*command, "--max-connections", "4096"], preexec_fn=limited,
                                   capture_output=True, timeout=60)
    assert refused_start.returncode != 0
    assert b"RLIMIT_NOFILE" in refused_start.stderr and b"max-connections" in refused_start.stderr, \
        refused_start.stderr
    fits = subprocess.Popen([*command, "--max-connections", "300"], preexec_fn=limited,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(3)
        assert fits.poll() is None  # 300 clients, an engine connection each and the margin fit in 1024
    finally:
        fits.terminate()
        fits.wait(10)


# --- 8. every idle connection has a timer, whatever bytes it sent ---

def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the gateway sent until it closed ``sock``, or None if it is still open after ``seconds``."""
    sock.settimeout(0.1)
    received, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def whole_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, read to its last byte."""
    sock.settimeout(2)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    declared = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    assert declared is not None, head
    length = int(declared[1])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_connections_that_send_stray_bytes_after_an_answer_are_closed_in_time(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        kinds = {
            "crlf after an answer": (b"GET /v1/models HTTP/1.1\r\nhost: j\r\n\r\n", b"\r\n"),
            "a body byte after a 404": (b"POST /nope HTTP/1.1\r\nhost: j\r\ncontent-length: 5\r\n\r\n", b"x"),
            "a body byte after a 405": (b"GET /generate HTTP/1.1\r\nhost: j\r\ncontent-length: 5\r\n\r\n", b"x"),
        }
        socks: list[tuple[str, socket.socket]] = []
        for name, (request, stray) in kinds.items():
            for _ in range(8):
                sock = socket.create_connection(("127.0.0.1", gateway.port))
                sock.sendall(request)
                response = whole_response(sock)
                assert response.startswith(b"HTTP/1.1 "), name  # the answer is complete
                # An answer given before its request's body ended closes the connection.
                assert (b"\r\nconnection: close\r\n" in response.lower()) == ("body byte" in name), name
                sock.sendall(stray)
                socks.append((name, sock))
        started = time.monotonic()
        for name, sock in socks:
            left = closed_within(sock, max(0.1, started + 4 - time.monotonic()))
            assert left is not None, f"{name}: still open"
            sock.close()
        assert refused(gateway, RefusalReason.HEAD_TIMEOUT) == 8
        assert refused(gateway, RefusalReason.BODY_TIMEOUT) == 0  # closed at the refusal, not at a timeout
        quickly_served(gateway)
        settled(gateway)
        drains(gateway)


def test_a_refused_requests_unread_body_never_outlives_the_head_and_keep_alive_timeouts(spy: SpyEngine) -> None:
    """A refusal given without reading the body (a large one is declared, one byte of it sent)
    closes the connection at once, whatever the body timeout: on both ports, the byte sent with the
    head or after the answer. An honest client's requests keep their connection."""
    with gateway_process(spy.url, "--keep-alive-seconds", "2", "--head-timeout-seconds", "2",
                         "--body-timeout-seconds", "30") as gateway:
        baseline = gateway.metric("genrm_gateway_open_connections")
        large = b"content-length: 1000000\r\n\r\n"
        refusals = {
            "404": b"POST /nope HTTP/1.1\r\nhost: j\r\n" + large,
            "405": b"GET /generate HTTP/1.1\r\nhost: j\r\n" + large,
            "403": b"POST /flush_cache HTTP/1.1\r\nhost: j\r\n" + large,
        }
        socks: list[tuple[str, socket.socket]] = []
        for port in (gateway.port, gateway.control_port):
            for name, head in refusals.items():
                for together in (True, False):
                    sock = socket.create_connection(("127.0.0.1", port))
                    sock.sendall(head + b"x" if together else head)
                    response = whole_response(sock)
                    assert b"\r\nconnection: close\r\n" in response.lower(), (port, name, response[:200])
                    if not together:
                        sock.sendall(b"x")
                    socks.append((f"{name} on {port}", sock))
        started = time.monotonic()
        for name, sock in socks:
            assert closed_within(sock, max(0.1, started + 2.5 - time.monotonic())) is not None, f"{name}: still open"
        # The gateway's side closes too (after the lingering close), well before the body timeout.
        deadline = time.monotonic() + 4
        while gateway.metric("genrm_gateway_open_connections") > baseline and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gateway.metric("genrm_gateway_open_connections") == baseline
        for _, sock in socks:
            sock.close()
        opened = gateway.metric("genrm_gateway_connections_opened_total")
        with httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}") as client:
            for _ in range(3):
                answer = client.post("/generate", content=JUDGE, headers={"content-type": "application/json"})
                assert answer.status_code == 200 and answer.headers.get("connection") != "close"
        assert gateway.metric("genrm_gateway_connections_opened_total") == opened + 1
        settled(gateway)
        drains(gateway)


def test_a_crlf_after_an_answer_does_not_outlive_the_fence(spy: SpyEngine) -> None:
    with gateway_process(spy.url, *LIMITS, "--head-timeout-seconds", "3") as gateway:
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: j\r\n\r\n")
        assert whole_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"\r\n")
        drains(gateway)
        assert closed_within(sock, 4) is not None
        sock.close()


# --- 9. requests sent ahead of their answers are bounded per connection, on both ports ---

STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


def pipelined_flood(port: int, request: bytes, size: int = 512 * 1024) -> bytes:
    """``size`` bytes of ``request`` repeated, from a client that reads nothing until it has sent
    them (or the gateway stopped taking them); then everything it was answered."""
    with sent_unread(port, request * (size // len(request))) as sock:
        return answer(sock, 3)


@pytest.mark.parametrize(("port", "request_bytes"), [
    ("traffic", b"GET /v1/models HTTP/1.1\r\nhost: j\r\n\r\n"),
    ("control", b"GET /healthz/live HTTP/1.1\r\nhost: c\r\n\r\n"),
])
def test_a_flood_of_pipelined_requests_is_refused_after_a_few_with_bounded_memory(
        spy: SpyEngine, port: str, request_bytes: bytes) -> None:
    with gateway_process(spy.url, *LIMITS) as gateway:
        target = gateway.port if port == "traffic" else gateway.control_port
        reply, grown = during(gateway, partial(pipelined_flood, target, request_bytes))
        print(f"512 KiB of pipelined requests on the {port} port: {grown:.1f} MiB")
        statuses = [int(code) for code in STATUS.findall(reply)]
        assert statuses[-1] == 503 and RefusalReason.TOO_MANY_PIPELINED.encode() in reply, statuses[-3:]
        assert len(statuses) >= MAX_PIPELINED + 2 and set(statuses[:-1]) == {200}, statuses
        assert grown < 8, grown  # before: about 100 bytes per byte sent
        assert refused(gateway, RefusalReason.TOO_MANY_PIPELINED) == 1
        settled(gateway)
        quickly_served(gateway)
        drains(gateway)


def test_requests_pipelined_within_the_bound_are_all_answered(spy: SpyEngine) -> None:
    """One being answered and ``MAX_PIPELINED`` waiting, sent at once."""
    with gateway_process(spy.url, *LIMITS) as gateway, \
            socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall((HEAD % len(JUDGE) + JUDGE) * MAX_PIPELINED
                     + b"GET /v1/models HTTP/1.1\r\nhost: j\r\nconnection: close\r\n\r\n")
        reply = answer(sock, 5)
    assert [int(code) for code in STATUS.findall(reply)] == [200] * (MAX_PIPELINED + 1)

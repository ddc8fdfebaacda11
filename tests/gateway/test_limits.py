"""Slow and greedy clients: each is cut by its limit, memory stays bounded, others keep being served.

Each scenario runs against its own gateway (short timeouts) in front of the spy engine, and
reads the gateway process's resident memory from /proc while the attack is under way.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Gateway, gateway_process, sent_unread
from genrm_contract.sidecar import RefusalReason
from spy import SpyEngine, running_spy

pytestmark = pytest.mark.timeout(120)

LIMITS = ("--engine-poll-seconds", "0.2", "--head-timeout-seconds", "1", "--body-timeout-seconds", "1",
          "--write-timeout-seconds", "2", "--quiet-seconds", "0.2")
JUDGE = b'{"text": "judge", "sampling_params": {"max_new_tokens": 4}}'


def rss_mb(gateway: Gateway) -> float:
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def served(gateway: Gateway) -> bool:
    response = httpx.post(f"{gateway.url}/generate", content=JUDGE, headers={"content-type": "application/json"},
                          timeout=5)
    return response.status_code == 200


def answer(sock: socket.socket, seconds: float) -> bytes:
    """What the gateway sends on ``sock`` until it closes it (or ``seconds`` pass)."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError:
        pass
    return received


@pytest.fixture
def spied() -> Iterator[tuple[SpyEngine, Gateway]]:
    with running_spy() as spy, gateway_process(spy.url, *LIMITS) as gateway:
        yield spy, gateway


def test_slowloris_connections_are_cut_at_the_head_timeout(spied: tuple[SpyEngine, Gateway]) -> None:
    _, gateway = spied
    baseline = rss_mb(gateway)
    socks = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(200)]
    silent = socket.create_connection(("127.0.0.1", gateway.port))
    for sock in socks:
        sock.sendall(b"POST /generate HTTP/1.1\r\nhost: j\r\nx-slow: ")
    started = time.monotonic()
    for _ in range(3):  # a byte now and then: each keeps the connection "active"
        time.sleep(0.3)
        assert served(gateway)
        for sock in socks:
            try:
                sock.sendall(b"a")
            except OSError:
                pass
    answers = [answer(sock, 3) for sock in socks]
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert time.monotonic() - started < 4
    assert answer(silent, 3) == b""  # sent nothing: closed quietly, not answered
    assert rss_mb(gateway) < baseline + 30
    assert served(gateway) and gateway.state()["inflight"] == 0
    for sock in [*socks, silent]:
        sock.close()


def test_header_floods_get_431_with_bounded_memory(spied: tuple[SpyEngine, Gateway]) -> None:
    _, gateway = spied
    baseline = rss_mb(gateway)
    peak = [baseline]

    def endless_header() -> bytes:
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nhost: j\r\nx-flood: ")
            try:
                for _ in range(256):  # 16 MiB that never ends the line
                    sock.sendall(b"a" * 65536)
                    peak[0] = max(peak[0], rss_mb(gateway))
            except OSError:
                pass
            return answer(sock, 3)

    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(endless_header())) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 16 and all(r.startswith(b"HTTP/1.1 431 ") for r in results), {r[:40] for r in results}
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(100_000))
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        try:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: j\r\n" + many + b"\r\n")
        except OSError:
            pass
        assert answer(sock, 3).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        try:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: j\r\nx-big: " + b"b" * (8 << 20) + b"\r\n\r\n")
        except OSError:
            pass
        assert answer(sock, 3).startswith(b"HTTP/1.1 431 ")
    assert peak[0] < baseline + 40, (baseline, peak[0])
    assert served(gateway)


def test_a_stalled_upload_is_refused_at_the_body_timeout_and_the_drain_completes(
        spied: tuple[SpyEngine, Gateway]) -> None:
    _, gateway = spied
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-type: application/json\r\n"
                     b"content-length: 1000\r\n\r\n{\"text\": ")
        time.sleep(0.2)
        assert gateway.state()["inflight"] == 1
        for phase in ("soft", "fence"):
            assert gateway.drain("d", phase).status_code == 200
        refused = answer(sock, 3)
    assert refused.startswith(b"HTTP/1.1 408 ") and RefusalReason.BODY_TIMEOUT.encode() in refused
    deadline = time.monotonic() + 3
    while gateway.state()["state"] != "Drained" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.state()["state"] == "Drained" and gateway.state()["inflight"] == 0


def test_a_client_that_stops_reading_a_stream_is_cut_without_buffering_it(
        spied: tuple[SpyEngine, Gateway]) -> None:
    spy, gateway = spied
    baseline = rss_mb(gateway)
    mark = len(spy.seen)
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        body = b'{"text": "long", "stream": true, "chunks": 3200}'  # 200 MiB of events
        sock.sendall(b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body)
        peak = baseline
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not any(s.target == "/abort_request" for s in spy.since(mark)):
            peak = max(peak, rss_mb(gateway))
            assert served(gateway)
            time.sleep(0.2)
        assert any(s.target == "/abort_request" for s in spy.since(mark)), "the engine request was not aborted"
    assert spy.streamed_bytes < 32 << 20, spy.streamed_bytes  # the engine was pushed back, not drained
    assert peak < baseline + 40, (baseline, peak)
    assert gateway.state()["inflight"] == 0 and served(gateway)


def test_a_pipelining_client_that_never_reads_cannot_hold_a_drain(spied: tuple[SpyEngine, Gateway]) -> None:
    """An answer waits on a full socket with pipelined requests (refusals) queued behind it: every
    answer on the traffic port has the write timeout. The first answer is large because the
    gateway answers at most ``MAX_PIPELINED`` requests sent ahead of their answers, whose small
    refusals alone no longer fill the socket."""
    _, gateway = spied
    large = b'{"text": "judge", "answerBytes": 33554432}'
    data = (b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: %d\r\n\r\n" % len(large) + large
            + b"POST /generate HTTP/1.1\r\nhost: j\r\ncontent-length: 9\r\n\r\n{not json" * 20_000)
    with sent_unread(gateway.port, data):
        admitted, stalled_at = -1, time.monotonic()
        while time.monotonic() - stalled_at < 0.5:  # until the gateway stops taking requests
            time.sleep(0.1)
            state = gateway.state()
            if state["admittedTotal"] != admitted:
                admitted, stalled_at = state["admittedTotal"], time.monotonic()
        assert gateway.state()["inflight"] == 1  # an answer stuck on the full socket
        assert gateway.drain("d", "soft").status_code == 200
        assert gateway.drain("d", "fence").status_code == 200
        deadline = time.monotonic() + 8
        while gateway.state()["state"] != "Drained" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gateway.state()["state"] == "Drained" and gateway.state()["inflight"] == 0


@pytest.mark.parametrize("misbehaviour", ["desync", "status999", "interim"])
def test_an_engine_that_breaks_http_costs_a_502_at_most_and_never_a_hang(
        spied: tuple[SpyEngine, Gateway], misbehaviour: str) -> None:
    spy, gateway = spied
    spy.misbehave = misbehaviour
    for _ in range(3):
        response = httpx.post(f"{gateway.url}/generate", content=JUDGE,
                              headers={"content-type": "application/json"}, timeout=5)
        assert response.status_code in ((200,) if misbehaviour == "interim" else (200, 502)), response.text
        if misbehaviour == "status999":
            assert response.status_code == 502
    assert gateway.state()["inflight"] == 0
    spy.misbehave = ""
    assert served(gateway)

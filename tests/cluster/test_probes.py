"""The local node agent's probes keep the kubelet's rules (no cluster needed).

Aspects under test: ``timeoutSeconds`` decides whether a slow answer is a failure; ``failureThreshold``
failures in a row, and only those, flip the result; an attempt runs on its own thread (a slow answer
holds up nothing else of the pod), attempts start a period apart, and one that outlasts the period is
followed by the next only once it has ended, never by two at once.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest
from genrm_cluster.probes import ProbeState, run_probe


class SlowReady(http.server.BaseHTTPRequestHandler):
    """Answers 200 after the server's ``delay`` seconds."""

    def do_GET(self) -> None:
        time.sleep(self.server.delay)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowReady)
    server.delay = 0.0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def http_probe(port: int, timeout: float, period: float = 1, threshold: int = 1) -> dict[str, object]:
    return {"httpGet": {"path": "/ready", "port": "control"}, "timeoutSeconds": timeout,
            "periodSeconds": period, "failureThreshold": threshold}


def container(port: int) -> dict[str, object]:
    return {"name": "gateway", "ports": [{"name": "control", "containerPort": port}]}


def no_exec(argv: list[str], timeout: float) -> int:
    raise AssertionError("no exec probe here")


def test_an_answer_slower_than_the_timeout_fails_and_one_within_it_passes(
        slow_server: http.server.ThreadingHTTPServer) -> None:
    port = slow_server.server_address[1]
    slow_server.delay = 1.5  # type: ignore[attr-defined]
    assert run_probe(http_probe(port, timeout=1), "127.0.0.1", container(port), no_exec) is False
    assert run_probe(http_probe(port, timeout=3), "127.0.0.1", container(port), no_exec) is True


def test_only_failure_threshold_failures_in_a_row_flip_the_result() -> None:
    state = ProbeState(http_probe(0, timeout=1, threshold=3), started_at=0.0, initial=True)
    assert [state.record(ok) for ok in (False, False, True, False, False)] == [True] * 5
    assert state.record(False) is False
    assert state.record(True) is True


def test_an_attempt_runs_on_its_own_thread_and_the_next_waits_for_its_end() -> None:
    release = threading.Event()
    ended = threading.Event()
    state = ProbeState(http_probe(0, timeout=5, period=1), started_at=0.0, initial=False)
    assert state.due(0.0)
    started = time.monotonic()
    state.launch(lambda: release.wait(5), 0.0, ended.set)
    assert time.monotonic() - started < 0.5, "launch waits for nothing"
    assert state.finished() is None
    assert not state.due(1.5), "a period has passed, but the attempt still runs: no second one"
    release.set()
    assert ended.wait(5)
    assert state.finished() is True
    assert state.due(1.5), "the next attempt starts as soon as the slow one has ended"
    assert state.next_at == 1.0, "attempts are a period apart, start to start"

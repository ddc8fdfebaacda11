"""The activator as a process, in front of a real gateway and simulator.

Aspects: requests for a pool with no serving replica are held (not refused) and counted in the
versioned state the operator long-polls; once the operator's route names a replica, every held
request is forwarded and answered, with ``Connection: close`` so the client's next connection goes
through the Service again; a pool's hold queue and hold time are bounded with a retryable 503
(``holdQueueFull``, ``holdTimeout``, ``Retry-After``); a Host that is no known pool gets 404
``unknownPool``; the control API wants the token; the client's API key goes through to the
gateway untouched; a killed activator's held clients see their connection end without an answer
(what the docs promise them); a stopping one (SIGTERM) takes traffic for the propagation window,
then refuses new connections, keeps its control port and what it holds until a route releases it,
and exits once it holds nothing; at its stop deadline what it still holds gets a retryable 503
(``draining``, ``Retry-After``, ``Connection: close``); while stopping every answer closes its
connection, a request on a kept-alive connection after the window is refused, not held, and the
operator's waiting state poll never delays the exit.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import gateway_stack
from genrm_contract.activator import ROUTES_PATH
from genrm_contract.demand import DEMAND_PATH
from genrm_contract.sidecar import HELD_HEADER, PROPAGATION_SECONDS
from genrm_gateway.activator import host_key
from genrm_testing import CONTROL_TOKEN, RunningGateway, run_activator
from genrm_testing.waiting import wait_for
from test_apikey import BEARER, KEY, keyed_stack, write_key

pytestmark = pytest.mark.timeout(60)
AUTH = {"authorization": f"Bearer {CONTROL_TOKEN}"}
HOST = "judge.rl.svc"


def route(act: RunningGateway, targets: list[str], max_held: int = 64, hold_timeout: float = 30.0) -> None:
    """Give the activator the pool ``rl/judge``'s route, as the operator does."""
    body = {"hosts": [HOST, f"{HOST}:8000"], "targets": targets, "maxHeld": max_held,
            "holdTimeoutSeconds": hold_timeout}
    answer = httpx.put(f"{act.control}{ROUTES_PATH}/rl/judge", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text


def state(act: RunningGateway, version: int | None = None, wait: float = 0.0) -> dict[str, object]:
    """The activator's state (a long poll when ``version`` is given)."""
    params = {} if version is None else {"version": version, "waitSeconds": wait}
    document: dict[str, object] = httpx.get(f"{act.control}/v1/state", params=params, headers=AUTH,
                                            timeout=wait + 5).json()
    return document


def _send_all(url: str, count: int, headers: dict[str, str] | None = None) -> list[httpx.Response | Exception]:
    """``count`` judge requests at once (threads, one connection each); their answers or errors."""
    results: list[httpx.Response | Exception] = [RuntimeError("not sent")] * count

    def one(i: int) -> None:
        try:
            results[i] = httpx.post(f"{url}/generate", json={"text": f"held {i}"},
                                    headers={"host": HOST, **(headers or {})}, timeout=30)
        except Exception as exc:
            results[i] = exc
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_held_requests_are_reported_then_forwarded_to_the_first_replica_and_all_answered() -> None:
    with gateway_stack() as stack, run_activator() as act:
        route(act, [])
        before = state(act)
        results: list[httpx.Response | Exception] = []
        sender = threading.Thread(target=lambda: results.extend(_send_all(act.url, 8)))
        sender.start()
        woke = state(act, version=int(before["version"]), wait=10)  # type: ignore[call-overload]
        deadline = time.monotonic() + 10
        while state(act)["held"] != {"rl/judge": 8} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(act)["held"] == {"rl/judge": 8}
        assert woke["held"], "the first held request wakes a long poll (the operator acts at once)"
        time.sleep(0.2)  # every request held at least this long
        route(act, [f"127.0.0.1:{stack.port}"])
        sender.join()
        assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results), results
        answers = [r for r in results if isinstance(r, httpx.Response)]
        assert all(r.headers["connection"] == "close" for r in answers)
        assert all(0.2 <= float(r.headers[HELD_HEADER]) < 30 for r in answers), "each says how long it was held"
        assert state(act)["held"] == {}
        direct = httpx.post(f"{act.url}/generate", json={"text": "now"}, headers={"host": HOST})
        assert direct.status_code == 200, "with a replica serving, nothing waits"
        assert direct.headers.get_list(HELD_HEADER) == ["0.000"]
        assert len(direct.headers.get_list("date")) == 1, "the activator's date, not the replica's beside it"


def test_the_hold_queue_and_the_hold_time_are_bounded_with_a_retryable_503() -> None:
    with run_activator() as act:
        route(act, [], max_held=2, hold_timeout=1.0)
        results = _send_all(act.url, 3)
        codes = sorted((r.status_code, r.json()["error"]["reason"]) for r in results if isinstance(r, httpx.Response))
        assert codes == [(503, "holdQueueFull"), (503, "holdTimeout"), (503, "holdTimeout")], results
        assert all(r.headers.get("retry-after") for r in results if isinstance(r, httpx.Response))
        assert sorted((r.headers["retry-after"], r.headers["x-should-retry"]) for r in results
                      if isinstance(r, httpx.Response)) == [("1", "true"), ("5", "true"), ("5", "true")]


def test_unknown_hosts_and_control_calls_without_the_token_are_refused() -> None:
    with run_activator() as act:
        route(act, [])
        stranger = httpx.post(f"{act.url}/generate", json={"text": "x"}, headers={"host": "other.ns"})
        assert (stranger.status_code, stranger.json()["error"]["reason"]) == (404, "unknownPool")
        assert httpx.get(f"{act.control}/v1/state").status_code == 401
        assert httpx.put(f"{act.control}{ROUTES_PATH}/rl/judge", json={}).status_code == 401
        bad = httpx.put(f"{act.control}{ROUTES_PATH}/rl/judge", json={"hosts": ["a b"]}, headers=AUTH)
        assert bad.status_code == 400
        huge = httpx.post(f"{act.url}/generate", content=b"x" * (9 << 20), headers={"host": HOST})
        assert huge.status_code == 413


def test_the_clients_api_key_reaches_the_gateway() -> None:
    with tempfile.TemporaryDirectory() as directory:
        write_key(Path(directory), KEY)
        with keyed_stack(Path(directory)) as stack, run_activator() as act:
            route(act, [f"127.0.0.1:{stack.port}"])
            keyed = httpx.post(f"{act.url}/generate", json={"text": "k"}, headers={"host": HOST, **BEARER})
            assert keyed.status_code == 200
            bare = httpx.post(f"{act.url}/generate", json={"text": "k"}, headers={"host": HOST})
            assert bare.status_code == 401


def test_a_killed_activator_ends_its_held_connections_without_an_answer() -> None:
    with run_activator() as act:
        route(act, [])
        results: list[httpx.Response | Exception] = []
        sender = threading.Thread(target=lambda: results.extend(_send_all(act.url, 3)))
        sender.start()
        deadline = time.monotonic() + 10
        while state(act)["held"] != {"rl/judge": 3} and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(act.process.pid, signal.SIGKILL)
        sender.join()
        assert all(isinstance(r, httpx.TransportError) for r in results), results


def test_a_stopping_activator_keeps_what_it_holds_and_takes_traffic_until_the_propagation_window_ends() -> None:
    with gateway_stack() as stack, run_activator() as act:
        route(act, [])
        results: list[httpx.Response | Exception] = []
        senders = [threading.Thread(target=lambda: results.extend(_send_all(act.url, 2)))]
        senders[0].start()
        wait_held(act, {"rl/judge": 2})
        act.process.send_signal(signal.SIGTERM)
        senders.append(threading.Thread(target=lambda: results.extend(_send_all(act.url, 1))))
        senders[1].start()
        wait_held(act, {"rl/judge": 3})

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", act.port), timeout=1).close()
            except ConnectionRefusedError:
                return True
            return False
        wait_for("the traffic port to stop taking connections", refused, PROPAGATION_SECONDS + 5, interval=0.2)
        assert state(act)["held"] == {"rl/judge": 3}, "the control port stays open, the held stay held"
        assert act.process.poll() is None
        route(act, [f"127.0.0.1:{stack.port}"])
        for sender in senders:
            sender.join()
        assert [r.status_code if isinstance(r, httpx.Response) else r for r in results] == [200] * 3
        assert act.process.wait(10) == 0, "nothing held: it exits"


def test_a_hint_sent_at_zero_is_answered_at_once_and_reported_for_the_operator() -> None:
    with run_activator() as act:
        route(act, [])
        before = state(act)
        answer = httpx.post(f"{act.url}{DEMAND_PATH}", headers={"host": HOST},
                            json={"id": "phase-2", "requests": 100, "forSeconds": 60})
        assert (answer.status_code, answer.json()) == (202, {"id": "phase-2", "expiresInSeconds": 60})
        after = state(act)
        assert after["version"] != before["version"] and after["held"] == {}
        assert after["demand"] == {"rl/judge": [{"id": "phase-2", "requests": 100, "startsWithinSeconds": 0,
                                                 "forSeconds": 60}]}
        bad = httpx.post(f"{act.url}{DEMAND_PATH}", headers={"host": HOST}, json={"requests": -1})
        assert bad.status_code == 400


def test_a_client_that_leaves_while_held_is_forgotten_and_never_forwarded() -> None:
    with gateway_stack() as stack, run_activator() as act:
        route(act, [])
        body = b'{"text": "left"}'
        with socket.create_connection(("127.0.0.1", act.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: " + HOST.encode() + b"\r\ncontent-type: application/json"
                         b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            wait_held(act, {"rl/judge": 1})
        wait_held(act, {})
        route(act, [f"127.0.0.1:{stack.port}"])
        time.sleep(0.5)
        assert stack.state()["admittedTotal"] == 0, "a request nobody waits for is never judged"


def wait_held(act: RunningGateway, held: dict[str, int]) -> None:
    wait_for(f"held {held}", lambda: state(act), 10, interval=0.05, done=lambda now: now["held"] == held)


def test_host_values_are_matched_as_clients_send_them() -> None:
    assert host_key("Judge.RL.svc.cluster.local.:8000") == "judge.rl.svc:8000"
    assert host_key("judge.rl.svc.example.org") == "judge.rl.svc"
    assert host_key("10.96.0.12:8000") == "10.96.0.12:8000"
    assert host_key("[fd00::1]:8000") == "[fd00::1]:8000"
    with gateway_stack() as stack, run_activator() as act:
        body = {"hosts": ["Judge", "judge:8000", "judge.rl", "judge.rl.svc", "judge.rl.svc:8000"],
                "targets": [f"127.0.0.1:{stack.port}"], "maxHeld": 8, "holdTimeoutSeconds": 5}
        assert httpx.put(f"{act.control}{ROUTES_PATH}/rl/judge", json=body, headers=AUTH).status_code == 200
        for host in ("judge:8000", "JUDGE", "judge.rl.svc.cluster.local:8000", "judge.rl.svc.corp.internal."):
            answer = httpx.post(f"{act.url}/generate", json={"text": "x"}, headers={"host": host})
            assert answer.status_code == 200, (host, answer.text)
        twin = {**body, "hosts": ["judge", "judge.ml"]}
        assert httpx.put(f"{act.control}{ROUTES_PATH}/ml/judge", json=twin, headers=AUTH).status_code == 200
        ambiguous = httpx.post(f"{act.url}/generate", json={"text": "x"}, headers={"host": "judge"})
        assert ambiguous.status_code == 404, "a bare name two pools claim is nobody's"
        assert httpx.post(f"{act.url}/generate", json={"text": "x"}, headers={"host": "judge.ml"}).status_code == 200
        assert httpx.put(f"{act.control}{ROUTES_PATH}/a%20b/..", json=body, headers=AUTH).status_code == 404


def test_a_replica_that_drops_the_request_gets_a_502_and_a_route_removed_mid_body_a_503() -> None:
    with run_activator() as act, socket.create_server(("127.0.0.1", 0)) as rude:
        port = rude.getsockname()[1]

        def accept_and_close() -> None:
            conn, _ = rude.accept()
            conn.recv(65536)
            conn.close()
        threading.Thread(target=accept_and_close, daemon=True).start()
        route(act, [f"127.0.0.1:{port}"])
        dropped = httpx.post(f"{act.url}/generate", json={"text": "x"}, headers={"host": HOST})
        assert (dropped.status_code, dropped.json()["error"]["reason"]) == (502, "engineDisconnected")
        # Unmarked (UNMARKED_REASONS): the client's own policy decides, and nothing invites a wait.
        assert "x-should-retry" not in dropped.headers and "retry-after" not in dropped.headers
        body = b'{"text": "half"}'
        with socket.create_connection(("127.0.0.1", act.port)) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: " + HOST.encode() + b"\r\ncontent-type: application/json"
                         b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
            time.sleep(0.3)
            assert httpx.delete(f"{act.control}{ROUTES_PATH}/rl/judge", headers=AUTH).status_code == 200
            sock.sendall(body[5:])
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"poolRemoved" in answer, answer


def test_the_state_version_grows_when_the_held_count_falls_too() -> None:
    with run_activator() as act:
        route(act, [], hold_timeout=1.0)
        results: list[httpx.Response | Exception] = []
        sender = threading.Thread(target=lambda: results.extend(_send_all(act.url, 2)))
        sender.start()
        wait_held(act, {"rl/judge": 2})
        version = int(state(act)["version"])  # type: ignore[call-overload]
        sender.join()
        assert state(act, version=version, wait=5)["held"] == {}, "the operator hears that nothing is held"


def _exchange(sock: socket.socket, request: bytes) -> tuple[bytes, bytes]:
    """Send one request on ``sock`` and read its answer: (head, body), the body by its Content-Length."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"<eof>"
        assert not data.endswith(b"<eof>"), data
    head, _, body = data.partition(b"\r\n\r\n")
    fields = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in fields if line.startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head.lower(), body


def _post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def _listener_closed(act: RunningGateway) -> bool:
    try:
        socket.create_connection(("127.0.0.1", act.port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_at_the_stop_deadline_what_is_still_held_gets_a_retryable_503_and_the_activator_exits() -> None:
    deadline = PROPAGATION_SECONDS + 2.0
    with run_activator(f"--stop-deadline-seconds={deadline}") as act:
        route(act, [])  # a cold start that outlasts the deadline: no replica ever serves
        results: list[httpx.Response | Exception] = []
        sender = threading.Thread(target=lambda: results.extend(_send_all(act.url, 1)))
        sender.start()
        wait_held(act, {"rl/judge": 1})
        act.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        sender.join()
        answered = time.monotonic() - signalled
        [held] = results
        assert isinstance(held, httpx.Response), held
        assert (held.status_code, held.json()["error"]["reason"]) == (503, "draining"), held.text
        assert held.headers["retry-after"] and held.headers["connection"] == "close"
        assert deadline - 0.5 <= answered <= deadline + 2, answered
        assert act.process.wait(3) == 0, "nothing held any more: it exits at once"


def test_a_stopping_activator_closes_every_answer_and_refuses_kept_alive_requests_after_the_window() -> None:
    hint = _post(DEMAND_PATH, b'{"id": "p", "requests": 1, "forSeconds": 60}')
    with run_activator(f"--stop-deadline-seconds={PROPAGATION_SECONDS + 3}") as act, \
            socket.create_connection(("127.0.0.1", act.port)) as early, \
            socket.create_connection(("127.0.0.1", act.port)) as kept:
        route(act, [])
        for sock in (early, kept):
            head, _ = _exchange(sock, hint)
            assert head.startswith(b"http/1.1 202") and b"connection: close" not in head, head
        results: list[httpx.Response | Exception] = []
        sender = threading.Thread(target=lambda: results.extend(_send_all(act.url, 1)))
        sender.start()
        wait_held(act, {"rl/judge": 1})  # keeps the stopping activator running past the window
        act.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal handled, the window not over
        head, _ = _exchange(early, hint)
        assert head.startswith(b"http/1.1 202") and b"connection: close" in head, "within the window: closed after"
        wait_for("the traffic port to stop taking connections", lambda: _listener_closed(act),
                 PROPAGATION_SECONDS + 5, interval=0.2)
        head, body = _exchange(kept, _post("/generate", b'{"text": "late"}'))
        assert head.startswith(b"http/1.1 503") and b"retry-after: 1" in head and b"connection: close" in head, head
        assert b"x-should-retry: true" in head, head
        assert b"draining" in body, body
        assert state(act)["held"] == {"rl/judge": 1}, "refused, never held"
        sender.join()
        assert act.process.wait(5) == 0


def test_the_operators_waiting_state_poll_never_delays_a_stopping_activators_exit() -> None:
    with run_activator() as act:
        route(act, [])
        version = int(state(act)["version"])  # type: ignore[call-overload]
        polled: list[float] = []

        def poll() -> None:
            state(act, version=version, wait=30)
            polled.append(time.monotonic())
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.3)
        act.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert act.process.wait(PROPAGATION_SECONDS + 5) == 0
        poller.join()
        assert polled and polled[0] - signalled < PROPAGATION_SECONDS + 2, "the poll is answered at the exit"

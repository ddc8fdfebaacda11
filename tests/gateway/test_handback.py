"""Hand-back against a real gateway: shed calls and the maximum connection age close client
connections gently (``Connection: close`` on the next response, never a close under a client that
may be sending), lose no request, and are counted."""

from __future__ import annotations

import http.client
import threading
import time

import httpx
import pytest
from conftest import AUTH, Gateway, gateway_stack

pytestmark = pytest.mark.timeout(60)


def _connect(gateway: Gateway) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    connection.connect()
    return connection


def _judge(connection: http.client.HTTPConnection) -> http.client.HTTPResponse:
    connection.request("POST", "/generate", body=b'{"text": "judge"}', headers={"content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    return response


def _shed(gateway: Gateway, shed_id: str, connections: int, reason: str = "balance") -> httpx.Response:
    return httpx.post(f"{gateway.control}/v1/shed", headers=AUTH,
                      json={"shedId": shed_id, "connections": connections, "reason": reason})


def _handed_back(gateway: Gateway, reason: str) -> float:
    return gateway.metric(f'genrm_gateway_connections_handed_back_total{{reason="{reason}"}}')


def test_shed_hands_back_the_busiest_connections_gently() -> None:
    with gateway_stack() as stack:
        quiet, busy, busiest = _connect(stack), _connect(stack), _connect(stack)
        _judge(quiet)
        for _ in range(3):
            _judge(busy)
        for _ in range(8):
            _judge(busiest)
        assert stack.state()["clientConnections"] == 3
        assert httpx.post(f"{stack.control}/v1/shed", json={"shedId": "s1", "connections": 1,
                                                            "reason": "balance"}).status_code == 401
        answer = _shed(stack, "s1", 2)
        assert answer.status_code == 200 and answer.json() == {"shedId": "s1", "marked": 2}
        assert _shed(stack, "s1", 2).json()["marked"] == 2  # a retry marks nothing more
        state = stack.state()
        assert (state["clientConnections"], state["handingBack"]) == (1, 2)
        assert _handed_back(stack, "balance") == 2
        # The busy ones answer their next request in full, with Connection: close; the quiet one keeps going.
        for connection in (busy, busiest):
            assert _judge(connection).getheader("connection") == "close"
        for _ in range(3):
            assert _judge(quiet).getheader("connection") is None
        assert _shed(stack, "s2", 5, "load").json()["marked"] == 1
        # Idle now, and left open however long it idles: a close could cross a request the client is
        # sending at that moment. Its next request is answered in full, with Connection: close.
        assert stack.state()["clientConnections"] == 0
        quiet.sock.settimeout(1.5)
        with pytest.raises(TimeoutError):
            quiet.sock.recv(1)
        assert _judge(quiet).getheader("connection") == "close"
        assert stack.state()["inflight"] == 0
        assert stack.state()["handingBack"] == 0
        assert _shed(stack, "s3", 1, "sideways").status_code == 400


def test_maximum_connection_age_hands_back_a_busy_keep_alive_pool_without_losing_a_request() -> None:
    """A client pool sending back to back on kept-alive connections: every connection is handed back
    after about a second (jittered), by a response that carries Connection: close, and no request fails."""
    with gateway_stack("--max-connection-age-seconds", "1") as stack:
        failures: list[str] = []
        answered = 0
        stop = threading.Event()
        lock = threading.Lock()

        def send() -> None:
            nonlocal answered
            with httpx.Client() as client:
                while not stop.is_set():
                    try:
                        ok = client.post(f"{stack.url}/generate", json={"text": "x"}).status_code == 200
                    except httpx.HTTPError as exc:
                        failures.append(repr(exc))
                        continue
                    with lock:
                        answered += 1
                    if not ok:
                        failures.append("status")

        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(4)
        stop.set()
        for thread in threads:
            thread.join()
        handed = _handed_back(stack, "maxAge")
        assert failures == [] and answered > 50
        assert handed >= 4, handed  # every one of the pools' connections, at least once
        assert stack.state()["inflight"] == 0


def test_a_client_idle_between_requests_loses_nothing_to_the_age() -> None:
    """A client that pauses about a second between requests, around the age: a gateway that closed
    idle handed-back connections would now and then close one under the client's next request."""
    with gateway_stack("--max-connection-age-seconds", "0.3") as stack, httpx.Client() as client:
        for _ in range(8):
            assert client.post(f"{stack.url}/generate", json={"text": "x"}).status_code == 200
            time.sleep(1.0)
        assert _handed_back(stack, "maxAge") >= 4


def test_age_zero_turns_the_backstop_off() -> None:
    with gateway_stack("--max-connection-age-seconds", "0") as stack:
        connection = _connect(stack)
        for _ in range(3):
            _judge(connection)
        assert _handed_back(stack, "maxAge") == 0

"""An engine crash loses only what was in flight on it: a request that reaches a replica whose engine
is down goes to a peer replica the operator named (`genrm_contract.peers`), or is refused at once.

Real processes on loopback: gateways, each in front of its own simulator, told their peers over the
control port as the operator tells them. An engine is killed (SIGKILL) as a crash would end it. The
gateways run with ``--loopback-peers`` (their peers are on this host), but for the one that checks
that a loopback peer is refused by default.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from conftest import AUTH, Stack, gateway_stack
from genrm_contract.peers import FORWARDED_TO_HEADER, LOOP_HEADER, MAX_PEERS
from genrm_contract.sidecar import PROBE_PREFIX, RefusalReason
from genrm_testing import free_port, wait_ready

pytestmark = pytest.mark.timeout(120)

JUDGE = {"text": "Is 2+2=4?", "sampling_params": {"max_new_tokens": 4}}
LOOPBACK = "--loopback-peers"


def address(stack: Stack) -> str:
    return f"127.0.0.1:{stack.port}"


def tell_peers(stack: Stack, *peers: str, version: int = 1) -> httpx.Response:
    return httpx.post(f"{stack.control}/v1/peers", headers=AUTH, json={"version": version, "peers": list(peers)})


def crash_engine(stack: Stack) -> None:
    stack.sim.process.kill()
    stack.sim.process.wait()


def forwarded(stack: Stack, outcome: str) -> float:
    return stack.metric(f'genrm_gateway_forwarded_total{{outcome="{outcome}"}}')


def stacks(count: int) -> Iterator[list[Stack]]:
    with ExitStack() as stack:
        yield [stack.enter_context(gateway_stack(LOOPBACK)) for _ in range(count)]


@pytest.fixture
def pair() -> Iterator[list[Stack]]:
    yield from stacks(2)


@pytest.fixture
def trio() -> Iterator[list[Stack]]:
    yield from stacks(3)


@pytest.fixture(scope="module")
def told() -> Iterator[Stack]:
    """A gateway only ever told hostile or unroutable peers (its engine is never stopped), without
    ``--loopback-peers``."""
    with gateway_stack() as stack:
        yield stack


def test_requests_to_a_replica_whose_engine_crashed_are_answered_by_its_peer(pair: list[Stack]) -> None:
    crashed, peer = pair
    assert tell_peers(crashed, address(peer)).status_code == 200
    crash_engine(crashed)  # the first requests come before the gateway's poll has seen the crash
    with httpx.Client(timeout=10) as client:
        answers = [client.post(f"{crashed.url}/generate", json=JUDGE, headers={"x-request-id": f"job-{i}"})
                   for i in range(10)]
        models = client.get(f"{crashed.url}/v1/models")
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        assert answer.headers[FORWARDED_TO_HEADER] == address(peer)
        assert answer.headers["x-request-id"] == f"job-{i}"
        # The connection stays: a new one could find the Service without a ready endpoint.
        assert "connection" not in answer.headers
        assert answer.json()["meta_info"]["id"].startswith("gw")  # the peer gateway's own engine id
    assert models.status_code == 200 and models.headers[FORWARDED_TO_HEADER] == address(peer)
    assert forwarded(crashed, "served") == 11 and forwarded(crashed, "exhausted") == 0
    assert forwarded(peer, "served") == 0  # the peer served them itself, forwarding nothing
    assert peer.state()["completedTotal"] == 11
    assert crashed.state()["inflight"] == 0 and crashed.state()["completedTotal"] == 11
    # Served from the peer, the crashed replica still reports its engine down (it stays unready).
    assert httpx.get(f"{crashed.control}/healthz/ready").status_code == 503


def test_a_forwarded_stream_reaches_the_client_whole(pair: list[Stack]) -> None:
    crashed, peer = pair
    tell_peers(crashed, address(peer))
    crash_engine(crashed)
    body = {**JUDGE, "stream": True}
    with httpx.stream("POST", f"{crashed.url}/generate", json=body, timeout=10) as answer:
        events = [line for line in answer.iter_lines() if line.startswith("data:")]
        assert answer.status_code == 200 and answer.headers[FORWARDED_TO_HEADER] == address(peer)
    assert events[-1] == "data: [DONE]"


def test_without_peers_a_crashed_engine_is_a_retryable_503_at_once() -> None:
    with gateway_stack(LOOPBACK) as alone:
        crash_engine(alone)
        for _ in range(3):
            started = time.monotonic()
            answer = httpx.post(f"{alone.url}/generate", json=JUDGE, timeout=10)
            took = time.monotonic() - started
            assert answer.status_code == 503 and answer.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
            assert answer.headers["retry-after"] == "1" and answer.headers["connection"] == "close"
            assert took < 0.5, f"refused after {took:.2f} s"
        assert alone.state()["inflight"] == 0


def test_peers_that_refuse_connections_or_drain_are_passed_over(trio: list[Stack]) -> None:
    crashed, draining, serving = trio
    closed_port = f"127.0.0.1:{free_port()}"  # nothing listens: the connection is refused
    assert tell_peers(crashed, closed_port, address(draining), address(serving)).status_code == 200
    for phase in ("soft", "fence"):
        assert draining.drain("d", phase).status_code == 200
    wait_ready(f"{draining.control}/healthz/ready", status=503)
    crash_engine(crashed)
    answers = [httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10) for _ in range(6)]
    assert all(a.status_code == 200 and a.headers[FORWARDED_TO_HEADER] == address(serving) for a in answers)
    assert draining.state()["admittedTotal"] == 0  # refused at its admission, before any engine work
    assert serving.state()["completedTotal"] == 6
    # With only peers that do not take it, the refusal comes at once.
    tell_peers(crashed, closed_port, address(draining), version=2)
    started = time.monotonic()
    refused = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
    assert time.monotonic() - started < 0.5
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.headers["connection"] == "close" and FORWARDED_TO_HEADER not in refused.headers
    assert forwarded(crashed, "served") == 6 and forwarded(crashed, "exhausted") == 1


def test_a_forwarded_request_is_never_forwarded_again(pair: list[Stack]) -> None:
    """Two replicas whose engines are both down, each naming the other: the request goes from the
    first to the second, which refuses it at once instead of sending it back."""
    first, second = pair
    tell_peers(first, address(second))
    tell_peers(second, address(first))
    crash_engine(first)
    crash_engine(second)
    wait_ready(f"{second.control}/healthz/ready", status=503)
    started = time.monotonic()
    answer = httpx.post(f"{first.url}/generate", json=JUDGE, timeout=10)
    assert time.monotonic() - started < 0.5
    assert answer.status_code == 503 and answer.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
    assert forwarded(first, "exhausted") == 1
    assert forwarded(second, "served") == forwarded(second, "exhausted") == 0  # it forwarded nothing
    assert second.metric('genrm_gateway_refused_total{reason="engineUnavailable"}') == 1


def test_a_clients_marker_header_counts_for_nothing_and_its_loop_header_forgoes_the_forward(
        pair: list[Stack]) -> None:
    crashed, peer = pair
    tell_peers(crashed, address(peer))
    hostile = {LOOP_HEADER: "1", FORWARDED_TO_HEADER: "10.9.9.9:80"}
    served = httpx.post(f"{peer.url}/generate", json=JUDGE, headers=hostile, timeout=10)
    assert served.status_code == 200 and FORWARDED_TO_HEADER not in served.headers
    crash_engine(crashed)
    # The mark is the gateway's alone.
    answer = httpx.post(f"{crashed.url}/generate", json=JUDGE, headers={FORWARDED_TO_HEADER: "10.9.9.9:80"},
                        timeout=10)
    assert answer.status_code == 200 and answer.headers.get_list(FORWARDED_TO_HEADER) == [address(peer)]
    # Any loop header, tagged or not, means the request is never forwarded: only its sender loses.
    refused = httpx.post(f"{crashed.url}/generate", json=JUDGE, headers=hostile, timeout=10)
    assert refused.status_code == 503 and refused.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
    assert FORWARDED_TO_HEADER not in refused.headers


def test_two_replicas_holding_different_tokens_never_pass_a_request_back_and_forth() -> None:
    """A Secret rotated or re-created while the pods run: each gateway takes the other's tag for a
    client's. Both engines down, each naming the other: one hop, then a 503, nothing left in flight."""
    with gateway_stack(LOOPBACK, token="token-one") as first, gateway_stack(LOOPBACK, token="token-two") as second:
        tokens = {first.control: "token-one", second.control: "token-two"}
        for stack, other in ((first, second), (second, first)):
            told = httpx.post(f"{stack.control}/v1/peers", headers={"authorization": f"Bearer {tokens[stack.control]}"},
                              json={"version": 1, "peers": [address(other)]})
            assert told.status_code == 200
            crash_engine(stack)
        for stack in (first, second):
            wait_ready(f"{stack.control}/healthz/ready", status=503)
        started = time.monotonic()
        answer = httpx.post(f"{first.url}/generate", json=JUDGE, timeout=10)
        assert time.monotonic() - started < 1.0
        assert answer.status_code == 503 and answer.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
        assert forwarded(first, "exhausted") == 1
        assert forwarded(second, "served") == forwarded(second, "exhausted") == 0  # it forwarded nothing
        for stack in (first, second):
            state = httpx.get(f"{stack.control}/v1/state", headers={"authorization": f"Bearer {tokens[stack.control]}"})
            assert state.json()["inflight"] == 0 and state.json()["admittedTotal"] == 1


def test_a_verification_probe_is_never_answered_by_a_peer(pair: list[Stack]) -> None:
    crashed, peer = pair
    tell_peers(crashed, address(peer))
    crash_engine(crashed)
    wait_ready(f"{crashed.control}/healthz/ready", status=503)
    probe = {**JUDGE, "sampling_params": {"max_new_tokens": 4, "temperature": 0.7, "sampling_seed": 1}}
    answers = [httpx.get(f"{crashed.control}{PROBE_PREFIX}/model_info", headers=AUTH, timeout=10),
               httpx.post(f"{crashed.control}{PROBE_PREFIX}/generate", json=probe, headers=AUTH, timeout=10)]
    for answer in answers:
        assert answer.status_code == 503 and answer.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
        assert FORWARDED_TO_HEADER not in answer.headers
    assert peer.state()["admittedTotal"] == 0
    assert forwarded(crashed, "served") == forwarded(crashed, "exhausted") == 0


def test_peers_are_used_only_while_the_operator_is_in_touch() -> None:
    """A peer list is only as current as its sender: without an authenticated control call for the
    bound, the gateway refuses as with no peers (a listed IP may be another pod's by then)."""
    with gateway_stack(LOOPBACK, "--peers-valid-seconds", "1") as crashed, gateway_stack(LOOPBACK) as peer:
        tell_peers(crashed, address(peer))
        crash_engine(crashed)
        assert httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10).status_code == 200
        time.sleep(1.2)  # nothing authenticated on the control port meanwhile
        started = time.monotonic()
        refused = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
        assert time.monotonic() - started < 0.5
        assert refused.status_code == 503 and refused.headers["x-genrm-reason"] == RefusalReason.ENGINE_UNAVAILABLE
        assert refused.headers["retry-after"] == "1" and FORWARDED_TO_HEADER not in refused.headers
        assert forwarded(crashed, "served") == 1 and forwarded(crashed, "exhausted") == 0  # as with no peers
        crashed.state()  # the operator's state poll: in touch again
        again = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
        assert again.status_code == 200 and again.headers[FORWARDED_TO_HEADER] == address(peer)


def silent_address() -> tuple[str, list[socket.socket]]:
    """An address whose connections are never accepted (a full accept queue drops further SYNs), as
    a vanished pod's address may behave; the sockets to close afterwards."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    held = [hole]
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(hole.getsockname())
        held.append(filler)
    time.sleep(0.2)
    return f"127.0.0.1:{hole.getsockname()[1]}", held


def test_a_client_that_leaves_while_a_peer_does_not_accept_is_not_served_by_the_next() -> None:
    with gateway_stack(LOOPBACK) as crashed, gateway_stack(LOOPBACK, sim_args=("--sim-ttft-ms", "3000")) as peer:
        silent, held = silent_address()
        try:
            tell_peers(crashed, silent, address(peer))
            crash_engine(crashed)
            wait_ready(f"{crashed.control}/healthz/ready", status=503)
            with pytest.raises(httpx.ReadTimeout):  # gone while the first peer's connection is still pending
                httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=0.2)
            time.sleep(1.0)  # past the first peer's connect timeout: the next peer was never offered it
            assert peer.state()["admittedTotal"] == 0
            assert crashed.state()["inflight"] == 0
            assert forwarded(crashed, "clientGone") == 1 and forwarded(crashed, "served") == 0
        finally:
            for sock in held:
                sock.close()


def test_a_peer_that_breaks_is_the_peers_failure_not_this_engines() -> None:
    """A peer that takes the request and closes without an answer: 502 ``peerFailed``, counted as a
    failed forward, never as an engine refusal of this replica."""
    listener = socket.create_server(("127.0.0.1", 0))

    def take_and_drop() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=take_and_drop, daemon=True).start()
    with gateway_stack(LOOPBACK) as crashed:
        tell_peers(crashed, f"127.0.0.1:{listener.getsockname()[1]}")
        crash_engine(crashed)
        wait_ready(f"{crashed.control}/healthz/ready", status=503)
        answer = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
        assert answer.status_code == 502 and answer.headers["x-genrm-reason"] == RefusalReason.PEER_FAILED
        assert forwarded(crashed, "failed") == 1
        assert crashed.metric(f'genrm_gateway_refused_total{{reason="{RefusalReason.PEER_FAILED}"}}') == 1
        engine_reasons = [line for line in httpx.get(f"{crashed.control}/metrics").text.splitlines()
                          if line.startswith("genrm_gateway_refused_total") and "engineDisconnected" in line]
        assert engine_reasons == []
    listener.close()


def test_a_client_that_leaves_a_forwarded_request_has_it_aborted_on_the_peer() -> None:
    with gateway_stack(LOOPBACK) as crashed, gateway_stack(LOOPBACK, sim_args=("--sim-ttft-ms", "5000")) as peer:
        tell_peers(crashed, address(peer))
        crash_engine(crashed)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=0.5)

        def engine_requests() -> int:
            load = httpx.get(f"{peer.sim.url}/v1/loads").json()["loads"][0]
            return int(load["num_running_reqs"] + load["num_waiting_reqs"])

        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and (engine_requests() or crashed.state()["inflight"]):
            time.sleep(0.05)
        assert engine_requests() == 0
        assert crashed.state()["inflight"] == 0 and peer.state()["inflight"] == 0
        assert forwarded(crashed, "clientGone") == 1 and forwarded(crashed, "served") == 0


def test_an_older_push_never_replaces_a_newer_one(pair: list[Stack]) -> None:
    gateway, peer = pair
    newer = tell_peers(gateway, address(peer), version=7)
    assert newer.json() == {"version": 7, "peers": [address(peer)]}
    assert tell_peers(gateway, version=6).json() == {"version": 7, "peers": [address(peer)]}
    assert tell_peers(gateway, address(peer), version=7).json() == {"version": 7, "peers": [address(peer)]}
    assert tell_peers(gateway, version=8).json() == {"version": 8, "peers": []}
    crash_engine(gateway)
    answer = httpx.post(f"{gateway.url}/generate", json=JUDGE, timeout=10)
    assert answer.status_code == 503  # the newest document named no peer


@pytest.mark.parametrize("peers", [
    ["localhost:8000"], ["10.0.0.1"], ["http://10.0.0.1:8000"], ["10.0.0.1:0"], ["10.0.0.1:65536"],
    ["10.0.0.01:8000"], ["0.0.0.0:8000"], ["224.0.0.1:8000"], ["255.255.255.255:8000"], ["[::]:8000"],
    ["127.0.0.1:8000"], ["127.9.9.9:8000"], ["[::1]:8000"],
    ["::1:8000"], ["[fe80::1%eth0]:8000"], ["10.0.0.1:8000/x"], ["10.0.0.1:8000\r\nx: y"], ["10.0.0.1:+80"],
    ["10.0.0.1:8000", "10.0.0.1:8000"], [f"10.0.0.{i}:8000" for i in range(MAX_PEERS + 1)], [7],
])
def test_hostile_peer_documents_are_refused(told: Stack, peers: list[object]) -> None:
    answer = httpx.post(f"{told.control}/v1/peers", headers=AUTH, json={"version": 1, "peers": peers})
    assert answer.status_code == 400, answer.text
    assert answer.headers["x-genrm-reason"] == RefusalReason.BAD_REQUEST


def test_the_peers_route_wants_the_token_and_a_whole_document(told: Stack) -> None:
    url = f"{told.control}/v1/peers"
    assert httpx.post(url, json={"version": 1, "peers": []}).status_code == 401
    assert httpx.post(url, headers={"authorization": "Bearer nope"}, json={"version": 1}).status_code == 403
    for document in ({"peers": []}, {"version": -1}, {"version": 1, "peers": [], "extra": 1}, {"version": "x"}):
        assert httpx.post(url, headers=AUTH, json=document).status_code == 400, document
    assert httpx.post(url, headers=AUTH, json={"version": 1, "peers": ["[fd00::3]:8000"]}).status_code == 200


def test_requests_forwarded_at_once_from_many_clients_stay_within_admission(pair: list[Stack]) -> None:
    crashed, peer = pair
    tell_peers(crashed, address(peer))
    crash_engine(crashed)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=20) as client:
            return await asyncio.gather(*(client.post(f"{crashed.url}/generate", json=JUDGE) for _ in range(40)))

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * 40
    state = crashed.state()
    assert state["inflight"] == 0 and state["admittedTotal"] == state["completedTotal"] == 40

"""A blue/green judge switch at the gateway: a request pinned to a judge revision (``x-genrm-revision``)
is answered by that revision only; a replica fenced because the pool's judge changed refuses with
``judgeSwitched`` (retryable) and a pin to its own, retired revision with ``revisionRetired`` (final);
the operator tells the pool's revisions, which any client reads on the traffic port; a peer's answer of
another revision never reaches the client.

Real processes on loopback: gateways started as the operator starts them (``--judge-revision``) in front
of simulators with the same ``--weight-version``, driven on the control port as the operator drives them.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from conftest import AUTH, Stack, gateway_process, gateway_stack
from genrm_contract.peers import FORWARDED_TO_HEADER
from genrm_contract.revisions import REVISION_PATH, REVISIONS_PATH
from genrm_contract.sidecar import JUDGE_REVISION_FLAG, REVISION_HEADER, RefusalReason
from spy import running_spy

pytestmark = pytest.mark.timeout(120)

BLUE, GREEN = "3f9a0c1d2e", "4b1e9d0c7a"
"""The pool's judge revision before the switch, and after it."""
JUDGE = {"text": "Is 2+2=4?", "sampling_params": {"max_new_tokens": 4}}
LOOPBACK = "--loopback-peers"


@contextmanager
def judge_stack(revision: str, *args: str, sim_args: tuple[str, ...] = ()) -> Iterator[Stack]:
    """A replica of judge ``revision``: its gateway's flag and its engine's weight version."""
    with gateway_stack(LOOPBACK, JUDGE_REVISION_FLAG, revision, *args,
                       sim_args=("--weight-version", revision, *sim_args)) as stack:
        yield stack


@pytest.fixture(scope="module")
def blue() -> Iterator[Stack]:
    """A blue replica that tests leave Serving."""
    with judge_stack(BLUE) as stack:
        yield stack


@pytest.fixture
def slow_blue() -> Iterator[Stack]:
    """A blue replica of one's own (drained by the test) whose answers take 3 s."""
    with judge_stack(BLUE, sim_args=("--sim-ttft-ms", "3000")) as stack:
        yield stack


def pinned(revision: str) -> dict[str, str]:
    return {REVISION_HEADER: revision}


def refused(stack: Stack, reason: RefusalReason) -> float:
    """``genrm_gateway_refused_total`` for ``reason`` (no series before its first refusal)."""
    try:
        return stack.metric(f'genrm_gateway_refused_total{{reason="{reason}"}}')
    except KeyError:
        return 0.0


def error(answer: httpx.Response) -> tuple[int, str, str]:
    body = answer.json()["error"]
    assert answer.headers["x-genrm-reason"] == body["reason"]
    return answer.status_code, body["reason"], body["message"]


def fence(stack: Stack, drain_id: str, **extra: object) -> httpx.Response:
    """The operator's fence after its soft drain (so it fences at once), with a long quiet period: the
    replica stays Fenced, not Drained, and can still be undrained."""
    assert stack.drain(drain_id, "soft").status_code == 200
    return stack.drain(drain_id, "fence", quietSeconds=60, **extra)


def test_a_pin_to_this_replicas_revision_or_none_is_served_and_another_is_refused_before_any_work(
        blue: Stack) -> None:
    with httpx.Client(base_url=blue.url, timeout=10) as client:
        plain = client.post("/generate", json=JUDGE)
        same = client.post("/generate", json=JUDGE, headers=pinned(BLUE))
        admitted = blue.state()["admittedTotal"]
        before = refused(blue, RefusalReason.REVISION_RETIRED)
        other = client.post("/generate", json=JUDGE, headers=pinned(GREEN))
        after_refusal = client.post("/generate", json=JUDGE, headers=pinned(BLUE))
    assert plain.status_code == same.status_code == after_refusal.status_code == 200
    assert same.json()["meta_info"]["weight_version"] == same.headers[REVISION_HEADER] == BLUE
    assert error(other) == (409, RefusalReason.REVISION_RETIRED,
                            f"this pool answers with judge revision {BLUE}; revision {GREEN} is not served here")
    assert other.headers["x-should-retry"] == "false" and "retry-after" not in other.headers
    assert other.headers[REVISION_HEADER] == BLUE
    assert refused(blue, RefusalReason.REVISION_RETIRED) == before + 1
    assert blue.state()["admittedTotal"] == admitted + 1, "the refused request was never admitted"


def raw_exchange(stack: Stack, head: bytes) -> bytes:
    """A request with ``head``'s extra header lines on a fresh connection; the whole answer."""
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 11\r\n" + head + b"\r\n{\"text\":\"\"}")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
            if b"\r\n\r\n" in received:
                break
        return received


@pytest.mark.parametrize(("head", "status"), [
    (b"x-genrm-revision: a b\r\n", b"400"),
    (b"x-genrm-revision: -3f9a\r\n", b"400"),
    (b"x-genrm-revision: " + b"r" * 64 + b"\r\n", b"400"),
    (b"x-genrm-revision: 3f9a\xff\r\n", b"400"),
    (b"x-genrm-revision: \r\n", b"400"),
    (b"x-genrm-revision: " + BLUE.encode() + b"\r\nx-genrm-revision: " + BLUE.encode() + b"\r\n", b"400"),
    (b"x-genrm-revision: " + BLUE.encode() + b"\rx-injected: 1\r\n", b"400"),
    (b"x-genrm-revision: " + BLUE.encode() + b"\nx-injected: 1\r\n", b"400"),
])
def test_a_malformed_pin_is_a_400_before_admission_and_goes_nowhere(blue: Stack, head: bytes, status: bytes) -> None:
    """A pin is one revision as the contract spells it; anything else (a space, a flag-like or too long
    value, a byte beyond ASCII, none, two, a bare CR or LF that would split it) is refused, by the
    gateway's check or by its HTTP parser, and no part of it comes back in a header."""
    admitted = blue.state()["admittedTotal"]
    answer = raw_exchange(blue, head)
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    head_lines = answer.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")
    assert not any(line.startswith(b"x-injected") for line in head_lines)
    assert head_lines.count(f"{REVISION_HEADER}: {BLUE}".encode()) == 1, "the answer names this replica's revision"
    assert blue.state()["admittedTotal"] == admitted


def test_a_malformed_pin_the_gateway_reads_is_refused_as_an_invalid_header(blue: Stack) -> None:
    before = refused(blue, RefusalReason.INVALID_HEADER)
    answer = httpx.post(f"{blue.url}/generate", json=JUDGE, headers=pinned("a b"), timeout=10)
    status, reason, message = error(answer)
    assert (status, reason) == (400, RefusalReason.INVALID_HEADER) and REVISION_HEADER in message
    assert answer.headers["x-should-retry"] == "false"
    assert refused(blue, RefusalReason.INVALID_HEADER) == before + 1


def test_the_pin_never_reaches_the_engine() -> None:
    with running_spy() as spy, gateway_process(spy.url, JUDGE_REVISION_FLAG, BLUE, "--engine-poll-seconds",
                                               "3600") as gateway:
        mark = len(spy.seen)
        answer = httpx.post(f"{gateway.url}/generate", json=JUDGE, headers=pinned(BLUE), timeout=10)
        assert answer.status_code == 200 and answer.headers[REVISION_HEADER] == BLUE
        judged = spy.judged(mark)
    assert len(judged) == 1
    assert not [name for name, _ in judged[0].headers if name.lower().startswith("x-genrm")], judged[0].headers


def test_a_replica_fenced_for_a_judge_switch_refuses_with_the_switch_and_finishes_what_it_holds(
        slow_blue: Stack) -> None:
    stack = slow_blue
    answers: list[httpx.Response] = []
    running = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{stack.url}/generate", json=JUDGE, headers=pinned(BLUE), timeout=30)))
    running.start()
    time.sleep(0.5)  # admitted: the engine takes 3 s to answer
    plain = fence(stack, "genrm/blue-0").json()
    assert plain["state"] == "Fenced" and "drainReason" not in plain, "a drain without a reason is as before"
    draining = httpx.post(f"{stack.url}/generate", json=JUDGE, timeout=10)
    assert error(draining)[:2] == (503, RefusalReason.DRAINING)
    switched = stack.drain("genrm/blue-0", "fence", reason="judgeSwitched", activeRevision=GREEN)
    state = switched.json()
    assert switched.status_code == 200 and state["state"] == "Fenced" and state["drainReason"] == "judgeSwitched"
    assert state["version"] > plain["version"], "the reason landing is a change the operator's poll sees"
    assert state["inflight"] == 1
    # The drain's calls stay idempotent: the same again changes nothing, another drain is refused,
    # and a later call of this drain that names no reason keeps it.
    again = stack.drain("genrm/blue-0", "fence", reason="judgeSwitched", activeRevision=GREEN).json()
    assert again["version"] == state["version"] and again["drainReason"] == "judgeSwitched"
    assert stack.drain("genrm/other", "fence", reason="judgeSwitched").status_code == 409
    assert stack.drain("genrm/blue-0", "fence").json()["drainReason"] == "judgeSwitched"
    assert stack.state()["drainId"] == "genrm/blue-0"

    with httpx.Client(base_url=stack.url, timeout=10) as client:
        unpinned = client.post("/generate", json=JUDGE)
        own = client.post("/generate", json=JUDGE, headers=pinned(BLUE))
        other = client.post("/generate", json=JUDGE, headers=pinned(GREEN))
    assert error(unpinned) == (503, RefusalReason.JUDGE_SWITCHED, f"the pool's judge changed to {GREEN}; send again")
    assert unpinned.headers["retry-after"] == "1" and unpinned.headers["x-should-retry"] == "true"
    assert error(own) == (409, RefusalReason.REVISION_RETIRED,
                          f"judge revision {BLUE} is retired: the pool's judge changed to {GREEN}")
    assert own.headers["x-should-retry"] == "false" and "retry-after" not in own.headers
    assert error(other)[:2] == (409, RefusalReason.REVISION_RETIRED)
    for answer in (unpinned, own, other):
        assert answer.headers[REVISION_HEADER] == BLUE
    for answer in (unpinned, own):
        assert answer.headers["connection"] == "close", "the client's next connection reaches the new judge"
    running.join(30)
    assert answers[0].status_code == 200 and answers[0].headers[REVISION_HEADER] == BLUE
    assert refused(stack, RefusalReason.JUDGE_SWITCHED) == 1
    assert refused(stack, RefusalReason.REVISION_RETIRED) == 2

    # A rollback within the scale-down delay: Serving again, with no reason left.
    undrained = httpx.post(f"{stack.control}/v1/undrain", headers=AUTH, json={"drainId": "genrm/blue-0"})
    assert undrained.status_code == 200 and undrained.json()["state"] == "Serving"
    assert "drainReason" not in undrained.json()
    assert httpx.post(f"{stack.url}/generate", json=JUDGE, headers=pinned(BLUE), timeout=10).status_code == 200


def test_a_switch_fence_without_the_active_revision_names_the_one_the_operator_told(slow_blue: Stack) -> None:
    stack = slow_blue
    assert httpx.post(f"{stack.control}{REVISIONS_PATH}", headers=AUTH,
                      json={"active": GREEN}).status_code == 200
    assert fence(stack, "genrm/blue-1", reason="judgeSwitched").json()["drainReason"] == "judgeSwitched"
    answer = httpx.post(f"{stack.url}/generate", json=JUDGE, timeout=10)
    assert error(answer) == (503, RefusalReason.JUDGE_SWITCHED, f"the pool's judge changed to {GREEN}; send again")


def revision_document(stack: Stack) -> dict[str, object]:
    answer = httpx.get(f"{stack.url}{REVISION_PATH}", timeout=10)
    assert answer.status_code == 200 and answer.headers[REVISION_HEADER] == BLUE
    document: dict[str, object] = answer.json()
    return document


def test_the_pool_revisions_the_operator_tells_are_read_on_the_traffic_port(blue: Stack) -> None:
    def tell(document: dict[str, object]) -> httpx.Response:
        return httpx.post(f"{blue.control}{REVISIONS_PATH}", headers=AUTH, json=document, timeout=10)

    tell({})
    assert revision_document(blue) == {"revision": BLUE, "active": None, "preview": None, "role": None}
    told = tell({"active": BLUE, "preview": GREEN})
    assert told.status_code == 200 and told.json() == {"active": BLUE, "preview": GREEN}
    assert revision_document(blue) == {"revision": BLUE, "active": BLUE, "preview": GREEN, "role": "active"}
    assert tell({"active": GREEN}).status_code == 200
    assert revision_document(blue) == {"revision": BLUE, "active": GREEN, "preview": None, "role": "retiring"}
    assert tell({"active": GREEN, "preview": BLUE}).status_code == 200
    assert revision_document(blue)["role"] == "preview"
    other_method = httpx.post(f"{blue.url}{REVISION_PATH}", json={}, timeout=10)
    assert error(other_method)[:2] == (405, RefusalReason.METHOD_NOT_ALLOWED)
    assert other_method.headers["allow"] == "GET"


@pytest.mark.parametrize(("headers", "body", "status", "reason"), [
    ({}, b'{"active": "4b1e9d0c7a"}', 401, RefusalReason.UNAUTHENTICATED),
    ({"authorization": "Bearer wrong"}, b'{"active": "4b1e9d0c7a"}', 403, RefusalReason.FORBIDDEN),
    (AUTH, b'{"active": "4b1e9d0c7a", "pad": "' + b"x" * 70_000 + b'"}', 413, RefusalReason.BODY_TOO_LARGE),
    (AUTH, b'{"active": "4b1e 9d0c7a"}', 400, RefusalReason.BAD_REQUEST),
    (AUTH, b'{"active": "4b1e9d0c7a\\r\\nx-injected: 1"}', 400, RefusalReason.BAD_REQUEST),
    (AUTH, b'{"active": "4b1e9d0c7a", "preview": "4b1e9d0c7a"}', 400, RefusalReason.BAD_REQUEST),
    (AUTH, b'{"active": "4b1e9d0c7a", "role": "active"}', 400, RefusalReason.BAD_REQUEST),
    (AUTH, b'{"active": ', 400, RefusalReason.BAD_REQUEST),
])
def test_a_hostile_or_unauthenticated_revisions_push_changes_nothing(
        blue: Stack, headers: dict[str, str], body: bytes, status: int, reason: RefusalReason) -> None:
    assert httpx.post(f"{blue.control}{REVISIONS_PATH}", headers=AUTH, json={"active": BLUE}).status_code == 200
    before = revision_document(blue)
    answer = httpx.post(f"{blue.control}{REVISIONS_PATH}", headers={**headers, "content-type": "application/json"},
                        content=body, timeout=10)
    assert error(answer)[:2] == (status, reason)
    assert revision_document(blue) == before == {"revision": BLUE, "active": BLUE, "preview": None, "role": "active"}


@pytest.mark.parametrize("extra", [{"reason": "bored"}, {"activeRevision": GREEN},
                                   {"reason": "judgeSwitched", "activeRevision": "4b1e 9d0c7a"},
                                   {"reason": "judgeSwitched", "activeRevision": "4b1e\r\nx-injected: 1"}])
def test_a_drain_with_a_hostile_reason_is_a_400_and_drains_nothing(blue: Stack, extra: dict[str, str]) -> None:
    answer = blue.drain("genrm/blue-0", "fence", **extra)
    assert error(answer)[:2] == (400, RefusalReason.BAD_REQUEST)
    state = blue.state()
    assert state["state"] == "Serving" and state["drainId"] is None and "drainReason" not in state


def crash_engine(stack: Stack) -> None:
    stack.sim.process.kill()
    stack.sim.process.wait()


def tell_peers(stack: Stack, *peers: Stack, version: int) -> None:
    httpx.post(f"{stack.control}/v1/peers", headers=AUTH,
               json={"version": version, "peers": [f"127.0.0.1:{peer.port}" for peer in peers]}).raise_for_status()


def forwarded(stack: Stack, outcome: str) -> float:
    return stack.metric(f'genrm_gateway_forwarded_total{{outcome="{outcome}"}}')


def test_a_peers_answer_of_another_revision_never_reaches_the_client() -> None:
    """A peer list from across a switch (a green replica named to a blue one): the green peer judges,
    but its answer is dropped as a refusal would be, and the next peer of the client's revision answers."""
    with judge_stack(BLUE) as crashed, judge_stack(GREEN) as green, judge_stack(BLUE) as peer:
        tell_peers(crashed, green, version=1)
        crash_engine(crashed)
        alone = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
        assert error(alone)[:2] == (503, RefusalReason.ENGINE_UNAVAILABLE) and FORWARDED_TO_HEADER not in alone.headers
        assert alone.headers[REVISION_HEADER] == BLUE
        assert green.state()["completedTotal"] == 1, "the green peer answered; its verdict was dropped"
        assert forwarded(crashed, "exhausted") == 1
        tell_peers(crashed, green, peer, version=2)
        with httpx.Client(base_url=crashed.url, timeout=10) as client:
            answers = [client.post("/generate", json=JUDGE, headers=headers)
                       for headers in ({}, {}, pinned(BLUE), pinned(BLUE))]
        for answer in answers:
            assert answer.status_code == 200 and answer.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{peer.port}"
            assert answer.headers[REVISION_HEADER] == answer.json()["meta_info"]["weight_version"] == BLUE
        # Pinned, the green peer refuses the pin itself (409, green's answer): dropped all the same.
        assert green.state()["completedTotal"] == 2 and peer.state()["completedTotal"] == 4
        assert refused(green, RefusalReason.REVISION_RETIRED) == 1


def test_a_forwarded_request_keeps_its_pin_and_a_switched_peer_is_passed_over() -> None:
    """A blue replica whose engine is down forwards to a blue peer the switch fenced: an unpinned request
    meets its retryable ``judgeSwitched`` and is passed over; a pinned one carries its pin there and gets
    the peer's final ``revisionRetired``."""
    with judge_stack(BLUE) as crashed, judge_stack(BLUE) as retired:
        fence(retired, "genrm/blue-1", reason="judgeSwitched", activeRevision=GREEN)
        tell_peers(crashed, retired, version=1)
        crash_engine(crashed)
        unpinned = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
        own = httpx.post(f"{crashed.url}/generate", json=JUDGE, headers=pinned(BLUE), timeout=10)
    assert error(unpinned)[:2] == (503, RefusalReason.ENGINE_UNAVAILABLE)
    assert error(own) == (409, RefusalReason.REVISION_RETIRED,
                          f"judge revision {BLUE} is retired: the pool's judge changed to {GREEN}")
    assert own.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{retired.port}"


def test_a_replica_fenced_for_a_switch_hands_what_still_reaches_it_to_the_new_judge() -> None:
    """Told the new revision's replicas as peers, a fenced blue replica answers an unpinned request
    through a green one (the new judge's verdict, named green, the connection closed so the client's
    next request goes to green directly), counted in flight here meanwhile; a pinned one is still
    this retired revision's 409; without peers it is the retryable 503 as before."""
    with judge_stack(BLUE) as old, judge_stack(GREEN, sim_args=("--sim-ttft-ms", "1500")) as green:
        fence(old, "genrm/blue-2", reason="judgeSwitched", activeRevision=GREEN)
        alone = httpx.post(f"{old.url}/generate", json=JUDGE, timeout=10)
        assert error(alone)[:2] == (503, RefusalReason.JUDGE_SWITCHED)
        tell_peers(old, green, version=1)
        answers: list[httpx.Response] = []
        handed = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{old.url}/generate", json={**JUDGE, "sampling_params": {"max_new_tokens": 64}}, timeout=30)))
        handed.start()
        deadline = time.monotonic() + 5
        while old.state()["inflight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert old.state()["inflight"] == 1, "a handed-over request is in flight at the fenced replica"
        handed.join(30)
        [answer] = answers
        assert answer.status_code == 200 and answer.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{green.port}"
        assert answer.headers[REVISION_HEADER] == answer.json()["meta_info"]["weight_version"] == GREEN
        assert answer.headers["connection"] == "close"
        own = httpx.post(f"{old.url}/generate", json=JUDGE, headers=pinned(BLUE), timeout=10)
        assert error(own)[:2] == (409, RefusalReason.REVISION_RETIRED)
        assert green.state()["completedTotal"] == 1 and old.state()["inflight"] == 0


def test_a_request_pinned_to_the_new_judge_that_reaches_an_old_replica_is_handed_over_not_refused() -> None:
    """A client pinned to the new revision (its step saw it first) whose request a lagging kube-proxy
    sends to an old replica: told the new revision as the pool's active one and its replicas as peers,
    the old replica hands the request over, fenced or not yet; pinned to a third revision, still 409."""
    with judge_stack(BLUE) as old, judge_stack(GREEN) as green:
        assert httpx.post(f"{old.control}{REVISIONS_PATH}", headers=AUTH, json={"active": GREEN}).status_code == 200
        tell_peers(old, green, version=1)
        with httpx.Client(base_url=old.url, timeout=10) as client:
            before_fence = client.post("/generate", json=JUDGE, headers=pinned(GREEN))
            fence(old, "genrm/blue-3", reason="judgeSwitched", activeRevision=GREEN)
            after_fence = client.post("/generate", json=JUDGE, headers=pinned(GREEN))
            third = client.post("/generate", json=JUDGE, headers=pinned("5c2f8e1a9b"))
        for answer in (before_fence, after_fence):
            assert answer.status_code == 200 and answer.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{green.port}"
            assert answer.headers[REVISION_HEADER] == answer.json()["meta_info"]["weight_version"] == GREEN
            assert answer.headers["connection"] == "close"
        assert error(third)[:2] == (409, RefusalReason.REVISION_RETIRED)
        assert green.state()["completedTotal"] == 2

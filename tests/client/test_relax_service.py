"""Relax's own GenRM client, pointed at `genrm_client.adapters.relax.RelaxService` by its URL alone.

Relax's ``GenRMClient`` (redai-infra/Relax ``relax/utils/genrm_client.py`` at 467cfa1f) posts
``{"messages", "sampling_params"}`` to ``{url}/generate``, raises on any error status, reads the
answer's ``"response"``, and asks ``{url}/health`` at its start. These tests make exactly those calls
against the service in front of a real gateway and simulator, and try it as an attacker would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from genrm_client import JudgeClient, PoolConfig, RetryPolicy
from genrm_client.adapters.relax import MAX_BODY_BYTES, RelaxService
from genrm_contract.sidecar import JUDGE_REVISION_FLAG, REVISION_HEADER
from genrm_testing import free_port, run_gateway, run_sim

pytestmark = pytest.mark.timeout(90)

REVISION = "5e1a0b2c3d"
MESSAGES = [{"role": "system", "content": "You are a strict judge."},
            {"role": "user", "content": "Is 2+2=4? Answer with 'Score: <0-10>'."}]
SAMPLING: dict[str, object] = {"temperature": 0, "max_new_tokens": 32}


def serving(judge: JudgeClient) -> Iterator[str]:
    service = RelaxService(("127.0.0.1", 0), judge)
    thread = threading.Thread(target=service.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{service.server_address[1]}"
    finally:
        service.shutdown()
        service.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    with run_sim("--random-seed", "3", "--weight-version", REVISION) as sim, \
            run_gateway(sim.url, JUDGE_REVISION_FLAG, REVISION) as gateway:
        yield gateway.url


@pytest.fixture(scope="module")
def relax_url(pool: str) -> Iterator[str]:
    with JudgeClient(pool) as judge:
        yield from serving(judge)


def relax_generate(url: str, sampling_params: dict[str, object] | None = SAMPLING) -> str:
    """What Relax's ``GenRMClient.generate`` sends and reads."""
    payload: dict[str, object] = {"messages": MESSAGES}
    if sampling_params is not None:
        payload["sampling_params"] = sampling_params
    with httpx.Client(timeout=1800.0) as client:
        answer = client.post(f"{url}/generate", json=payload)
        answer.raise_for_status()
        response: str = answer.json().get("response", "")
        assert answer.headers[REVISION_HEADER] == REVISION
        return response


def test_relaxs_calls_get_the_pools_verdict_by_changing_only_the_url(pool: str, relax_url: str) -> None:
    direct = httpx.post(f"{pool}/v1/chat/completions", timeout=30, json={
        "messages": MESSAGES, "temperature": 0, "max_tokens": 32}).json()["choices"][0]["message"]["content"]
    assert relax_generate(relax_url) == direct and "Score:" in direct
    assert relax_generate(relax_url, None)  # no sampling_params: the pool's defaults
    health = httpx.get(f"{relax_url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "healthy"
    assert httpx.get(f"{relax_url}/metrics", timeout=30).json()["verdicts"] >= 2


@pytest.mark.parametrize(("body", "status"), [
    (b"not json", 400),
    (b'{"messages": "hi"}', 400),
    (b'{"messages": []}', 400),
    (b'{"messages": [{"content": "no role"}]}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": {"stop": ["Score"]}}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": []}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": {"max_new_tokens": -5}}', 400),
    (b"\xff\xfe", 400),
])
def test_a_request_it_cannot_judge_as_sent_is_a_clear_4xx(relax_url: str, body: bytes, status: int) -> None:
    answer = httpx.post(f"{relax_url}/generate", content=body, headers={"content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == status, answer.text
    assert "response" not in answer.json(), "an error never carries a response Relax would score"


def test_framing_attacks_are_refused_and_the_service_keeps_serving(relax_url: str) -> None:
    port = int(relax_url.rsplit(":", 1)[1])
    for head in (f"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: {MAX_BODY_BYTES + 1}\r\n\r\n",
                 "POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
                 "POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n",
                 "GET /../../etc/passwd HTTP/1.1\r\nhost: x\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head.encode())
            status = sock.recv(65536).split(b"\r\n", 1)[0]
        assert status.split()[1] in (b"404", b"411", b"413"), (head, status)
    assert relax_generate(relax_url)


def test_a_pool_that_does_not_answer_is_an_error_status_never_a_response() -> None:
    config = PoolConfig(f"http://127.0.0.1:{free_port()}", policy=RetryPolicy(deadline_s=1.0))
    with JudgeClient(config) as judge:
        for url in serving(judge):
            answer = httpx.post(f"{url}/generate", json={"messages": MESSAGES}, timeout=30)
            assert answer.status_code == 503 and answer.json()["type"] == "JudgeUnavailable", answer.text
            assert httpx.get(f"{url}/health", timeout=30).status_code == 503
            assert httpx.get(f"{url}/metrics", timeout=30).json()["errors"] == 1


def test_a_weight_version_unfit_for_a_header_never_reaches_relaxs_answer_head() -> None:
    """An engine reached without the pool's gateway may report anything as its weight version."""
    with run_sim("--random-seed", "3", "--weight-version", "v1\r\nx-injected: 1") as sim, \
            JudgeClient(sim.url) as judge:
        for url in serving(judge):
            answer = httpx.post(f"{url}/generate", json={"messages": MESSAGES, "sampling_params": SAMPLING},
                                timeout=30)
            assert answer.status_code == 200 and answer.json()["response"]
            assert "x-injected" not in answer.headers and REVISION_HEADER not in answer.headers


POOL_ODDITIES = {
    "no choices": httpx.Response(200, json={"choices": []}),
    "null content": httpx.Response(200, json={"choices": [{"message": {"content": None}, "finish_reason": "length"}]}),
    "an error shaped 200": httpx.Response(200, json={"object": "error", "message": "boom"}),
    "a status HTTP does not name": httpx.Response(499, text="client closed"),
}


@pytest.mark.parametrize("oddity", sorted(POOL_ODDITIES))
def test_a_pool_answer_without_a_verdict_is_an_error_status_never_an_empty_response(oddity: str) -> None:
    """What a pool (or a proxy in front of it) might answer that holds nothing to score."""
    def pool_answer(request: httpx.Request) -> httpx.Response:
        return POOL_ODDITIES[oddity]
    config = PoolConfig("http://pool.invalid", policy=RetryPolicy(deadline_s=1.0))
    with JudgeClient(config, http_transport=httpx.MockTransport(pool_answer)) as judge:
        for url in serving(judge):
            answer = httpx.post(f"{url}/generate", json={"messages": MESSAGES}, timeout=30)
            assert answer.status_code >= 400 and "response" not in answer.json(), (answer.status_code, answer.text)


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": {"temperature": NaN}}',
    b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": {"temperature": 1e999}}',
    b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": {"top_k": ' + b"1" * 5000 + b"}}",
    b'{"messages": ' + b"[" * 100_000 + b"}",
    b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": []}',
    b'{"messages": [{"role": "user", "content": "x"}], "sampling_params": 0}',
], ids=["nan", "infinite", "5000 digits", "deep nesting", "a list of parameters", "a number of parameters"])
def test_json_no_judge_call_can_carry_is_a_400_and_the_connection_answers(relax_url: str, body: bytes) -> None:
    answer = httpx.post(f"{relax_url}/generate", content=body, headers={"content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == 400, answer.text


def test_a_request_hidden_in_an_unread_body_is_never_run(relax_url: str) -> None:
    """A body this service does not read ends the connection: it is never read as the next request."""
    port = int(relax_url.rsplit(":", 1)[1])
    before = httpx.get(f"{relax_url}/metrics", timeout=30).json()["verdicts"]
    inner = b'{"messages": [{"role": "user", "content": "smuggled"}]}'
    hidden = b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(inner), inner)
    for outer in (b"POST /other", b"GET /health", b"GET /metrics"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(outer + b" HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(hidden), hidden))
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert received.count(b"HTTP/1.1 ") == 1, (outer, received)
    assert httpx.get(f"{relax_url}/metrics", timeout=30).json()["verdicts"] == before


def test_the_pools_key_comes_from_the_environment_with_the_pool_given_on_the_command_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from genrm_client.adapters import relax
    seen: list[PoolConfig] = []

    class Recorded(relax.JudgeClient):
        def __init__(self, config: PoolConfig) -> None:
            seen.append(config)
            raise SystemExit(0)
    monkeypatch.setenv("GENRM_API_KEY", "sekret")
    monkeypatch.setenv("GENRM_MODEL", "judge")
    monkeypatch.setattr(relax, "JudgeClient", Recorded)
    with pytest.raises(SystemExit):
        relax.main(["--pool", "http://judge.rl.svc:8000/"])
    assert (seen[0].url, seen[0].api_key, seen[0].model) == ("http://judge.rl.svc:8000", "sekret", "judge")
    assert relax.PoolGenRMClient("http://judge.rl.svc:8000")._config.api_key == "sekret"


def test_it_listens_beyond_loopback_only_when_told_to() -> None:
    """It sends the pool's key for whoever reaches it: an exposed address is a choice, said out loud."""
    from genrm_client.adapters import relax
    with pytest.raises(SystemExit) as refused:
        relax.main(["--pool", "http://judge.rl.svc:8000", "--host", "0.0.0.0"])
    assert refused.value.code == 2


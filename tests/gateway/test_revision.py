"""Provenance: every answer of a replica names its judge revision (``x-genrm-revision``), refusals
included, and the engine's ``weight_version`` says the same of each verdict.

Real processes on loopback: a gateway started as the operator starts it (``--judge-revision``) in
front of a simulator started with the engine arguments the operator gives (``--weight-version``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from conftest import AUTH, Stack, gateway_stack
from genrm_contract.peers import FORWARDED_TO_HEADER
from genrm_contract.sidecar import JUDGE_REVISION_FLAG, REVISION_HEADER
from genrm_gateway import cli as gateway_cli

pytestmark = pytest.mark.timeout(120)

REVISION = "3f9a0c1d2e"
JUDGE = {"text": "Is 2+2=4?", "sampling_params": {"max_new_tokens": 4}}


REVISED = ("--max-body-bytes", "4096", "--loopback-peers", JUDGE_REVISION_FLAG, REVISION)
"""The gateway's flags as the operator gives them (and a small body limit, for a refusal)."""
ENGINE = ("--weight-version", REVISION)
"""The engine's flag the operator adds to its arguments."""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with gateway_stack(*REVISED, sim_args=ENGINE) as running:
        yield running


def revisions(answer: httpx.Response) -> list[str]:
    return answer.headers.get_list(REVISION_HEADER)


def test_a_verdict_names_its_judge_in_the_header_and_in_the_engines_weight_version(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        native = client.post("/generate", json=JUDGE)
        chat = client.post("/v1/chat/completions", json={
            "model": "judge-sim", "messages": [{"role": "user", "content": "Is 2+2=4?"}], "max_tokens": 4})
        streamed = client.post("/generate", json={**JUDGE, "stream": True})
    assert native.status_code == chat.status_code == streamed.status_code == 200
    assert revisions(native) == revisions(chat) == revisions(streamed) == [REVISION]
    assert native.json()["meta_info"]["weight_version"] == REVISION
    assert chat.json()["metadata"]["weight_version"] == REVISION


def test_refusals_and_the_gateways_own_answers_name_the_judge_too(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        too_large = client.post("/generate", content=b"{" + b" " * 8192 + b"}",
                                headers={"content-type": "application/json"})
        unknown = client.get("/no/such/route")
        models = client.get("/v1/models")
    assert too_large.status_code == 413 and unknown.status_code == 404 and models.status_code == 200
    for answer in (too_large, unknown, models):
        assert revisions(answer) == [REVISION], (answer.status_code, answer.headers)


def test_a_request_refused_below_the_application_names_the_judge() -> None:
    """A head the connection layer refuses (no ASGI answer exists for it) gets the header as well."""
    with gateway_stack(*REVISED, sim_args=ENGINE) as stack, \
            socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n")
        head = sock.recv(65536).split(b"\r\n\r\n", 1)[0].decode().lower()
    assert head.startswith("http/1.1 400"), head
    assert f"{REVISION_HEADER}: {REVISION}" in head.split("\r\n"), head


def test_an_answer_a_peer_gave_carries_one_revision() -> None:
    """A peer's gateway sends its own header; the forwarding gateway's replaces it, never adds a second."""
    with gateway_stack(*REVISED, sim_args=ENGINE) as peer, gateway_stack(*REVISED, sim_args=ENGINE) as crashed:
        httpx.post(f"{crashed.control}/v1/peers", headers=AUTH,
                   json={"version": 1, "peers": [f"127.0.0.1:{peer.port}"]}).raise_for_status()
        crashed.sim.process.kill()
        crashed.sim.process.wait()
        answer = httpx.post(f"{crashed.url}/generate", json=JUDGE, timeout=10)
    assert answer.status_code == 200 and answer.headers[FORWARDED_TO_HEADER] == f"127.0.0.1:{peer.port}"
    assert revisions(answer) == [REVISION]
    assert answer.json()["meta_info"]["weight_version"] == REVISION


@pytest.mark.parametrize("bad", ["r1\r\nx-injected: 1", "r 1", "-r1", "r" * 64, "rev\x00"])
def test_a_revision_unfit_for_a_header_is_refused_at_start(bad: str) -> None:
    with pytest.raises(SystemExit):
        gateway_cli.build_parser().parse_args(["serve", JUDGE_REVISION_FLAG, bad])

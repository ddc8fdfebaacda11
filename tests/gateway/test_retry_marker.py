"""Every refusal says whether to retry it: ``x-should-retry: true`` with ``Retry-After`` for those that
come before any engine work, ``false`` for the rest, on every layer that writes one (the connection
protocol, the proxy, the routes, the demand board, the control port). The retryable ones are held in
test_drain, test_proxy and test_activator; the law itself in tests/client/test_wire.py."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from conftest import Stack, gateway_stack
from genrm_contract.sidecar import RefusalReason
from genrm_gateway.errors import refusal_response

pytestmark = pytest.mark.timeout(30)


def marker(response: httpx.Response) -> tuple[int, str, str, str | None]:
    return (response.status_code, response.headers["x-genrm-reason"], response.headers["x-should-retry"],
            response.headers.get("retry-after"))


def test_the_connection_layers_refusals_carry_the_marker() -> None:
    head = refusal_response(503, RefusalReason.TOO_MANY_CONNECTIONS, "full").split(b"\r\n\r\n")[0]
    assert b"x-should-retry: true\r\nretry-after: 1\r\n" in head and b"connection: close" in head
    head = refusal_response(431, RefusalReason.HEAD_TOO_LARGE, "large").split(b"\r\n\r\n")[0]
    assert b"x-should-retry: false\r\n" in head and b"retry-after" not in head


def test_a_real_gateways_final_refusals_say_do_not_retry(shared: Stack) -> None:
    url = shared.url
    assert marker(httpx.post(f"{url}/nowhere", json={})) == (404, "notFound", "false", None)
    assert marker(httpx.post(f"{url}/server_info", json={})) == (403, "notAllowed", "false", None)
    assert marker(httpx.get(f"{url}/generate")) == (405, "methodNotAllowed", "false", None)
    assert marker(httpx.post(f"{url}/generate", content=b"{", headers={"content-type": "application/json"})) == \
        (400, "invalidJson", "false", None)
    assert marker(httpx.post(f"{url}/generate", json={"text": "x" * 5000})) == (413, "bodyTooLarge", "false", None)
    assert marker(httpx.post(f"{url}/v1/genrm/demand", json={"requests": 0})) == (400, "badRequest", "false", None)
    assert marker(httpx.get(f"{shared.control}/v1/state")) == (401, "unauthenticated", "false", None)
    with socket.create_connection(("127.0.0.1", shared.port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 431") and b"x-should-retry: false" in head, head



def refused(stack: Stack, reason: str) -> float:
    try:
        return stack.metric(f'genrm_gateway_refused_total{{reason="{reason}"}}')
    except KeyError:
        return 0.0


def test_the_unmodified_openai_client_obeys_the_marker() -> None:
    """The ``openai`` client retries every 5xx by its status alone, twice by default. The 502 of an
    engine that died under the request carries no marker, so the client sends it again as it always
    did (a judge has no side effects: this is what keeps its requests whole through an engine crash);
    the 503 of an engine that is down is marked and retried after its Retry-After."""
    with gateway_stack(sim_args=("--sim-crash-after", "0", "--sim-ttft-ms", "50")) as stack, \
            openai.OpenAI(base_url=f"{stack.url}/v1", api_key="none", max_retries=2) as judge:
        chat = {"model": "judge", "messages": [{"role": "user", "content": "Is 2+2=4?"}], "max_tokens": 4}
        with pytest.raises(openai.InternalServerError) as crashed:
            judge.chat.completions.create(**chat)  # type: ignore[call-overload]
        assert (crashed.value.status_code, crashed.value.response.headers["x-should-retry"]) == (503, "true")
        assert (refused(stack, "engineDisconnected"), refused(stack, "engineUnavailable")) == (1, 2), \
            "the 502 sent again, then refused as the engine is down"

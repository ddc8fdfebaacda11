"""Judge traffic through a real gateway process: passthrough, refusals, engine failures, clients."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from typing import Any

import httpx
import openai
import pytest
from conftest import Stack, gateway_stack
from genrm_contract.sidecar import RefusalReason
from genrm_testing import run_sim, wait_ready

pytestmark = pytest.mark.timeout(30)

DECIMAL = re.compile(rb"-?\d+\.\d+(?:[eE][-+]?\d+)?")


def untimed(raw: bytes) -> bytes:
    """``raw`` with its decimal numbers blanked: SGLang's answers carry their request's timestamps and
    latencies (``meta_info``), which differ between any two requests, and no other decimals here."""
    return DECIMAL.sub(b"0.0", raw)


def without_timings(answer: dict[str, Any]) -> dict[str, Any]:
    """A native answer without its engine id and its ``meta_info`` timings (all its decimals)."""
    meta = {k: v for k, v in answer["meta_info"].items() if k != "id" and not isinstance(v, float)}
    return answer | {"meta_info": meta}


def test_proxies_with_gateway_request_ids_and_echoes_the_clients(shared: Stack) -> None:
    """The engine knows each request by an id the gateway minted; the client's id is echoed."""
    body = {"text": "judge: 1+1=2", "rid": "r-1", "sampling_params": {"temperature": 0}}
    direct = httpx.post(f"{shared.sim.url}/generate", json=body).json()
    proxied = httpx.post(f"{shared.url}/generate", json=body)
    assert proxied.status_code == 200 and proxied.headers["x-request-id"] == "r-1"
    engine_id = proxied.json()["meta_info"]["id"]
    assert engine_id != "r-1" and engine_id.startswith("gw")
    assert without_timings(proxied.json()) == without_timings(direct)
    again = httpx.post(f"{shared.url}/generate", json=body)  # the same client id twice: no engine conflict
    assert again.status_code == 200 and again.json()["meta_info"]["id"] not in (engine_id, "r-1")
    generated = httpx.post(f"{shared.url}/generate", json={"text": "x"})
    assert generated.json()["meta_info"]["id"] == generated.headers["x-request-id"]
    given = httpx.post(f"{shared.url}/generate", json={"text": "x"}, headers={"x-request-id": "abc"})
    assert given.headers["x-request-id"] == "abc" and given.json()["meta_info"]["id"] != "abc"
    assert httpx.get(f"{shared.url}/v1/models").json()["data"][0]["id"] == "judge-sim"


def test_streaming_passthrough_is_byte_identical(shared: Stack) -> None:
    body = {"text": "stream me", "rid": "s-1", "stream": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0}}

    def raw(url: str) -> bytes:
        with httpx.stream("POST", f"{url}/generate", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            return b"".join(response.iter_raw())

    proxied = raw(shared.url)
    engine_id = json.loads(proxied.split(b"\n", 1)[0].removeprefix(b"data: "))["meta_info"]["id"]
    assert engine_id.startswith("gw")
    assert untimed(proxied.replace(engine_id.encode(), b"s-1")) == untimed(raw(shared.sim.url))
    assert proxied.endswith(b"data: [DONE]\n\n")


def test_refusals_are_json_and_counted(shared: Stack) -> None:
    for path in ("/flush_cache", "/update_weights_from_disk", "/update_weights_from_ipc", "/start_profile"):
        response = httpx.post(f"{shared.url}{path}", json={})
        assert response.status_code in (403, 404)
        assert response.json()["error"]["reason"] == RefusalReason.NOT_ALLOWED
    unknown = httpx.get(f"{shared.url}/nope")
    assert unknown.status_code == 404 and unknown.json()["error"]["reason"] == RefusalReason.NOT_FOUND
    bad = httpx.post(f"{shared.url}/generate", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["reason"] == RefusalReason.INVALID_JSON
    assert httpx.post(f"{shared.url}/v1/completions", json=[1]).status_code == 400
    huge = httpx.post(f"{shared.url}/generate", json={"text": "x" * 5000})
    assert huge.status_code == 413 and huge.json()["error"]["reason"] == RefusalReason.BODY_TOO_LARGE
    # Chunked, no content-length, delivered in one piece: the limit still applies.
    chunked = httpx.post(f"{shared.url}/generate", content=iter([json.dumps({"text": "x" * 5000}).encode()]))
    assert chunked.status_code == 413 and chunked.json()["error"]["reason"] == RefusalReason.BODY_TOO_LARGE
    assert httpx.get(f"{shared.url}/generate").status_code == 405
    metrics = httpx.get(f"{shared.control}/metrics").text
    assert 'genrm_gateway_refused_total{reason="bodyTooLarge"} 2.0' in metrics
    assert 'genrm_gateway_requests_total{code="400",route="/generate"} 1.0' in metrics
    assert httpx.post(f"{shared.url}/generate", json={"text": "still serving"}).status_code == 200


def test_metrics_names(shared: Stack) -> None:
    httpx.post(f"{shared.url}/generate", json={"text": "x"})
    time.sleep(0.3)
    text = httpx.get(f"{shared.control}/metrics").text
    for name in ("genrm_gateway_inflight_requests", "genrm_gateway_requests_total{",
                 "genrm_gateway_request_duration_seconds_bucket{", "genrm_gateway_drain_state{state=\"Serving\"} 1.0",
                 "genrm_gateway_engine_up 1.0", "genrm_engine_running_requests", "genrm_engine_queued_requests",
                 "genrm_engine_kv_cache_usage_ratio"):
        assert name in text


def test_openai_client_works_through_the_gateway(shared: Stack) -> None:
    client = openai.OpenAI(base_url=f"{shared.url}/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(
        model="judge-sim", messages=[{"role": "user", "content": "grade this"}], temperature=0, max_tokens=40)
    assert "Score" in (completion.choices[0].message.content or "") or completion.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model="judge-sim", messages=[{"role": "user", "content": "grade this"}], temperature=0, max_tokens=40,
        stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == completion.choices[0].message.content


def test_engine_killed_mid_request_gives_502_and_inflight_returns_to_zero() -> None:
    # A short engine wait: the refusal below comes after it, and the default (5 s) is also the
    # client's default timeout, which made the refusal and the client's give-up a race.
    with gateway_stack("--engine-wait-seconds", "1", sim_args=("--sim-ttft-ms", "3000")) as stack:
        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(timeout=10) as client:
                request = asyncio.ensure_future(client.post(f"{stack.url}/generate", json={"text": "x"}))
                await asyncio.sleep(0.5)
                assert stack.metric("genrm_gateway_inflight_requests") == 1
                stack.sim.process.kill()
                return await request

        response = asyncio.run(scenario())
        assert response.status_code == 502
        assert response.json()["error"]["reason"] == RefusalReason.ENGINE_DISCONNECTED
        # Unmarked (UNMARKED_REASONS): nothing was refused and a judge has no side effects, so the
        # client's own policy decides; nothing invites a wait either.
        assert "x-should-retry" not in response.headers and "retry-after" not in response.headers
        assert stack.metric("genrm_gateway_inflight_requests") == 0
        # The engine is gone: unready at once, and new requests get a retryable refusal that
        # also closes the connection, so a retry can reach another replica.
        assert httpx.get(f"{stack.control}/healthz/ready").status_code == 503
        down = httpx.post(f"{stack.url}/generate", json={"text": "x"})
        assert down.status_code == 503 and down.json()["error"]["reason"] == RefusalReason.ENGINE_UNAVAILABLE
        assert down.headers["retry-after"] == "1" and down.headers["connection"] == "close"
        assert down.headers["x-should-retry"] == "true"
        assert httpx.get(f"{stack.control}/healthz/live").status_code == 200


def test_client_disconnect_aborts_the_engine_request() -> None:
    with gateway_stack(sim_args=("--sim-ttft-ms", "5000")) as stack:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{stack.url}/generate", json={"text": "x"}, timeout=0.4)
        deadline = time.monotonic() + 3
        def engine_requests() -> int:
            load = httpx.get(f"{stack.sim.url}/v1/loads").json()["loads"][0]
            return int(load["num_running_reqs"] + load["num_waiting_reqs"])

        while time.monotonic() < deadline and engine_requests():
            time.sleep(0.05)
        assert engine_requests() == 0
        assert stack.metric("genrm_gateway_inflight_requests") == 0
        assert stack.state()["admittedTotal"] == stack.state()["completedTotal"]


def test_sigterm_waits_for_inflight_requests() -> None:
    with gateway_stack(sim_args=("--sim-ttft-ms", "1200")) as stack:
        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(timeout=10) as client:
                slow = asyncio.ensure_future(client.post(f"{stack.url}/generate", json={"text": "x"}))
                await asyncio.sleep(0.3)
                stack.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)  # past the 0.2 s propagation window: fenced
                refused = await client.post(f"{stack.url}/generate", json={"text": "y"})
                return await slow, refused

        slow, refused = asyncio.run(scenario())
        assert slow.status_code == 200
        assert refused.status_code == 503 and refused.headers["x-genrm-reason"] == RefusalReason.DRAINING
        assert stack.process.wait(5) == 0


def test_a_reward_model_scores_a_batch_through_the_gateway() -> None:
    """SGLang wants one request id per prompt of a classification batch; the gateway mints them."""
    with gateway_stack(sim_args=("--sim-classifier",)) as stack:
        batch = {"text": ["Is 2+2=4? yes", "Is 2+2=5? yes"]}
        direct = httpx.post(f"{stack.sim.url}/classify", json=batch)
        proxied = httpx.post(f"{stack.url}/classify", json=batch)
        assert direct.status_code == proxied.status_code == 200, proxied.text
        scores = [a["embedding"][0] for a in proxied.json()]  # without deterministic inference: close, not equal
        assert scores == pytest.approx([a["embedding"][0] for a in direct.json()], rel=1e-3)
        openai_style = httpx.post(f"{stack.url}/v1/classify", json={"input": ["a", "b"], "model": "judge-sim"})
        assert openai_style.status_code == 200, openai_style.text


def test_a_request_that_finds_the_engine_restarting_waits_for_it_instead_of_failing() -> None:
    with gateway_stack("--engine-wait-seconds", "10", sim_args=("--sim-ttft-ms", "0")) as stack:
        port = stack.sim.port
        stack.sim.process.kill()
        stack.sim.process.wait()
        deadline = time.monotonic() + 5
        while httpx.get(f"{stack.control}/healthz/ready").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)

        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(timeout=20) as client:
                waiting = asyncio.ensure_future(client.post(f"{stack.url}/generate", json={"text": "x"}))
                await asyncio.sleep(1.0)
                assert not waiting.done()
                with run_sim("--random-seed", "3", "--port", str(port), ready_path=None):
                    return await waiting

        response = asyncio.run(scenario())
        assert response.status_code == 200


def test_a_waiting_request_goes_on_as_soon_as_the_restarted_engine_answers() -> None:
    """The poll interval is not added to an engine's restart: an unreachable engine is polled every
    ``DOWN_POLL_SECONDS``, so with a 5 s interval the request still goes on within a second."""
    with gateway_stack("--engine-wait-seconds", "20", "--engine-poll-seconds", "5",
                       sim_args=("--sim-ttft-ms", "0")) as stack:
        port = stack.sim.port
        stack.sim.process.kill()
        stack.sim.process.wait()
        wait_ready(f"{stack.control}/healthz/ready", seconds=8, status=503)

        async def scenario() -> tuple[httpx.Response, float]:
            async with httpx.AsyncClient(timeout=30) as client:
                waiting = asyncio.ensure_future(client.post(f"{stack.url}/generate", json={"text": "x"}))
                await asyncio.sleep(0.5)
                assert not waiting.done()
                with run_sim("--random-seed", "3", "--port", str(port), ready_path=None):
                    await asyncio.to_thread(wait_ready, f"http://127.0.0.1:{port}/ready")
                    back = time.monotonic()
                    response = await waiting
                    return response, time.monotonic() - back

        response, after = asyncio.run(scenario())
        assert response.status_code == 200
        assert after < 1.0, f"answered {after:.2f} s after the engine was back"

"""A client that leaves aborts its own engine request and no other, although SGLang aborts by prefix.

SGLang's scheduler aborts every request whose rid starts with the aborted rid; the simulator does
the same, so these tests fail for any id scheme in which one in-flight id starts another.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from conftest import Stack, gateway_stack

pytestmark = pytest.mark.timeout(60)

SINGLES = 300
BATCH_EVERY = 10  # every tenth request is a batch
BATCH_SIZE = 12  # more than ten members: ".1" would start ".10" and ".11"
NEW_TOKENS = 8


def counter(engine_rid: str) -> int:
    """The gateway's counter in one of its engine ids (``gw<12 hex>-<counter>``)."""
    return int(engine_rid.rsplit("-", 1)[1].split(".", 1)[0], 16)


def engine_requests(stack: Stack) -> int:
    load = httpx.get(f"{stack.sim.url}/v1/loads").json()["loads"][0]
    return int(load["num_running_reqs"] + load["num_waiting_reqs"])


def finishes(response: httpx.Response, streamed: bool) -> list[str]:
    """The finish reason of every answer in a response (one per batch member)."""
    if streamed:
        events = [json.loads(line[6:]) for line in response.text.splitlines()
                  if line.startswith("data: {")]
        last: dict[int, str] = {}
        for event in events:
            if event["meta_info"]["finish_reason"] is not None:
                last[event.get("index", 0)] = event["meta_info"]["finish_reason"]["type"]
        return list(last.values())
    body = response.json()
    return [item["meta_info"]["finish_reason"]["type"] for item in (body if isinstance(body, list) else [body])]


async def _scenario(stack: Stack) -> tuple[str, list[tuple[httpx.Response, bool, int]]]:
    limits = httpx.Limits(max_connections=SINGLES + 10, max_keepalive_connections=SINGLES + 10)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        victim_request = client.build_request("POST", f"{stack.url}/generate", json={
            "text": "victim", "stream": True, "sampling_params": {"max_new_tokens": NEW_TOKENS}})
        victim = await client.send(victim_request, stream=True)
        victim_rid = victim.headers["x-request-id"]

        async def one(index: int) -> tuple[httpx.Response, bool, int]:
            streamed = index % 3 == 1
            size = BATCH_SIZE if index % BATCH_EVERY == 0 else 1
            text: str | list[str] = [f"p{index}.{i}" for i in range(size)] if size > 1 else f"p{index}"
            response = await client.post(f"{stack.url}/generate", json={
                "text": text, "stream": streamed, "sampling_params": {"max_new_tokens": NEW_TOKENS}})
            return response, streamed, size

        others = [asyncio.ensure_future(one(i)) for i in range(SINGLES)]
        expected = 1 + sum(BATCH_SIZE if i % BATCH_EVERY == 0 else 1 for i in range(SINGLES))
        for _ in range(200):
            if engine_requests(stack) >= expected:
                break
            await asyncio.sleep(0.05)
        assert engine_requests(stack) == expected, "every request is in flight before the abort"
        await victim.aclose()  # the client leaves: the gateway aborts the victim's engine request
        for _ in range(100):
            if engine_requests(stack) == expected - 1:
                break
            await asyncio.sleep(0.02)
        assert engine_requests(stack) == expected - 1, "the victim, and only the victim, was aborted"
        return victim_rid, list(await asyncio.gather(*others))


def test_a_client_that_leaves_aborts_its_request_and_no_other() -> None:
    """Ids 1, 0x10, 0x100 and batches of twelve are in flight together; the client of id 1 leaves.
    Every other answer is whole: its finish reason is the model's, never ``abort``."""
    with gateway_stack(sim_args=("--sim-ttft-ms", "8000", "--sim-itl-ms", "1",
                                 "--max-running-requests", "2048")) as stack:
        victim_rid, answered = asyncio.run(_scenario(stack))
        assert counter(victim_rid) == 1
        counters = {counter(response.headers["x-request-id"]) for response, _, _ in answered}
        assert {0x10, 0x100} <= counters
        assert any(size > 1 and f"{counter(response.headers['x-request-id']):x}".startswith("1")
                   for response, _, size in answered)
        for response, streamed, size in answered:
            assert response.status_code == 200, response.text
            reasons = finishes(response, streamed)
            assert len(reasons) == size and set(reasons) <= {"length", "stop"}, (response.headers, reasons)
        assert engine_requests(stack) == 0

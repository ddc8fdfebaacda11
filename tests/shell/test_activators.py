"""The operator's side of the activators (``shell.activators.ActivatorFleet``) against a real
``genrm-gateway activator`` process, with the activator Service's EndpointSlices faked.

Aspects: the fleet finds the activators in their Service's ready endpoints and follows each one's
state; an activator stands in for a pool (is in ``view(key)``) only once it acknowledged the pool's
route, and that acknowledgement wakes the pool; held requests and hints sent at zero reach the
operator and wake the pool; a removed route is deleted; an activator that restarts (a new boot id)
is dropped from every pool's view until it is told the routes again, and every pool is woken; a
terminating activator stands in for no pool but is still followed and told the routes (what it
holds is released by them).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from genrm_contract.activator import PoolRoute
from genrm_operator.shell.activators import ActivatorFleet
from genrm_testing import CONTROL_TOKEN, RunningGateway, run_activator

HOST = "judge.rl"
ROUTE = PoolRoute(hosts=(HOST,), targets=(), hold_timeout_seconds=5, max_held=8)


class FakeKube:
    """The activator Service's EndpointSlice, naming the running activator at 127.0.0.1."""

    def __init__(self, activator: RunningGateway) -> None:
        self.slice: dict[str, Any] = {
            "ports": [{"name": "http", "port": activator.port}, {"name": "control", "port": activator.control_port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}

    async def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        return [self.slice]


async def until(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def following(kube: FakeKube) -> AsyncIterator[tuple[ActivatorFleet, list[str | None]]]:
    """A running fleet over ``kube``'s slice and the pools it woke, once it has seen its first state
    (a new boot id, every pool woken)."""
    woken: list[str | None] = []
    fleet = ActivatorFleet(kube, "genrm-system", "activator", CONTROL_TOKEN, woken.append)  # type: ignore[arg-type]
    running = asyncio.ensure_future(fleet.run())
    try:
        await until(lambda: None in woken)
        yield fleet, woken
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_fleet_follows_the_activators_and_stands_them_in_only_with_the_route() -> None:
    with run_activator() as act:
        async with following(FakeKube(act)) as (fleet, woken):
            assert fleet.view("rl/judge").addresses == (), "no route yet: it would answer 404"
            await fleet.push("rl/judge", ROUTE)
            assert fleet.view("rl/judge").addresses == ("127.0.0.1",) and fleet.view("rl/judge").port == act.port
            assert "rl/judge" in woken, "acknowledged: the pool's next step may list it"

            sent: list[httpx.Response] = []
            thread = threading.Thread(target=lambda: sent.append(httpx.post(
                f"{act.url}/generate", json={"text": "x"}, headers={"host": HOST}, timeout=10)))
            thread.start()
            woken.clear()
            await until(lambda: fleet.held("rl/judge") == 1)
            assert "rl/judge" in woken, "a request held at zero wakes the pool at once"
            async with httpx.AsyncClient() as client:
                await client.post(f"{act.url}/v1/genrm/demand", headers={"host": HOST},
                                  json={"id": "p1", "requests": 10, "forSeconds": 10})
            await until(lambda: [h.id for h in fleet.hints("rl/judge")] == ["p1"])

            await fleet.push("rl/judge", None)
            thread.join(10)
            assert sent and sent[0].status_code == 503, "the route was removed while it was held"
            assert fleet.view("rl/judge").addresses == ()


async def test_a_restarted_activator_is_dropped_from_every_pool_until_told_again() -> None:
    with run_activator() as first:
        kube = FakeKube(first)
        async with following(kube) as (fleet, woken):
            await fleet.push("rl/judge", ROUTE)
            assert fleet.view("rl/judge").addresses == ("127.0.0.1",)
            first.process.kill()
            first.process.wait()
            with run_activator() as second:
                kube.slice = FakeKube(second).slice
                woken.clear()
                await until(lambda: None in woken and fleet.view("rl/judge").addresses == (), 15)
                await fleet.push("rl/judge", ROUTE)
                assert fleet.view("rl/judge").addresses == ("127.0.0.1",)


async def test_a_terminating_activator_stands_in_for_no_pool_but_is_still_followed_and_told_the_routes() -> None:
    with run_activator() as act:
        kube = FakeKube(act)
        async with following(kube) as (fleet, woken):
            await fleet.push("rl/judge", ROUTE)
            sent: list[httpx.Response] = []
            thread = threading.Thread(target=lambda: sent.append(httpx.post(
                f"{act.url}/generate", json={"text": "x"}, headers={"host": HOST}, timeout=10)))
            thread.start()
            await until(lambda: fleet.held("rl/judge") == 1)
            kube.slice["endpoints"] = [{"addresses": ["127.0.0.1"],
                                        "conditions": {"ready": False, "serving": True, "terminating": True}}]
            woken.clear()
            await until(lambda: None in woken and fleet.view("rl/judge").addresses == ())
            assert fleet.held("rl/judge") == 1, "what it holds still counts (and wakes the pool)"
            await fleet.push("rl/judge", None)
            thread.join(10)
            assert sent and sent[0].status_code == 503, "the route change reached it"

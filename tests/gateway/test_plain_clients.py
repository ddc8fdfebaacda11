"""Zero loss for clients that know nothing of the drain protocol, behind a connection balancer.

Behind a Kubernetes Service, kube-proxy picks a backend per *connection* and keeps a connection on
the backend it picked. The balancer here does the same over two gateway+simulator replicas, and
stops picking a replica a moment after it is soft-drained (endpoint propagation). The clients are
what trainers really run, unmodified and with default settings: the ``openai`` client (sync and
async), an ``httpx.Client`` keep-alive pool (no retries) and a ``requests.Session``. Every request
must succeed while one replica goes Serving -> SoftDrain -> Fenced -> Drained.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import requests
from conftest import Stack, gateway_stack
from genrm_testing.balancer import Balancer, serving

pytestmark = pytest.mark.timeout(120)

PROPAGATION_SECONDS = 0.3
"""How long after the soft drain the balancer still picks the draining replica for new connections."""
SOFT_DRAIN_SECONDS = 1.5
"""The operator's propagation window: soft drain, then fence."""
JUDGE = {"text": "Is 2+2=4? Score 1-10.", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
CHAT = {"model": "judge-sim", "messages": [{"role": "user", "content": "Is 2+2=4? Score 1-10."}],
        "temperature": 0, "max_tokens": 8}


@dataclass
class Tally:
    name: str
    ok: int = 0
    failures: list[str] = field(default_factory=list)

    def record(self, call: Callable[[], object]) -> None:
        try:
            call()
            self.ok += 1
        except Exception as exc:  # every failure, whatever its kind, is a lost request
            self.failures.append(f"{type(exc).__name__}: {exc}"[:300])


def sync_loop(tally: Tally, call: Callable[[], object], stop: threading.Event) -> None:
    while not stop.is_set():
        tally.record(call)


def async_openai_loop(tally: Tally, base_url: str, stop: threading.Event, tasks: int = 4) -> None:
    async def worker(client: openai.AsyncOpenAI) -> None:
        while not stop.is_set():
            try:
                await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
                tally.ok += 1
            except Exception as exc:
                tally.failures.append(f"{type(exc).__name__}: {exc}"[:300])

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused") as client:
            await asyncio.gather(*(worker(client) for _ in range(tasks)))

    asyncio.run(main())


def checked(response: httpx.Response | requests.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text[:200]}")


def test_unmodified_clients_lose_nothing_while_a_replica_drains() -> None:
    with ExitStack() as stack:
        replicas: list[Stack] = [stack.enter_context(gateway_stack(
            "--propagation-seconds", str(SOFT_DRAIN_SECONDS), "--quiet-seconds", "0.3",
            sim_args=("--sim-ttft-ms", "5", "--sim-itl-ms", "1"))) for _ in range(2)]
        victim, survivor = replicas
        balancer = Balancer([victim.port, survivor.port])
        stack.enter_context(serving(balancer._connect, balancer.port))
        base = f"http://127.0.0.1:{balancer.port}"
        openai_sync = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        http = stack.enter_context(httpx.Client(base_url=base))
        session = stack.enter_context(requests.Session())
        tallies = {name: Tally(name) for name in ("openai", "openai-async", "httpx", "requests")}
        stop = threading.Event()
        threads = [
            threading.Thread(target=sync_loop, args=(
                tallies["openai"], lambda: openai_sync.chat.completions.create(**CHAT), stop)),
            threading.Thread(target=async_openai_loop, args=(tallies["openai-async"], f"{base}/v1", stop)),
            threading.Thread(target=sync_loop, args=(
                tallies["httpx"], lambda: checked(http.post("/generate", json=JUDGE)), stop)),
            threading.Thread(target=sync_loop, args=(
                tallies["requests"], lambda: checked(session.post(f"{base}/generate", json=JUDGE, timeout=30)),
                stop)),
        ]
        for thread in threads:
            thread.start()
        # Every client is under way before the drain starts: the first call of a client can take
        # more than a second on a busy machine (the openai client builds its models lazily).
        deadline = time.monotonic() + 30
        while min(tally.ok for tally in tallies.values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        before = {name: tally.ok for name, tally in tallies.items()}
        assert victim.drain("op-1", "soft").status_code == 200
        time.sleep(PROPAGATION_SECONDS)
        balancer.unpublish(victim.port)
        time.sleep(SOFT_DRAIN_SECONDS - PROPAGATION_SECONDS)
        assert victim.drain("op-1", "fence").status_code == 200
        deadline = time.monotonic() + 10
        while victim.state()["state"] != "Drained" and time.monotonic() < deadline:
            time.sleep(0.05)
        drained = victim.state()
        assert drained["state"] == "Drained"
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(30)
        openai_sync.close()
    for name, tally in tallies.items():
        assert tally.failures == [], (name, tally.failures[:5])
        assert before[name] > 0 and tally.ok > before[name], (name, before[name], tally.ok)
    # The victim served its share, and no request ever met its fence: every client had moved on.
    assert int(drained["admittedTotal"]) > 0 and drained["refusedTotal"] == 0, drained  # type: ignore[call-overload]

"""The drain protocol against a real gateway: auth, idempotency, readiness, zero loss under load."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest
from conftest import AUTH, TOKEN, Stack, gateway_stack
from genrm_contract.sidecar import IDLE_REPORT_SECONDS, OPERATOR_DRAIN_PREFIX, RefusalReason

pytestmark = pytest.mark.timeout(30)


def test_control_endpoints_need_the_token(shared: Stack) -> None:
    assert httpx.get(f"{shared.control}/v1/state").status_code == 401
    wrong = httpx.get(f"{shared.control}/v1/state", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 403 and wrong.json()["error"]["reason"] == RefusalReason.FORBIDDEN
    assert httpx.post(f"{shared.control}/v1/drain", json={"drainId": "x", "phase": "soft"}).status_code == 401
    assert httpx.post(f"{shared.control}/v1/undrain", json={"drainId": "x"},
                      headers={"authorization": "Bearer nope"}).status_code == 403
    state = shared.state()
    assert state["state"] == "Serving" and state["engine"]["healthy"] is True  # type: ignore[index]
    assert shared.drain("x", "sideways").status_code == 400


def test_drain_ids_are_idempotent_and_exclusive(fresh: Stack) -> None:
    assert httpx.get(f"{fresh.control}/healthz/ready").status_code == 200
    soft = fresh.drain("op-1/pod", "soft")
    assert soft.status_code == 200 and soft.json()["state"] == "SoftDrain"
    assert fresh.drain("op-1/pod", "soft").json()["state"] == "SoftDrain"
    assert fresh.drain("op-2/pod", "soft").status_code == 409
    ready = httpx.get(f"{fresh.control}/healthz/ready")
    assert ready.status_code == 503 and ready.json()["error"]["reason"] == RefusalReason.DRAINING
    served = httpx.post(f"{fresh.url}/generate", json={"text": "x"})
    assert served.status_code == 200 and served.headers["x-genrm-draining"] == "1"
    assert httpx.post(f"{fresh.control}/v1/undrain", headers=AUTH, json={"drainId": "op-2/pod"}).status_code == 409
    undrained = httpx.post(f"{fresh.control}/v1/undrain", headers=AUTH, json={"drainId": "op-1/pod"})
    assert undrained.status_code == 200 and undrained.json()["state"] == "Serving"
    assert httpx.post(f"{fresh.control}/v1/undrain", headers=AUTH, json={"drainId": "any"}).status_code == 200
    assert "x-genrm-draining" not in httpx.post(f"{fresh.url}/generate", json={"text": "x"}).headers
    # A fence with no soft drain before it soft-drains first, for the propagation window (0.2 s here).
    fenced = fresh.drain("op-3/pod", "fence", quietSeconds=0.1)
    assert fenced.status_code == 200 and fenced.json()["state"] == "SoftDrain"
    assert fresh.drain("op-3/pod", "fence").json()["state"] == "SoftDrain"  # a repeated call does not rush it
    served = httpx.post(f"{fresh.url}/generate", json={"text": "x"})
    assert served.status_code == 200 and served.headers["connection"] == "close"
    time.sleep(0.3)
    assert fresh.state()["state"] in ("Fenced", "Drained")
    refused = httpx.post(f"{fresh.url}/generate", json={"text": "x"})
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1" and refused.headers["x-genrm-reason"] == RefusalReason.DRAINING
    assert refused.headers["x-should-retry"] == "true"
    assert refused.json()["error"]["reason"] == RefusalReason.DRAINING
    deadline = time.monotonic() + 5
    while fresh.state()["state"] != "Drained" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fresh.state()["state"] == "Drained"
    assert fresh.drain("op-3/pod", "soft").json()["state"] == "Drained"
    assert httpx.post(f"{fresh.control}/v1/undrain", headers=AUTH, json={"drainId": "op-3/pod"}).status_code == 409


def test_drain_under_continuous_load_loses_nothing(fresh: Stack) -> None:
    """Clients hammer the gateway through soft drain and fence: every request is either answered
    200 or refused 503-draining; after the fence only refusals; Drained after the last answer."""
    outcomes: list[tuple[float, float, int, str]] = []  # (sent, done, status, reason)
    fenced_at: list[float] = []
    drained_at: list[float] = []

    async def client_loop(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            response = await client.post(f"{fresh.url}/generate",
                                         json={"text": "judge", "sampling_params": {"max_new_tokens": 8}})
            reason = response.headers.get("x-genrm-reason", "")
            outcomes.append((sent, time.monotonic(), response.status_code, reason))

    async def scenario() -> None:
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=32)) as client:
            loops = [asyncio.ensure_future(client_loop(client, stop)) for _ in range(16)]
            await asyncio.sleep(0.4)
            await client.post(f"{fresh.control}/v1/drain", headers=AUTH, json={"drainId": "d", "phase": "soft"})
            await asyncio.sleep(0.4)
            await client.post(f"{fresh.control}/v1/drain", headers=AUTH,
                              json={"drainId": "d", "phase": "fence", "quietSeconds": 0.3})
            fenced_at.append(time.monotonic())
            await asyncio.sleep(0.4)
            stop.set()
            while True:
                state = (await client.get(f"{fresh.control}/v1/state", headers=AUTH)).json()
                if state["state"] == "Drained":
                    drained_at.append(time.monotonic())
                    break
                await asyncio.sleep(0.02)
            await asyncio.gather(*loops)

    asyncio.run(scenario())
    statuses = {(status, reason) for _, _, status, reason in outcomes}
    assert statuses <= {(200, ""), (503, RefusalReason.DRAINING)}
    assert any(status == 200 for _, _, status, _ in outcomes)
    assert all(status == 503 for sent, _, status, _ in outcomes if sent > fenced_at[0])
    assert any(sent > fenced_at[0] for sent, _, _, _ in outcomes)
    last_answer = max(done for _, done, status, _ in outcomes if status == 200)
    assert drained_at[0] > last_answer
    state = fresh.state()
    assert state["inflight"] == 0 and state["admittedTotal"] == state["completedTotal"]
    assert state["refusedTotal"] == sum(1 for _, _, status, _ in outcomes if status == 503)


def _drain_command(stack: Stack, deadline: float, drain_id: str = "preStop") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genrm_gateway", "drain", "--wait", "--deadline-seconds", str(deadline),
         "--control-port", str(stack.control_port), "--propagation-seconds", "0.2", "--drain-id", drain_id],
        env=os.environ | {"GENRM_CONTROL_TOKEN": TOKEN}, capture_output=True, text=True, timeout=20)


def test_a_soft_drain_of_the_operators_keeps_the_replica_ready_until_the_fence(fresh: Stack) -> None:
    """The operator's soft drain comes after its unpublish, which is what takes the replica out of the
    Service; the replica still admits and answers Ready, so putting it back (undrain and publish) lists
    it at once. The fence makes it unready."""
    operator_drain = f"{OPERATOR_DRAIN_PREFIX}0b9e6f2a-pod-uid"
    assert fresh.drain(operator_drain, "soft").json()["state"] == "SoftDrain"
    assert httpx.get(f"{fresh.control}/healthz/ready").status_code == 200
    assert fresh.drain(operator_drain, "fence").status_code == 200
    ready = httpx.get(f"{fresh.control}/healthz/ready")
    assert ready.status_code == 503 and ready.json()["error"]["reason"] == RefusalReason.DRAINING


def test_prestop_drain_command_blocks_until_drained(fresh: Stack) -> None:
    assert _drain_command(fresh, 10).returncode == 0
    state = fresh.state()
    assert state["state"] == "Drained" and state["drainId"] == "preStop"


def test_prestop_waits_for_an_operator_drain_and_honours_its_deadline() -> None:
    # The slow request outlasts the command's start-up (a Python process importing the gateway's CLI,
    # seconds on a loaded machine) plus its 1 s deadline by a wide margin.
    with gateway_stack(sim_args=("--sim-ttft-ms", "8000")) as stack:
        assert stack.drain("operator-op", "soft").status_code == 200

        async def scenario() -> tuple[subprocess.CompletedProcess[str], int]:
            async with httpx.AsyncClient(timeout=20) as client:
                slow = asyncio.ensure_future(client.post(f"{stack.url}/generate", json={"text": "x"}))
                await asyncio.sleep(0.2)
                stack.drain("operator-op", "fence")
                result = await asyncio.to_thread(_drain_command, stack, 1.0)
                return result, (await slow).status_code

        result, slow_status = asyncio.run(scenario())
        assert result.returncode != 0  # the deadline passed while a request was in flight
        assert slow_status == 200
        assert stack.state()["drainId"] == "operator-op"
        assert _drain_command(stack, 10).returncode == 0


def test_a_state_poll_waits_for_a_change_of_version(fresh: Stack) -> None:
    """The operator's long poll: held while the version stays, answered as soon as it changes (by a
    drain call or by time alone, as the deferred fence and Drained come due), never holding a client
    without the token, and refusing waits outside the contract's bounds."""
    fresh.wait_reported_idle()
    first = fresh.state()
    version, boot = first["version"], first["bootId"]
    assert isinstance(version, int) and isinstance(boot, str) and boot

    def poll(**params: object) -> httpx.Response:
        return httpx.get(f"{fresh.control}/v1/state", headers=AUTH, params=params, timeout=10)

    started = time.monotonic()
    held = poll(version=version, waitSeconds=0.6)
    assert held.status_code == 200 and held.json()["version"] == version and time.monotonic() - started >= 0.55
    assert poll(version=version + 7, waitSeconds=5).json()["version"] == version  # a stale version: at once
    # Load alone (a served request, the replica idle again before anyone looks) is not a change of version.
    assert httpx.post(f"{fresh.url}/generate", json={"text": "x"}).status_code == 200
    time.sleep(IDLE_REPORT_SECONDS + 0.3)
    assert fresh.state()["version"] == version

    async def changes() -> tuple[dict[str, object], float, dict[str, object], float]:
        async with httpx.AsyncClient(headers=AUTH, timeout=10) as http:
            begun = time.monotonic()
            waiting = asyncio.ensure_future(http.get(f"{fresh.control}/v1/state",
                                                     params={"version": version, "waitSeconds": 5}))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            drained = await http.post(f"{fresh.control}/v1/drain", json={"drainId": "op/p", "phase": "fence",
                                                                        "quietSeconds": 0.1})
            assert drained.json()["version"] == version + 1  # the drain call's own answer is versioned too
            soft = (await waiting).json()
            soft_after = time.monotonic() - begun
            # The deferred fence (0.2 s propagation here) then Drained come with time, not with a call.
            later = await http.get(f"{fresh.control}/v1/state", params={"version": soft["version"], "waitSeconds": 5})
            return soft, soft_after, later.json(), time.monotonic() - begun

    soft, soft_after, later, later_after = asyncio.run(changes())
    assert soft["state"] == "SoftDrain" and soft["version"] == version + 1 and soft_after < 1.0
    assert later["state"] in ("Fenced", "Drained") and later["version"] > soft["version"] and later_after < 1.5
    assert later["bootId"] == boot
    # Bounds: no token, no wait; a negative, endless or non-numeric wait is a 400, not a held socket.
    assert httpx.get(f"{fresh.control}/v1/state", params={"version": 1, "waitSeconds": 5}).status_code == 401
    for bad in ({"version": 1, "waitSeconds": -1}, {"version": 1, "waitSeconds": 61},
                {"version": 1, "waitSeconds": "nan"}, {"version": -1}, {"version": "x"}):
        started = time.monotonic()
        refused = poll(**bad)
        assert refused.status_code == 400 and refused.json()["error"]["reason"] == RefusalReason.BAD_REQUEST, bad
        assert time.monotonic() - started < 1.0

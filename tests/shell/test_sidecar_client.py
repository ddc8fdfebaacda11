"""``genrm_operator.shell.sidecar.SidecarClient`` against stand-in sidecars on two loopback addresses.

Aspects under test: the state long poll sends the known version and the wait, with the pool's
token, and gives up (``None``, unknown) when the answer is later than the wait allows; a drain's
answer is the state it led to, and a refusal or a broken answer is ``None``; connections are kept
alive per address (each address's requests arrive on one connection) and several addresses are
served at once; no request leaves reference cycles behind for the garbage collector (checked in a
process of its own); every request
is counted once, by call and answer code, in ``genrm_operator_sidecar_requests_total``; verification
probes go to the judge routes under the control port's ``PROBE_PREFIX``, with the pool's token, and
an answer marked as another replica's fails them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from genrm_contract.peers import FORWARDED_TO_HEADER
from genrm_contract.sidecar import PROBE_PREFIX, DrainPhase, DrainRequest, DrainState, EngineReport, StateDocument
from genrm_operator.api.spec import VerificationSpec
from genrm_operator.shell.sidecar import DEFAULT_PROBES, STATE_SECONDS, Endpoint, NotItsOwn, SidecarClient
from prometheus_client import REGISTRY

STATE = StateDocument(state=DrainState.SERVING, drain_id=None, inflight=0, admitted_total=0, completed_total=0,
                      refused_total=0, engine=EngineReport(up=True, healthy=True, running_requests=0,
                                                           queued_requests=0, token_usage=0.0),
                      idle_since_seconds=1.0, boot_id="b", version=3)


class StandIn:
    """One address's sidecar: records (peer port, path, query, token) and answers as told."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, dict[str, str], str | None]] = []
        self.delay = 0.0
        self.drain_status = 200
        self.drain_body = STATE.model_dump_json(by_alias=True)
        self.headers: dict[str, str] = {}
        """Added to every answer."""

    async def handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername")[1] if request.transport else 0
        self.seen.append((peer, request.path, dict(request.query), request.headers.get("Authorization")))
        await asyncio.sleep(self.delay)
        if request.path == "/v1/drain":
            return web.Response(status=self.drain_status, text=self.drain_body, content_type="application/json",
                                headers=self.headers)
        return web.Response(text=STATE.model_dump_json(by_alias=True), content_type="application/json",
                            headers=self.headers)


@pytest.fixture
async def sidecars() -> AsyncIterator[list[tuple[StandIn, Endpoint]]]:
    runners, out = [], []
    for host in ("127.0.0.1", "127.0.0.2"):
        stand_in = StandIn()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", stand_in.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, host, 0).start()
        runners.append(runner)
        out.append((stand_in, Endpoint(host, runner.addresses[0][1], "token")))
    try:
        yield out
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_the_long_poll_carries_version_wait_and_token_and_an_overdue_answer_is_unknown(
        sidecars: list[tuple[StandIn, Endpoint]]) -> None:
    (stand_in, ep), _ = sidecars
    client = SidecarClient()
    try:
        assert await client.state(ep, 3, 0.5) == STATE
        assert stand_in.seen[-1][1:] == ("/v1/state", {"version": "3", "waitSeconds": "0.5"}, "Bearer token")
        assert await client.state(ep) == STATE and stand_in.seen[-1][2] == {}
        stand_in.delay = STATE_SECONDS + 0.3
        assert await client.state(ep, 3, 0.0) is None
    finally:
        await client.close()


async def test_a_drain_answers_the_state_it_led_to_and_a_refusal_or_garbage_is_unknown(
        sidecars: list[tuple[StandIn, Endpoint]]) -> None:
    (stand_in, ep), _ = sidecars
    client = SidecarClient()
    request = DrainRequest(drain_id="d-1", phase=DrainPhase.SOFT, quiet_seconds=1)
    try:
        assert await client.drain(ep, request) == STATE
        stand_in.drain_status = 409
        assert await client.drain(ep, request) is None
        stand_in.drain_status, stand_in.drain_body = 200, "{not json"
        assert await client.drain(ep, request) is None
    finally:
        await client.close()


async def test_connections_are_kept_per_address(sidecars: list[tuple[StandIn, Endpoint]]) -> None:
    client = SidecarClient()
    try:
        for _ in range(5):
            answers: list[Any] = await asyncio.gather(*(client.state(ep, 3, 0.0) for _, ep in sidecars))
            assert answers == [STATE, STATE]
        for stand_in, _ in sidecars:
            assert len({peer for peer, *_ in stand_in.seen}) == 1, "one kept-alive connection per address"
    finally:
        await client.close()


# The collector is the whole process's: in the full suite, threads that earlier tests leave running
# (a local cluster's watchers) make cyclic garbage of their own while this check runs, so it runs in
# a process of its own, where all the garbage there is can only be the requests'.
_ALONE = "GENRM_TEST_ALONE"

if os.environ.get(_ALONE) == "1":
    async def test_requests_leave_no_cycles(sidecars: list[tuple[StandIn, Endpoint]]) -> None:
        client = SidecarClient()
        try:
            for _ in range(2):  # warm: connections made, lazy imports done
                await asyncio.gather(*(client.state(ep) for _, ep in sidecars))
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    answers: list[Any] = await asyncio.gather(*(client.state(ep, 3, 0.0) for _, ep in sidecars))
                    assert answers == [STATE, STATE]
                assert gc.collect() == 0, "a request left cyclic garbage"
            finally:
                gc.enable()
        finally:
            await client.close()


def test_requests_leave_no_cycles_in_a_process_of_their_own() -> None:
    node = f"{__file__}::test_requests_leave_no_cycles"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
                            env=os.environ | {_ALONE: "1"}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-4000:] + result.stderr[-2000:]


def requests_counted(call: str, code: str) -> float:
    return REGISTRY.get_sample_value("genrm_operator_sidecar_requests_total", {"call": call, "code": code}) or 0.0


async def test_every_request_is_counted_once_by_call_and_code(sidecars: list[tuple[StandIn, Endpoint]]) -> None:
    (stand_in, ep), _ = sidecars
    labels = [("state", "200"), ("drain", "200"), ("drain", "409"), ("state", "error"), ("probe", "200")]
    before = {key: requests_counted(*key) for key in labels}
    client = SidecarClient()
    try:
        await client.state(ep, 3, 0.0)
        await client.state(ep)
        await client.drain(ep, DrainRequest(drain_id="d-1", phase=DrainPhase.SOFT, quiet_seconds=1))
        stand_in.drain_status = 409
        await client.drain(ep, DrainRequest(drain_id="d-1", phase=DrainPhase.SOFT, quiet_seconds=1))
        stand_in.delay = STATE_SECONDS + 0.3
        assert await client.state(ep) is None  # the answer came too late: a failed call, no code
        stand_in.delay = 0.0
        mark = len(stand_in.seen)
        assert len(await client.answers(ep, VerificationSpec())) == len(DEFAULT_PROBES)
        probes = stand_in.seen[mark:]  # the judge routes on the control port, with the control token
        assert {(path, token) for _, path, _, token in probes} == {
            (f"{PROBE_PREFIX}/model_info", "Bearer token"), (f"{PROBE_PREFIX}/generate", "Bearer token")}
    finally:
        await client.close()
    counted = {key: requests_counted(*key) - before[key] for key in labels}
    assert counted == {("state", "200"): 2, ("drain", "200"): 1, ("drain", "409"): 1, ("state", "error"): 1,
                       ("probe", "200"): 1 + len(DEFAULT_PROBES)}  # /model_info, then each probe


async def test_a_probe_answered_by_another_replica_fails_the_verification(
        sidecars: list[tuple[StandIn, Endpoint]]) -> None:
    (stand_in, ep), _ = sidecars
    stand_in.headers = {FORWARDED_TO_HEADER: "10.0.0.9:8000"}  # a gateway that forwarded the probe
    client = SidecarClient()
    try:
        with pytest.raises(NotItsOwn):
            await client.answers(ep, VerificationSpec())
    finally:
        await client.close()

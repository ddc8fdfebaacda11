"""The client against real processes: genrm-sim engines behind real gateways, behind a per-connection
balancer (kube-proxy's behaviour), on loopback ports. What a trainer sees while a replica drains, an
engine crashes, the pool refuses a request, a step announces itself, or the pool's judge changes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from genrm_client import (
    EngineFailed,
    JudgeClient,
    JudgeUnavailable,
    Refused,
    RetryPolicy,
    RevisionRetired,
    Unjudged,
    Verdict,
    generate,
)
from genrm_contract.sidecar import ENGINE_KEY_FILE, JUDGE_REVISION_FLAG
from genrm_testing import CONTROL_TOKEN, RunningGateway, RunningSim, run_gateway, run_sim
from genrm_testing.balancer import Balancer

pytestmark = pytest.mark.timeout(90)

AUTH = {"authorization": f"Bearer {CONTROL_TOKEN}"}
SAMPLING = {"max_new_tokens": 8, "temperature": 0}


@dataclass(frozen=True)
class Replica:
    sim: RunningSim
    gateway: RunningGateway

    def drain(self, phase: str, **extra: object) -> None:
        answer = httpx.post(f"{self.gateway.control}/v1/drain", headers=AUTH,
                            json={"drainId": "genrm/test", "phase": phase, "quietSeconds": 0.1, **extra})
        assert answer.status_code == 200, answer.text

    def state(self) -> dict[str, object]:
        document: dict[str, object] = httpx.get(f"{self.gateway.control}/v1/state", headers=AUTH).json()
        return document

    def refused(self, reason: str) -> float:
        found = re.search(rf'^genrm_gateway_refused_total\{{reason="{reason}"\}} (\S+)$',
                          httpx.get(f"{self.gateway.control}/metrics").text, re.M)
        return float(found.group(1)) if found else 0.0


@contextmanager
def replica(*gateway_args: str, sim_args: tuple[str, ...] = ()) -> Iterator[Replica]:
    with run_sim("--random-seed", "3", *sim_args, ready_path=None) as sim, \
            run_gateway(sim.url, *gateway_args) as gateway:
        yield Replica(sim, gateway)


def request_ids(balancer: Balancer) -> list[str]:
    """The ``x-request-id`` of every request the balancer carried, in connection order."""
    return [m.decode() for sent in balancer.sent for m in re.findall(rb"(?im)^x-request-id: (\S+)\r$", bytes(sent))]


def test_a_fenced_replicas_503_is_retried_after_retry_after_and_answered_by_another() -> None:
    with ExitStack() as stack:
        leaving, staying = (stack.enter_context(replica()) for _ in range(2))
        balancer = stack.enter_context(Balancer([leaving.gateway.port, staying.gateway.port]).running())
        leaving.drain("fence")
        deadline = time.monotonic() + 5
        while leaving.state()["state"] not in ("Fenced", "Drained") and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = httpx.post(f"{leaving.gateway.url}/generate", json={"text": "x"})
        assert (refused.status_code, refused.headers["x-should-retry"], refused.headers["retry-after"]) == \
            (503, "true", "1")
        client = stack.enter_context(JudgeClient(f"http://127.0.0.1:{balancer.port}", seed=1))
        verdict = client.generate("Is 2+2=4? Score 1-10.", sampling_params=SAMPLING)
        assert verdict.text and verdict.retries == {"unavailable": 1} and verdict.attempts == 2
        assert verdict.latency_s >= 1.0, "the retry waited for Retry-After"
        assert balancer.picks == {leaving.gateway.port: 1, staying.gateway.port: 1}
        assert request_ids(balancer) == [verdict.request_id] * 2, "both attempts carried the same id"
        assert leaving.refused("draining") >= 2


def test_an_engine_crash_mid_request_is_a_typed_error_never_a_number() -> None:
    with replica(sim_args=("--sim-crash-after", "1", "--sim-ttft-ms", "50")) as one, \
            JudgeClient(one.gateway.url, seed=1, policy=RetryPolicy(deadline_s=3)) as client:
        assert isinstance(client.generate("first", sampling_params=SAMPLING), Verdict)
        with pytest.raises(EngineFailed) as crashed:
            client.generate("second", sampling_params=SAMPLING)
        assert crashed.value.status == 502 and crashed.value.reason == "engineDisconnected"
        assert crashed.value.attempts == 1, "a request the engine may have judged is not sent again"
        results = client.judge_many([generate(f"after {i}", sampling_params=SAMPLING) for i in range(3)])
        assert all(isinstance(r, Unjudged) and isinstance(r.error, JudgeUnavailable) for r in results), results
        assert all(r.error.reason == "engineUnavailable" and r.error.retries for r in results  # type: ignore[union-attr]
                   if isinstance(r, Unjudged))


def test_refusals_are_not_retried(tmp_path: Path) -> None:
    (tmp_path / ENGINE_KEY_FILE).write_text("key-1")
    with replica("--engine-api-key-file", str(tmp_path / ENGINE_KEY_FILE), "--max-body-bytes", "4096") as one:
        with JudgeClient(one.gateway.url, "wrong-key") as stranger, pytest.raises(Refused) as refused:
            stranger.generate("x", sampling_params=SAMPLING)
        assert (refused.value.status, refused.value.reason, refused.value.attempts) == (401, "invalidApiKey", 1)
        with JudgeClient(one.gateway.url, "key-1") as client:
            assert client.generate("x", sampling_params=SAMPLING).text
            with pytest.raises(Refused) as too_large:
                client.generate("x" * 5000)
        assert (too_large.value.status, too_large.value.reason, too_large.value.attempts) == (413, "bodyTooLarge", 1)
        assert one.refused("invalidApiKey") == 1 and one.refused("bodyTooLarge") == 1


def test_a_step_announces_itself_and_reports_its_figures() -> None:
    with replica() as one, JudgeClient(one.gateway.url, seed=1) as client:
        with client.step(7, expected=64, within_s=30) as step:
            results = client.judge_many([generate(f"prompt {i}", sampling_params=SAMPLING) for i in range(24)])
            chat = client.chat([{"role": "user", "content": "Score this: 2+2=4"}], max_tokens=8)
        hints = one.state()["demand"]
        assert [(h["id"].endswith("-step-7"), h["requests"], h["forSeconds"]) for h in hints] == \
            [(True, 64, 30)], hints  # type: ignore[union-attr, index]
        assert all(isinstance(r, Verdict) for r in results) and chat.text
        report = step.report()
        assert (report.verdicts, report.unjudged, report.revision, report.hint_error) == (25, 0, "default", None)
        assert report.p50_s is not None and report.p99_s is not None and report.p50_s <= report.p99_s
        assert json.dumps(report.errors) == "{}"


def test_a_step_across_a_judge_switch_ends_in_revision_retired_and_the_next_step_judges_anew() -> None:
    """Blue/green: the Service (the balancer) flips from the blue replica to the green one, and the blue
    one is fenced for the switch. The running step, pinned to blue, gets RevisionRetired at once (never a
    green verdict, never retried); the next step, unpinned at its start, is judged by green, and a plain
    call that meets blue's retryable judgeSwitched is retried onto green."""
    blue, green = "3f9a0c1d2e", "4b1e9d0c7a"
    with ExitStack() as stack:
        old, new = (stack.enter_context(replica(JUDGE_REVISION_FLAG, revision, sim_args=("--weight-version", revision)))
                    for revision in (blue, green))
        service = stack.enter_context(Balancer([old.gateway.port]).running())
        client = stack.enter_context(JudgeClient(f"http://127.0.0.1:{service.port}", seed=1))
        with client.step(1) as running:
            assert client.generate("before", sampling_params=SAMPLING).revision == blue
            service.published = [new.gateway.port]
            old.drain("soft")
            old.drain("fence", reason="judgeSwitched", activeRevision=green)
            with pytest.raises(RevisionRetired) as retired:
                client.generate("after", sampling_params=SAMPLING)
        # The 409 ended the call: only a connection the fence closed under the request went before it.
        assert retired.value.status == 409 and set(retired.value.retries) <= {"closed"}
        assert retired.value.attempts == 1 + sum(retired.value.retries.values())
        assert blue in str(retired.value) and green in str(retired.value)
        assert running.report().errors == {"RevisionRetired": 1} and running.report().revision == blue
        with client.step(2) as renewed:
            assert client.generate("anew", sampling_params=SAMPLING).revision == green
            assert client.generate("pinned", sampling_params=SAMPLING).revision == green
        assert renewed.pin == green and renewed.report().verdicts == 2
        # A plain call whose connection the Service places on the fenced blue replica: retried onto green.
        flipping = stack.enter_context(Balancer([old.gateway.port, new.gateway.port]).running())
        with JudgeClient(f"http://127.0.0.1:{flipping.port}", seed=1) as plain:
            verdict = plain.generate("plain", sampling_params=SAMPLING)
        assert verdict.revision == green and verdict.retries == {"unavailable": 1}
        assert old.refused("judgeSwitched") == 1 and old.state()["drainReason"] == "judgeSwitched"

"""Both clients over an in-process transport: the headers every attempt sends, retries, typed errors,
batches with Unjudged in place, the window's reaction, and a step's demand hint and figures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
from genrm_client import (
    AsyncJudgeClient,
    EngineFailed,
    JudgeClient,
    MixedJudges,
    Refused,
    RetryPolicy,
    RevisionRetired,
    Unjudged,
    Verdict,
    WindowLaw,
    generate,
)

FAST = RetryPolicy(deadline_s=5, backoff_s=0.001, max_backoff_s=0.01)
Handler = Callable[[httpx.Request], httpx.Response]


def answer(text: str, version: str = "default") -> httpx.Response:
    return httpx.Response(200, json={"text": text, "meta_info": {"weight_version": version}})


def draining() -> httpx.Response:
    return httpx.Response(503, headers={"x-genrm-reason": "draining", "x-should-retry": "true",
                                        "retry-after-ms": "5"}, json={"error": {"message": "draining"}})


class Pool:
    """A scripted pool: answers from a queue, then ``default``; records every request it got."""

    def __init__(self, *script: httpx.Response | Exception, default: Handler | None = None) -> None:
        self.script = list(script)
        self.default = default or (lambda request: answer("7"))
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if self.script:
            item = self.script.pop(0)
            if isinstance(item, Exception):
                raise item
            return item
        return self.default(request)


def sync_client(pool: Pool, **settings: object) -> JudgeClient:
    return JudgeClient("http://pool", "key-1", seed=1, policy=FAST, http_transport=httpx.MockTransport(pool),
                       **settings)  # type: ignore[arg-type]


def async_client(pool: Pool, **settings: object) -> AsyncJudgeClient:
    return AsyncJudgeClient("http://pool", "key-1", seed=1, policy=FAST, http_transport=httpx.MockTransport(pool),
                            **settings)  # type: ignore[arg-type]


def test_sync_calls_retry_with_the_same_id_and_the_pools_key() -> None:
    pool = Pool(httpx.ConnectError("refused"), draining())
    with sync_client(pool, model="judge") as client:
        verdict = client.generate("x")
    assert verdict.text == "7" and verdict.retries == {"connect": 1, "unavailable": 1}
    ids = {request.headers["x-request-id"] for request in pool.seen}
    assert len(pool.seen) == 3 and ids == {verdict.request_id}
    assert {request.headers["authorization"] for request in pool.seen} == {"Bearer key-1"}
    assert json.loads(pool.seen[-1].content) == {"text": "x"}


def test_sync_chat_sends_the_model_and_params() -> None:
    pool = Pool(default=lambda request: httpx.Response(200, json={"choices": [{"message": {"content": "9"}}]}))
    with sync_client(pool, model="judge") as client:
        assert client.chat([{"role": "user", "content": "x"}], temperature=0).text == "9"
    assert pool.seen[0].url.path == "/v1/chat/completions"
    assert json.loads(pool.seen[0].content) == {"messages": [{"role": "user", "content": "x"}], "model": "judge",
                                                "temperature": 0}


def test_a_refusal_is_raised_at_once_and_never_a_number() -> None:
    pool = Pool(httpx.Response(400, headers={"x-genrm-reason": "invalidJson", "x-should-retry": "false"},
                               json={"error": {"message": "not JSON"}}))
    with sync_client(pool) as client, pytest.raises(Refused) as refused:
        client.classify("x")
    assert refused.value.status == 400 and refused.value.reason == "invalidJson" and len(pool.seen) == 1


def test_a_batch_keeps_order_and_puts_unjudged_where_a_call_failed() -> None:
    def judge(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["text"]
        if text == "crash":
            return httpx.Response(502, headers={"x-genrm-reason": "engineDisconnected"},
                                  json={"error": {"message": "engine died"}})
        return answer(text.upper())

    async def run() -> list[Verdict | Unjudged]:
        async with async_client(Pool(default=judge)) as client:
            return await client.judge_many([generate(t) for t in ("a", "crash", "b")])

    results = asyncio.run(run())
    assert isinstance(results[0], Verdict) and results[0].text == "A"
    assert isinstance(results[1], Unjudged) and isinstance(results[1].error, EngineFailed) and not results[1]
    assert isinstance(results[2], Verdict) and results[2].text == "B"


def test_a_step_sends_its_hint_pins_a_revision_and_reports() -> None:
    versions = iter(["a", "a", "b"])

    def judge(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/genrm/demand":
            return httpx.Response(202, json={"id": json.loads(request.content)["id"], "expiresInSeconds": 30})
        return answer("7", next(versions))

    pool = Pool(draining(), default=judge)
    with sync_client(pool) as client, client.step(12, expected=3, within_s=30) as step:
        client.generate("x")
        client.generate("y")
        with pytest.raises(MixedJudges):
            client.generate("z")
    hint = json.loads(pool.seen[1].content)
    assert pool.seen[0].url.path == pool.seen[1].url.path == "/v1/genrm/demand", "a hint is retried too"
    assert hint["id"].endswith("-step-12") and hint["requests"] == 3 and hint["forSeconds"] == 30
    report = step.report()
    assert (report.verdicts, report.unjudged, report.revision, report.hint_error) == (2, 1, "a", None)


def test_a_steps_calls_carry_its_pin_once_a_gateway_named_its_revision() -> None:
    """The first call goes unpinned; every later one of the step says which judge may answer it, and a
    pool that no longer serves that judge ends the call with RevisionRetired, sent once, counted."""
    def judge(request: httpx.Request) -> httpx.Response:
        if request.headers.get("x-genrm-revision") == "a1" and json.loads(request.content)["text"] == "late":
            return httpx.Response(409, headers={"x-genrm-reason": "revisionRetired", "x-should-retry": "false",
                                                "x-genrm-revision": "a1"},
                                  json={"error": {"message": "judge revision a1 is retired: the pool's judge "
                                                             "changed to b2"}})
        return httpx.Response(200, headers={"x-genrm-revision": "a1"}, json={"text": "7"})

    pool = Pool(default=judge)
    with sync_client(pool) as client:
        client.generate("before")
        with client.step(3) as step:
            client.generate("first")
            client.generate("second")
            with pytest.raises(RevisionRetired) as retired:
                client.generate("late")
        client.generate("after")
    pins = [(json.loads(r.content)["text"], r.headers.get("x-genrm-revision")) for r in pool.seen]
    assert pins == [("before", None), ("first", None), ("second", "a1"), ("late", "a1"), ("after", None)]
    assert "a1 is retired" in str(retired.value) and "b2" in str(retired.value) and retired.value.attempts == 1
    assert step.report().errors == {"RevisionRetired": 1} and step.report().revision == "a1"


def test_an_async_step_pins_its_later_calls_and_a_revision_from_the_body_is_never_sent() -> None:
    async def run(pool: Pool) -> None:
        async with async_client(pool) as client, client.step(4):
            await client.generate("first")
            await asyncio.gather(client.generate("second"), client.generate("third"))

    named = Pool(default=lambda request: httpx.Response(200, headers={"x-genrm-revision": "a1"}, json={"text": "7"}))
    asyncio.run(run(named))
    assert [r.headers.get("x-genrm-revision") for r in named.seen] == [None, "a1", "a1"]
    from_body = Pool()  # answers name weight_version "default" in their body, and no header
    asyncio.run(run(from_body))
    assert [r.headers.get("x-genrm-revision") for r in from_body.seen] == [None, None, None]


def test_a_refused_hint_does_not_stop_the_step() -> None:
    def judge(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/genrm/demand":
            return httpx.Response(429, headers={"x-genrm-reason": "tooManyHints", "x-should-retry": "false"})
        return answer("7")

    with sync_client(Pool(default=judge)) as client, client.step(1, expected=10) as step:
        client.generate("x")
    assert step.report().hint_error is not None and step.report().verdicts == 1


def test_async_batches_stay_within_the_window_and_shrink_it_on_overload() -> None:
    inflight, peak = 0, 0

    async def judge(request: httpx.Request) -> httpx.Response:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.002)
        inflight -= 1
        if json.loads(request.content)["text"] == "190" and not getattr(judge, "refused", False):
            judge.refused = True  # type: ignore[attr-defined]
            return httpx.Response(429, headers={"retry-after-ms": "1"})
        return answer("ok")

    async def run() -> tuple[list[Verdict | Unjudged], float]:
        async with AsyncJudgeClient("http://pool", seed=1, policy=FAST, window=WindowLaw(initial=8, maximum=16),
                                    http_transport=httpx.MockTransport(judge)) as client:
            done: list[int] = []
            results = await client.judge_many([generate(str(i)) for i in range(200)],
                                              progress=lambda n, total: done.append(n))
            assert done[-1] == 200
            return results, client.window.state.size

    results, size = asyncio.run(run())
    assert all(isinstance(r, Verdict) for r in results)
    assert 8 < peak <= 16, "the window grew from 8 on fast verdicts, never past its maximum"
    assert size < 12, "the late 429 halved it"


def test_async_step_counts_tasks_created_inside_it() -> None:
    async def run() -> int:
        async with async_client(Pool()) as client, client.step(5) as step:
            await asyncio.gather(*(client.generate(str(i)) for i in range(5)))
            return step.report().verdicts

    assert asyncio.run(run()) == 5


def test_the_pool_from_the_environment() -> None:
    from genrm_client import PoolConfig

    config = PoolConfig.from_env({"GENRM_URL": "http://judge.rl.svc:8000/", "GENRM_API_KEY": "k",
                                  "GENRM_MODEL": "judge", "GENRM_DEADLINE_SECONDS": "30"})
    assert (config.url, config.api_key, config.model, config.policy.deadline_s) == (
        "http://judge.rl.svc:8000", "k", "judge", 30.0)
    assert PoolConfig.from_env({"GENRM_URL": "http://j:8000"}).api_key is None
    with pytest.raises(RuntimeError, match="GENRM_URL"):
        PoolConfig.from_env({})

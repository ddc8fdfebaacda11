"""Each framework adapter called exactly as its framework calls it (signature, argument types, how
it is loaded and awaited; the versions read are in each adapter's docstring), over an in-process pool."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from genrm_client import AsyncJudgeClient, BadAnswer, JudgeClient, RetryPolicy
from genrm_client.adapters import judging
from genrm_client.errors import EngineFailed

FAST = RetryPolicy(deadline_s=2, backoff_s=0.001, max_backoff_s=0.01)


class Judge:
    """A pool whose judge scores by the response: ``Score: 8`` for "42", a broken engine for "crash",
    an answer without a score for "mumble"."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        content = body["messages"][-1]["content"]
        self.prompts.append(content)
        if "Response:" in content:  # the adapters' prompt: judge the response alone
            content = content.split("Response:", 1)[1].split("Reference answer:", 1)[0]
        if "crash" in content:
            return httpx.Response(502, headers={"x-genrm-reason": "engineDisconnected"})
        text = "I cannot say" if "mumble" in content else ("Score: 8" if "42" in content else "Score: 2")
        return httpx.Response(200, json={"choices": [{"message": {"content": text}}],
                                         "metadata": {"weight_version": "default"}})


@pytest.fixture
def judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[Judge]:
    pool = Judge()
    monkeypatch.setenv("GENRM_URL", "http://judge.rl.svc:8000")
    monkeypatch.setattr(judging, "sync_client", lambda: JudgeClient(
        "http://pool", policy=FAST, http_transport=httpx.MockTransport(pool)))
    clients: dict[int, AsyncJudgeClient] = {}

    def async_client() -> AsyncJudgeClient:
        loop = id(asyncio.get_running_loop())
        if loop not in clients:
            clients[loop] = AsyncJudgeClient("http://pool", policy=FAST, http_transport=httpx.MockTransport(pool))
        return clients[loop]

    monkeypatch.setattr(judging, "async_client", async_client)
    yield pool


def test_verl_awaits_compute_score_with_keywords_and_reads_score(judge: Judge) -> None:
    from genrm_client.adapters.verl import compute_score

    assert inspect.iscoroutinefunction(compute_score), "verl awaits it only when it is a coroutine function"
    extra_info = {"question": "What is 6 x 7?", "num_turns": None, "rollout_reward_scores": {}}

    async def naive_manager() -> Any:  # verl's NaiveRewardManager._compute_score_for_response
        return await compute_score(data_source="openai/gsm8k", solution_str="It is 42.", ground_truth="42",
                                   extra_info=extra_info, reward_router_address="10.0.0.3:30000",
                                   reward_model_tokenizer=object())

    async def dapo_manager() -> Any:  # verl's DAPORewardManager.run_single, without a router
        return await compute_score(data_source="math", solution_str="7", ground_truth="42", extra_info={},
                                   strict_box_verify=False)

    result = asyncio.run(naive_manager())
    assert result["score"] == 8.0 and set(result) == {"score", "judge_latency_s", "judge_retries"}
    assert "What is 6 x 7?" in judge.prompts[-1] and "It is 42." in judge.prompts[-1]
    assert asyncio.run(dapo_manager())["score"] == 2.0


def test_verl_gets_the_typed_error_not_a_zero(judge: Judge) -> None:
    from genrm_client.adapters.verl import compute_score

    with pytest.raises(EngineFailed):
        asyncio.run(compute_score(data_source="x", solution_str="crash", ground_truth="1", extra_info={}))
    with pytest.raises(BadAnswer):
        asyncio.run(compute_score(data_source="x", solution_str="mumble", ground_truth="1", extra_info={}))


def test_openrlhf_loads_the_file_and_calls_reward_func_in_a_thread(judge: Judge) -> None:
    from genrm_client.adapters import openrlhf

    # SingleTurnAgentExecutor.__init__: a remote_rm_url ending in .py, loaded by path
    spec = importlib.util.spec_from_file_location("reward_func", openrlhf.__file__)
    assert spec is not None and spec.loader is not None and openrlhf.__file__.endswith(".py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    async def fetch() -> list[Any]:  # _fetch_rewards_via_func: one sample per call, in a thread
        return await asyncio.gather(asyncio.to_thread(module.reward_func, ["Q: 6x7? A: 42"], ["Q: 6x7? A:"], ["42"]))

    rewards_info = asyncio.run(fetch())[0]
    rewards = rewards_info.get("rewards")
    assert list(rewards) == [8.0] and list(rewards_info.get("scores") or rewards) == [8.0]
    assert set(rewards_info["extra_logs"]) == {"judge_latency_s", "judge_retries"}
    assert "Question:\nQ: 6x7? A:\n\nResponse:\n 42\n" in judge.prompts[-1], "the response is the query less its prompt"


def test_openrlhf_raises_rather_than_a_made_up_reward(judge: Judge) -> None:
    from genrm_client.adapters.openrlhf import reward_func

    with pytest.raises(EngineFailed):
        reward_func(["p crash"], ["p"], ["1"])


@dataclass
class Sample:
    """The fields of slime's (and Relax's) ``Sample`` the hook reads."""

    prompt: str | list[dict[str, str]]
    response: str
    label: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    custom_rm_path: str | None = None


def load_function(path: str) -> Any:
    """slime's ``load_function``: a dotted path, module then attribute."""
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


@pytest.mark.parametrize("framework", ["slime", "relax"])
def test_slime_and_relax_await_rm_by_its_dotted_path(judge: Judge, framework: str) -> None:
    args = Namespace(custom_rm_path=f"genrm_client.adapters.{framework}.rm", rm_type=None, reward_key=None)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6 x 7?"}]

    async def async_rm() -> Any:  # slime's async_rm / Relax's RewardExecutor._execute_custom
        rm = load_function(args.custom_rm_path)
        assert inspect.iscoroutinefunction(rm)
        return await rm(args, Sample(messages, "42", "42"))

    assert asyncio.run(async_rm()) == 8.0
    assert "What is 6 x 7?" in judge.prompts[-1] and "be brief" not in judge.prompts[-1]


def test_slime_group_rm_returns_one_reward_per_sample_or_raises(judge: Judge) -> None:
    args = Namespace(custom_rm_path="genrm_client.adapters.slime.batched_rm", group_rm=True)
    rm = load_function(args.custom_rm_path)
    samples = [Sample("q", "42", "42"), Sample("q", "7", "42")]
    assert asyncio.run(rm(args, samples)) == [8.0, 2.0]
    with pytest.raises(EngineFailed):
        asyncio.run(rm(args, [Sample("q", "42", "42"), Sample("q", "crash", "42")]))


def test_relax_genrm_client_shape_over_the_pool(judge: Judge, monkeypatch: pytest.MonkeyPatch) -> None:
    from genrm_client.adapters import relax

    monkeypatch.setattr(relax, "AsyncJudgeClient", lambda config: AsyncJudgeClient(
        config, http_transport=httpx.MockTransport(judge)))
    client = relax.PoolGenRMClient("http://judge.rl.svc:8000", timeout=30.0)

    async def reward() -> str:  # Relax's reward code: await client.generate(messages, sampling_params)
        return await client.generate([{"role": "user", "content": "Is 42 right?"}],
                                     {"temperature": 0.3, "top_p": 0.9, "max_new_tokens": 16})

    assert asyncio.run(reward()) == "Score: 8"
    assert judge.bodies[-1] == {"messages": [{"role": "user", "content": "Is 42 right?"}], "temperature": 0.3,
                                "top_p": 0.9, "max_tokens": 16}
    assert client.health_check()["url"] == "http://judge.rl.svc:8000"
    assert relax.get_genrm_client() is relax.get_genrm_client()

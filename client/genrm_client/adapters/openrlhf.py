"""OpenRLHF: a reward file, ``--remote_rm_url <path of this file>``.

Read at OpenRLHF/OpenRLHF 04655bc3 (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``): a
``remote_rm_url`` ending in ``.py`` is loaded with ``importlib`` and its ``reward_func`` called in a
worker thread (``asyncio.to_thread``) with three lists of one sample each: ``queries`` (prompt and
response decoded together, str), ``prompts`` (str) and ``labels`` (``--label_key``'s values). The
result is read as a dict: ``rewards``, ``scores`` (else the rewards) and ``extra_logs``.

What changes for the trainer: OpenRLHF's own HTTP path tries 5 times a second apart and then leaves
the reward None. Here a call is retried only where the pool did not judge it, within the client's
deadline; a sample that cannot be judged raises the typed error, which OpenRLHF logs (and leaves
that sample's reward unset, its own rule), never a made-up number.
"""

from __future__ import annotations

from typing import Any

from genrm_client.adapters import judging
from genrm_client.errors import Unjudged


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """The judge's reward of each query's response (the query without its prompt), as OpenRLHF reads it."""
    responses = [query[len(prompt):] if query.startswith(prompt) else query
                 for query, prompt in zip(queries, prompts, strict=True)]
    requests = [judging.request(prompt, response, label)
                for prompt, response, label in zip(prompts, responses, labels, strict=True)]
    client = judging.sync_client()
    verdicts = [client.call(requests[0])] if len(requests) == 1 else client.judge_many(requests)
    rewards: list[float] = []
    for verdict in verdicts:
        if isinstance(verdict, Unjudged):
            raise verdict.error
        rewards.append(judging.score(verdict))
    figures = [judging.extra(v) for v in verdicts if not isinstance(v, Unjudged)]
    logs = {key: sum(f[key] for f in figures) / len(figures) for key in figures[0]} if figures else {}
    return {"rewards": _tensor(rewards), "scores": _tensor(rewards), "extra_logs": logs}


def _tensor(values: list[float]) -> Any:
    """A tensor where torch is installed (every OpenRLHF job), so the rewards are what its own reward
    functions return; a list otherwise."""
    try:
        import torch
    except ImportError:
        return values
    return torch.tensor(values, dtype=torch.float32)

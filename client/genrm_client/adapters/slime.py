"""slime: ``--custom-rm-path genrm_client.adapters.slime.rm`` (or ``.batched_rm`` with ``--group-rm``).

Read at THUDM/slime 0b420f1e (``slime/rollout/rm_hub/__init__.py``): ``async_rm`` loads the dotted
path (a sample's own ``custom_rm_path`` first) and awaits ``rm(args, sample, **kwargs)`` in the
rollout's event loop; with ``--group-rm``, ``batched_async_rm`` awaits ``rm(args, samples,
**kwargs)`` and expects one reward per sample. ``args`` is the run's argparse namespace; a
``Sample`` has ``prompt`` (str, or chat messages), ``response`` (str), ``label`` and ``metadata``.

What changes for the trainer: slime's ``remote_rm`` retries any exception 10 times, 4xx included;
here only what the pool did not judge is retried, with one adaptive window for the whole rollout
(the eval bursts of THUDM/slime#1582), and a sample that cannot be judged raises its typed error.
"""

from __future__ import annotations

from typing import Any

from genrm_client.adapters import judging
from genrm_client.errors import Unjudged


async def rm(args: Any, sample: Any, **kwargs: Any) -> float:
    """The judge's reward of one sample."""
    verdict = await judging.async_client().call(judging.request(sample.prompt, sample.response, sample.label))
    return judging.score(verdict)


async def batched_rm(args: Any, samples: list[Any], **kwargs: Any) -> list[float]:
    """The judge's reward of each sample of a group, in order (``--group-rm``); raises the first
    sample's error if any could not be judged (slime takes one list for the whole group)."""
    client = judging.async_client()
    verdicts = await client.judge_many(judging.request(s.prompt, s.response, s.label) for s in samples)
    rewards: list[float] = []
    for verdict in verdicts:
        if isinstance(verdict, Unjudged):
            raise verdict.error
        rewards.append(judging.score(verdict))
    return rewards

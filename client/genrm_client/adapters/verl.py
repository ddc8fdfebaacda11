"""verl: a custom reward function, ``custom_reward_function.path=<this file>``, ``.name=compute_score``.

Read at verl-project/verl 247f1ac2 (``verl/experimental/reward_loop/reward_manager/naive.py``, and
``dapo.py`` at volcengine/verl 13c4d3a4): the reward loop sees that ``compute_score`` is a coroutine
function and awaits it in its own event loop, with keyword arguments only: ``data_source`` (str),
``solution_str`` (the decoded response, str), ``ground_truth`` (from ``reward_model.ground_truth``),
``extra_info`` (dict, with ``num_turns`` and ``rollout_reward_scores`` added), then, when verl runs
reward servers of its own, ``reward_router_address`` and ``reward_model_tokenizer``, and for the
DAPO manager ``strict_box_verify``. A dict result needs ``score``; its other keys become
``reward_extra_info`` columns. The judge is this pool (``GENRM_URL``), whatever verl's router is.

What changes for the trainer: verl's router retries timeouts and connect errors only, so a pool's
retryable ``503`` (a draining replica) is an exception; here it is retried after its
``Retry-After``. A sample that cannot be judged raises the client's typed error, which fails the
step with its cause, rather than a reward of 0 that trains on the failure.
"""

from __future__ import annotations

from typing import Any

from genrm_client.adapters import judging


async def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                        extra_info: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, float]:
    """The judge's score of ``solution_str`` for the question in ``extra_info`` (``question`` or
    ``prompt``, as verl's data preprocessors write it), against ``ground_truth``."""
    info = extra_info or {}
    question = info.get("question", info.get("prompt", ""))
    verdict = await judging.async_client().call(judging.request(question, solution_str, ground_truth))
    return {"score": judging.score(verdict), **judging.extra(verdict)}

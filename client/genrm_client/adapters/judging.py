"""What every adapter shares: one client per process (and per event loop), the judge prompt, and
the score read from the judge's answer.

Why from the environment: a framework loads an adapter by path and calls it with its own arguments,
so the pool (``GENRM_URL``, ``GENRM_API_KEY``, ``GENRM_MODEL``; `genrm_client.config`), the prompt
(``GENRM_PROMPT``, a ``str.format`` template over ``{prompt}``, ``{response}`` and ``{label}``) and
the judge's sampling (``GENRM_MAX_TOKENS``) are set once for the job, e.g. in its Ray runtime
environment. Why a score is read strictly: a judge's answer with no score in it is a failure
(:class:`~genrm_client.errors.BadAnswer`), not a zero.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

from genrm_client.aio import AsyncJudgeClient
from genrm_client.calls import JudgeRequest, chat
from genrm_client.config import MODEL_ENV, PoolConfig
from genrm_client.errors import BadAnswer
from genrm_client.sync import JudgeClient
from genrm_client.verdict import Verdict

PROMPT_ENV = "GENRM_PROMPT"
MAX_TOKENS_ENV = "GENRM_MAX_TOKENS"
DEFAULT_PROMPT = (
    "You are a strict grader. Compare the response with the reference answer.\n\n"
    "Question:\n{prompt}\n\nResponse:\n{response}\n\nReference answer:\n{label}\n\n"
    "Reply with one line: 'Score: <number from 0 to 10>'."
)
_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)

_lock = threading.Lock()
_sync: JudgeClient | None = None
_async: WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncJudgeClient] = WeakKeyDictionary()


def sync_client() -> JudgeClient:
    """The process's blocking client (thread-safe; OpenRLHF calls from threads)."""
    global _sync
    with _lock:
        if _sync is None:
            _sync = JudgeClient(PoolConfig.from_env())
        return _sync


def async_client() -> AsyncJudgeClient:
    """The running event loop's client: an httpx async client belongs to one loop, and every hook
    call of a framework's loop shares it, and its window."""
    loop = asyncio.get_running_loop()
    client = _async.get(loop)
    if client is None:
        client = _async[loop] = AsyncJudgeClient(PoolConfig.from_env())
    return client


def request(prompt: Any, response: str, label: Any, environ: Mapping[str, str] = os.environ) -> JudgeRequest:
    """The chat request judging ``response`` to ``prompt`` against ``label``; a prompt given as chat
    messages is judged by its last user message."""
    template = environ.get(PROMPT_ENV) or DEFAULT_PROMPT
    content = template.format(prompt=_prompt_text(prompt), response=response, label="" if label is None else label)
    max_tokens = int(environ.get(MAX_TOKENS_ENV) or 512)
    return chat([{"role": "user", "content": content}], environ.get(MODEL_ENV) or None,
                temperature=0, max_tokens=max_tokens)


def score(verdict: Verdict) -> float:
    """The judge's score: the last ``Score: <n>`` of its text."""
    found = _SCORE.findall(verdict.text)
    if not found:
        raise BadAnswer(f"the judge's answer names no score (request {verdict.request_id}): "
                        f"{verdict.text[-200:]!r}")
    return float(found[-1])


def extra(verdict: Verdict) -> dict[str, float]:
    """Per-sample figures a framework logs beside the reward."""
    return {"judge_latency_s": verdict.latency_s, "judge_retries": float(sum(verdict.retries.values()))}


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else str(prompt)
    return str(prompt)

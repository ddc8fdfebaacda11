"""Relax: ``--custom-rm-path genrm_client.adapters.relax.rm``, and a stand-in for its ``GenRMClient``.

Read at redai-infra/Relax 01a34ea5 (``relax/engine/rewards/__init__.py``): ``RewardExecutor``
awaits an async custom reward as ``rm_function(args, sample, **kwargs)`` in the event loop, as slime
does (Relax descends from it), so the hook is slime's (`genrm_client.adapters.slime`).

Relax's own ``relax/utils/genrm_client.py`` (467cfa1f) posts ``{"messages", "sampling_params"}`` to
its GenRM service's ``/generate`` and reads ``{"response"}``: not SGLang's ``/generate``.
:class:`PoolGenRMClient` has its methods (``await generate(messages, sampling_params) -> str``,
``health_check()``, ``close()``) over the pool's chat completions, and :func:`get_genrm_client` is
the module's singleton accessor, so Relax's reward code works unchanged once
``relax.utils.genrm_client.get_genrm_client`` is this one (see docs/trainers.md). Its retries are
the client's: 5xx are not blindly retried three times over 1.5 s, retryable refusals are retried
after their ``Retry-After`` until the deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any
from weakref import WeakKeyDictionary

from genrm_client.adapters.slime import batched_rm, rm
from genrm_client.aio import AsyncJudgeClient
from genrm_client.calls import chat
from genrm_client.config import PoolConfig
from genrm_client.retry import RetryPolicy

__all__ = ["PoolGenRMClient", "batched_rm", "get_genrm_client", "rm"]

_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_new_tokens": "max_tokens"}
"""Relax's sampling keys, as the chat completions route names them."""


class PoolGenRMClient:
    """Relax's ``GenRMClient`` methods, served by the pool."""

    def __init__(self, service_url: str | None = None, timeout: float = 1800.0) -> None:
        config = PoolConfig.from_env() if service_url is None else PoolConfig(service_url.rstrip("/"))
        self._config = PoolConfig(config.url, config.api_key, config.model, RetryPolicy(deadline_s=timeout))
        self._clients: WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncJudgeClient] = WeakKeyDictionary()

    async def generate(self, messages: Sequence[Mapping[str, Any]], sampling_params: Mapping[str, Any] | None = None,
                       ) -> str:
        """The judge's answer to ``messages`` (Relax's sampling keys: temperature, top_p, top_k,
        max_new_tokens)."""
        params = {_SAMPLING[k]: v for k, v in (sampling_params or {}).items() if k in _SAMPLING}
        verdict = await self._client().call(chat(messages, self._config.model, **params))
        return verdict.text

    def health_check(self) -> dict[str, str]:
        """Relax calls it at start; the pool's Service has no health route for clients (its
        readiness is per replica), so this says only where the judge is."""
        return {"status": "pool", "url": self._config.url}

    def close(self) -> None:
        """Nothing to close synchronously: each loop's client closes with its loop's process."""

    def _client(self) -> AsyncJudgeClient:
        """The running loop's client (an httpx async client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = AsyncJudgeClient(self._config)
        return client


_client: PoolGenRMClient | None = None


def get_genrm_client(service_url: str | None = None, timeout: float = 1800.0) -> PoolGenRMClient:
    """Relax's ``get_genrm_client``: one client per process."""
    global _client
    if _client is None:
        _client = PoolGenRMClient(service_url, timeout)
    return _client

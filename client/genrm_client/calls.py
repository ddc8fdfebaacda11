"""The requests a pool serves, as values: route, JSON body and the request id every attempt carries.

Why values: the retry core sends one request several times and must send it unchanged, with the same
id (`x-request-id`, echoed by the gateway and found in its logs), so a request is built once, here,
and both clients (sync and async) send exactly what is built.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genrm_client import wire

JSON = dict[str, Any]


def request_id(prefix: str = "gc") -> str:
    """A fresh request id: the gateway accepts 1-128 of ``A-Z a-z 0-9 . _ : / + = @ -``."""
    return f"{prefix}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class JudgeRequest:
    """One call: ``POST path`` with ``body``; every attempt carries ``id``."""

    path: str
    body: Mapping[str, Any]
    id: str = field(default_factory=request_id)


def chat(messages: Sequence[Mapping[str, Any]], model: str | None = None, **params: Any) -> JudgeRequest:
    """OpenAI chat completions (``/v1/chat/completions``): ``params`` are the API's (``temperature``,
    ``max_tokens``, ...). SGLang serves one model, so ``model`` may be left out."""
    body: JSON = {"messages": [dict(m) for m in messages], **params}
    if model is not None:
        body["model"] = model
    return JudgeRequest(wire.CHAT_PATH, body)


def generate(text: str | Sequence[str] | None = None, *, input_ids: Sequence[int] | None = None,
             sampling_params: Mapping[str, Any] | None = None, **extra: Any) -> JudgeRequest:
    """SGLang's native ``/generate``: ``text`` (or a batch of texts) or ``input_ids``."""
    if (text is None) == (input_ids is None):
        raise ValueError("generate takes text or input_ids, one of them")
    body: JSON = {"text": text if isinstance(text, str) or text is None else list(text), **extra}
    if input_ids is not None:
        body = {"input_ids": list(input_ids), **extra}
    if sampling_params is not None:
        body["sampling_params"] = dict(sampling_params)
    return JudgeRequest(wire.GENERATE_PATH, body)


def classify(text: str | Sequence[str], **extra: Any) -> JudgeRequest:
    """SGLang's native ``/classify`` (a reward model's score per text, in ``embedding[0]``)."""
    return JudgeRequest(wire.CLASSIFY_PATH, {"text": text if isinstance(text, str) else list(text), **extra})


def demand(hint_id: str, requests: int, for_s: int, starts_within_s: int = 0) -> JudgeRequest:
    """A demand hint (`docs/autoscaling.md#demand-hints`): about ``requests`` judge calls within
    ``starts_within_s`` from now, spread over ``for_s`` seconds. Sending the same ``hint_id`` again
    replaces the hint, so retrying it is harmless."""
    return JudgeRequest(wire.DEMAND_PATH, {"id": hint_id, "requests": requests,
                                           "startsWithinSeconds": starts_within_s, "forSeconds": max(1, for_s)},
                        id=hint_id)

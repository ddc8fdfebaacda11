"""A verdict: the judge's whole answer, with where it came from and what it cost.

Why the whole answer and not a score: turning a judge's text into a reward is the trainer's rule
(a regex, a rubric, a log-probability), so the client returns the route's JSON and reads only what
every route shares: the text, a classifier's score, and the judge revision that answered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genrm_client import wire
from genrm_client.errors import BadAnswer, MixedJudges


@dataclass(frozen=True)
class Verdict:
    body: Any
    """The route's JSON answer (a list for a batched ``/generate`` or ``/classify``)."""
    request_id: str
    revision: str | None
    """The judge revision that answered (``x-genrm-revision``, else SGLang's ``weight_version``), or
    None when the pool says nothing of it."""
    latency_s: float
    """From the call's first attempt to its answer, retries included."""
    attempts: int
    retries: Mapping[str, int]
    held_s: float = 0.0
    """How long the pool's activator held the request while the pool was at zero (part of
    ``latency_s``; 0 when it was not held)."""
    gateway_named: bool = False
    """Whether the pool's gateway named ``revision`` (``x-genrm-revision``), not the engine's body
    alone: a step pins its later calls only to such a revision, since only a gateway checks a pin."""

    @property
    def text(self) -> str:
        """The judge's text: a chat completion's first choice, or ``/generate``'s ``text``."""
        body = self.body
        if isinstance(body, dict):
            if "choices" in body:
                try:
                    content = body["choices"][0]["message"]["content"]
                except (IndexError, KeyError, TypeError):
                    raise BadAnswer(f"the answer's choices hold no message (request {self.request_id})") from None
                return "" if content is None else str(content)
            if "text" in body:
                return str(body["text"])
        raise BadAnswer(f"the answer has no single text (request {self.request_id})")

    @property
    def texts(self) -> list[str]:
        """Each text of a batched ``/generate``."""
        items = self.body if isinstance(self.body, list) else [self.body]
        return [str(item["text"]) for item in items]

    @property
    def score(self) -> float:
        """A reward model's score: ``/classify``'s ``embedding[0]``."""
        return _single(self.scores, self.request_id)

    @property
    def scores(self) -> list[float]:
        """Each score of a batched ``/classify``."""
        items = self.body if isinstance(self.body, list) else [self.body]
        try:
            return [float(item["embedding"][0]) for item in items]
        except (KeyError, IndexError, TypeError, ValueError):
            raise BadAnswer(f"the answer has no classifier score (request {self.request_id})") from None


def held_of(headers: Mapping[str, str]) -> float:
    """The activator's hold time on an answer (``x-genrm-held-seconds``); 0 when absent or not a
    finite, non-negative number (a figure, never a reason to fail a verdict)."""
    try:
        held = float(headers.get(wire.HELD_HEADER, "0"))
    except ValueError:
        return 0.0
    return held if math.isfinite(held) and held > 0 else 0.0


def revision_of(headers: Mapping[str, str], body: Any) -> str | None:
    """The revision an answer names: the pool's header, else SGLang's ``meta_info.weight_version``
    (``/generate``, ``/classify``) or ``metadata.weight_version`` (chat); a batch whose members name
    two revisions is :class:`MixedJudges` on its own."""
    header = headers.get(wire.REVISION_HEADER)
    if header:
        return header
    found = {version for item in (body if isinstance(body, list) else [body]) if isinstance(item, dict)
             if (version := _weight_version(item)) is not None}
    if len(found) > 1:
        raise MixedJudges(f"one answer carries verdicts of revisions {sorted(found)}", tuple(sorted(found)))
    return next(iter(found), None)


def _weight_version(item: Mapping[str, Any]) -> str | None:
    for key in ("meta_info", "metadata"):
        section = item.get(key)
        if isinstance(section, dict) and isinstance(section.get("weight_version"), str):
            return str(section["weight_version"])
    return None


def _single(scores: list[float], request_id: str) -> float:
    if len(scores) != 1:
        raise BadAnswer(f"a batch of {len(scores)} scores has no single score (request {request_id})")
    return scores[0]

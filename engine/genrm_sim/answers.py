"""Judge-like answers that are a pure function of their inputs.

Why: the operator verifies a new replica by sending canary judge requests and comparing the
answers with a reference replica. That check is only testable without GPUs if the simulator's
answers are reproducible across processes (same seed, byte-identical) and can be made to differ on
purpose (a different seed for sampled requests, or ``--sim-perturb``).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

DEFAULT_MAX_NEW_TOKENS = 128

_OPENERS = ("The response", "This answer", "The candidate", "The reply", "The submission")
_VERBS = ("addresses", "covers", "misreads", "restates", "answers", "ignores", "explains")
_OBJECTS = ("the question", "the main claim", "the constraints", "the edge cases", "the user's intent")
_QUALIFIERS = (
    "accurately",
    "partially",
    "with minor errors",
    "clearly",
    "without justification",
    "concisely",
    "in depth",
)
_CONNECTORS = ("However,", "Moreover,", "Overall,", "In addition,", "Still,")


@dataclass(frozen=True)
class SamplingParams:
    """The sampling parameters that change an answer, normalised across the three APIs."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Answer:
    """Generated tokens (each carries its leading space) and why generation stopped."""

    tokens: tuple[str, ...]
    finish_reason: str


@dataclass(frozen=True)
class AnswerKey:
    """Everything an answer depends on besides the prompt and the sampling parameters."""

    model: str
    random_seed: int
    perturbed: bool = False


def count_prompt_tokens(prompt: object) -> int:
    """A cheap stand-in for a tokenizer: token ids count as themselves, text as words."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    return max(1, len(json.dumps(prompt, separators=(",", ":")).split()))


def judge_answer(key: AnswerKey, prompt: object, params: SamplingParams) -> Answer:
    """The answer for ``prompt``: greedy answers ignore the seeds, sampled ones use both."""
    seeds: list[int | None] = [] if params.greedy else [key.random_seed, params.sampling_seed]
    material = json.dumps(
        [key.model, prompt, params.temperature, params.top_p, params.top_k, seeds, key.perturbed],
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    rng = random.Random(hashlib.sha256(material.encode()).digest())
    words: list[str] = []
    for sentence in range(rng.randint(2, 4)):
        opener = rng.choice(_OPENERS)
        if sentence:
            words.append(rng.choice(_CONNECTORS))
            opener = opener[0].lower() + opener[1:]
        words.extend(opener.split())
        words.append(rng.choice(_VERBS))
        words.extend(rng.choice(_OBJECTS).split())
        words.extend((rng.choice(_QUALIFIERS) + ".").split())
    tokens = [words[0], *(" " + w for w in words[1:]), "\nScore:", f" {rng.randint(1, 10)}"]
    if len(tokens) > params.max_new_tokens:
        return Answer(tuple(tokens[: params.max_new_tokens]), "length")
    return Answer(tuple(tokens), "stop")

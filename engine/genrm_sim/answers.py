"""Judge-like answers and reward scores that are a pure function of what SGLang makes them depend on.

Why: the operator verifies a new replica by sending canary requests and comparing the answers with
a reference replica, so the simulator must reproduce when SGLang's answers agree across replicas
and when they do not. With ``--enable-deterministic-inference`` SGLang answers a greedy request
from the prompt alone and a sampled one from the prompt and the request's ``sampling_seed``
(default 42), never from ``--random-seed``. Without it, SGLang ignores ``sampling_seed`` and samples
from its own random stream, and batch-dependent kernels make scores differ in their last digits, so
replicas disagree. ``--sim-perturb`` makes a replica answer differently on purpose.
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
    ignore_eos: bool = False
    """SGLang's ``ignore_eos``: generate until ``max_new_tokens`` whatever the model would stop at."""

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
    """The model path: the weights, which decide the answers (the served name does not)."""
    deterministic: bool
    perturbed: bool = False


def count_prompt_tokens(prompt: object) -> int:
    """A cheap stand-in for a tokenizer: token ids count as themselves, text as words."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    return max(1, len(json.dumps(prompt, separators=(",", ":")).split()))


def _material(*parts: object) -> random.Random:
    encoded = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return random.Random(hashlib.sha256(encoded).digest())


def _sentence(rng: random.Random, first: bool) -> list[str]:
    """One sentence of judge prose, as words (a connector first unless it is the answer's first)."""
    opener = rng.choice(_OPENERS)
    words: list[str] = []
    if not first:
        words.append(rng.choice(_CONNECTORS))
        opener = opener[0].lower() + opener[1:]
    words.extend(opener.split())
    words.append(rng.choice(_VERBS))
    words.extend(rng.choice(_OBJECTS).split())
    words.extend((rng.choice(_QUALIFIERS) + ".").split())
    return words


def judge_answer(key: AnswerKey, prompt: object, params: SamplingParams, entropy: int) -> Answer:
    """The answer for ``prompt``; ``entropy`` is the engine's own randomness, used only where SGLang's
    answer depends on it (sampling without deterministic inference)."""
    if params.greedy:
        seeds: list[int | None] = []
    elif key.deterministic:
        seeds = [params.sampling_seed]
    else:
        seeds = [entropy]
    rng = _material(key.model, prompt, params.temperature, params.top_p, params.top_k, seeds, key.perturbed)
    words = [word for sentence in range(rng.randint(2, 4)) for word in _sentence(rng, first=not sentence)]
    tokens = [words[0], *(" " + w for w in words[1:]), "\nScore:", f" {rng.randint(1, 10)}"]
    while params.ignore_eos and len(tokens) < params.max_new_tokens:
        tokens.extend(" " + w for w in _sentence(rng, first=False))  # SGLang decodes on past its end of sequence
    if params.ignore_eos or len(tokens) > params.max_new_tokens:
        return Answer(tuple(tokens[: params.max_new_tokens]), "length")
    return Answer(tuple(tokens), "stop")


def reward_score(key: AnswerKey, prompt: object, entropy: int) -> float:
    """A reward model's score: a function of the prompt, plus batch-dependent noise in the last digits
    unless inference is deterministic."""
    score = round(_material(key.model, prompt, key.perturbed).uniform(-8.0, 8.0), 4)
    if key.deterministic:
        return score
    return score + (entropy % 1000 - 500) * 1e-7

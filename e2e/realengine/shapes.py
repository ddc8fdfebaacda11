"""What of an engine's answer is compared with the other engine's: its shape, a few values, never its text.

Why shapes: the real engine's tiny model answers gibberish and the simulator canned judge prose, with
timings and token counts of their own, so contents cannot be equal; what a client (and the gateway)
depends on is the structure: which keys, of which JSON types, in which frames of a stream. A few
values are part of that structure and kept: the enumerations a client branches on (``object``,
``type``, ``code``, ``role``, ``finish_reason``, ...), and facts a case states on purpose
(``fact``).

A shape is JSON: an object maps keys to shapes, a list is the list of its elements' distinct shapes,
a scalar is its type name (``str``, ``int``, ``float``, ``bool``, ``null``), a kept value is ``=``
and its JSON text. ``null`` matches any shape: SGLang fills many fields only sometimes (a
``cached_tokens_details`` after a cache hit, a ``dp_rank`` with data parallelism).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

Shape = Any
"""A JSON value describing another (see the module's docstring)."""

VALUE_KEYS = frozenset({"object", "type", "code", "role", "finish_reason", "is_generation", "param", "model",
                        "retryable", "err_type", "status_code"})
"""Keys whose scalar values are compared, not only their types."""

ABSENT = "absent"


def fact(value: object) -> str:
    """A value compared as it is (a case's stated fact, or a kept enumeration)."""
    return "=" + json.dumps(value, sort_keys=True)


def shape(value: object, key: str | None = None) -> Shape:
    """The shape of a decoded JSON value found under ``key``."""
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        distinct: dict[str, Shape] = {}
        for item in value:
            element = shape(item, key)
            distinct.setdefault(json.dumps(element, sort_keys=True), element)
        return list(distinct.values())
    if value is None:
        return "null"
    if key in VALUE_KEYS:
        return fact(value)
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def stream_shape(lines: Iterable[str]) -> dict[str, Shape]:
    """The frames of a server-sent-event stream, each ``data:`` frame's shape in order, runs of equal
    frames counted once (how many tokens one chunk carries is the detokenizer's business), keyed by
    position so a missing or extra frame shows where it is."""
    frames: list[Shape] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        frame = fact(data) if data == "[DONE]" else shape(json.loads(data))
        if not frames or frames[-1] != frame:
            frames.append(frame)
    return {str(i): frame for i, frame in enumerate(frames)}


def _show(value: Shape) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def differences(real: Shape, sim: Shape, path: str = "") -> list[str]:
    """Lines ``<path>: real <shape>, sim <shape>``, one per place where the two shapes differ."""
    if real == sim or "null" in (real, sim):
        return []
    if isinstance(real, dict) and isinstance(sim, dict):
        lines = []
        for key in [*real, *(k for k in sim if k not in real)]:
            at = f"{path}.{key}" if path else key
            if key not in sim:
                lines.append(f"{at}: real {_show(real[key])}, sim {ABSENT}")
            elif key not in real:
                lines.append(f"{at}: real {ABSENT}, sim {_show(sim[key])}")
            else:
                lines.extend(differences(real[key], sim[key], at))
        return lines
    if isinstance(real, list) and isinstance(sim, list):
        if not real and not sim:
            return []  # two empty lists say nothing about their elements
        if not real or not sim:
            return [f"{path}: real {'[]' if not real else 'non-empty'}, sim {'[]' if not sim else 'non-empty'}"]
        if len(real) == len(sim) == 1:
            return differences(real[0], sim[0], f"{path}[]")
    return [f"{path}: real {_show(real)}, sim {_show(sim)}"]

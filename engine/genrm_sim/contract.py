"""SGLang's contract as read from the pinned SGLang release (``sglang_contract.json``).

Why a data file: the simulator must accept exactly SGLang's flags and answer SGLang's routes, and
the operator's, gateway's and examples' tests must check themselves against the same SGLang. The
file is generated from SGLang's own source by ``make sglang-contract`` (``hack/sglang_contract.py``),
committed, and read here, so no test needs the network or SGLang's dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One ``sglang.launch_server`` option."""

    dest: str
    names: tuple[str, ...]
    action: str
    nargs: str | None
    type: str | None
    choices: tuple[Any, ...] | None
    required: bool


@dataclass(frozen=True)
class Route:
    """One HTTP route of SGLang's server."""

    path: str
    methods: tuple[str, ...]
    json_only: bool
    """SGLang answers 400 unless the request says ``Content-Type: application/json``."""
    conditional: bool
    """Registered only under a flag or an environment variable (``/metrics``, ``/dumper/...``)."""


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...] | None


@dataclass(frozen=True)
class Contract:
    version: str
    flags: tuple[Flag, ...]
    routes: tuple[Route, ...]
    metrics: tuple[Metric, ...]
    sampling_params: frozenset[str]
    sampling_param_types: dict[str, tuple[str, str]]
    """Key -> (JSON scalar type, the ``expected`` text of SGLang's 400) where the schema holds one."""
    deterministic_attention_backends: tuple[str, ...]
    health_check_timeout_seconds: float

    def flag(self, name: str) -> Flag:
        return next(f for f in self.flags if name in f.names)

    def route(self, path: str) -> Route:
        return self._routes_by_path[path]

    @cached_property
    def _routes_by_path(self) -> dict[str, Route]:
        """The simulator looks a route up on every request."""
        return {r.path: r for r in self.routes}

    def metric(self, name: str) -> Metric:
        return next(m for m in self.metrics if m.name == name)

    @property
    def image_tag(self) -> str:
        """The tag of SGLang's own image for this release."""
        return f"v{self.version}"


@cache
def load() -> Contract:
    """The committed contract of the pinned SGLang release."""
    raw = json.loads(resources.files("genrm_sim").joinpath("sglang_contract.json").read_text())
    return Contract(
        version=raw["sglang"]["version"],
        flags=tuple(Flag(dest=f["dest"], names=tuple(f["names"]), action=f["action"], nargs=f["nargs"],
                         type=f["type"], required=f["required"],
                         choices=None if f["choices"] is None else tuple(f["choices"]))
                    for f in raw["flags"]),
        routes=tuple(Route(r["path"], tuple(r["methods"]), r["json_only"], r["conditional"]) for r in raw["routes"]),
        metrics=tuple(Metric(m["name"], m["type"], None if m["labels"] is None else tuple(m["labels"]))
                      for m in raw["metrics"]),
        sampling_params=frozenset(raw["sampling_params"]),
        sampling_param_types={k: (v["type"], v["expected"]) for k, v in raw["sampling_param_types"].items()},
        deterministic_attention_backends=tuple(raw["deterministic_attention_backends"]),
        health_check_timeout_seconds=float(raw["health_check_timeout_seconds"]),
    )

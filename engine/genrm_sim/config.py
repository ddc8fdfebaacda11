"""What a simulator process was asked to be: SGLang's launch arguments plus failure injection."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SimConfig:
    """Parsed command line; the SGLang-named fields are reported back by ``/server_info``."""

    model_path: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 30000
    random_seed: int = 0
    enable_metrics: bool = False
    enable_deterministic_inference: bool = False
    tp_size: int = 1
    revision: str | None = None
    weight_version: str = "default"
    """SGLang's ``--weight-version``: reported by ``/model_info`` and in every answer's ``meta_info`` (not
    ``--revision``, which only chooses what to download)."""
    attention_backend: str | None = None
    api_key: str | None = None
    """SGLang's ``--api-key``: every route but the probes' and ``/metrics`` needs it as a bearer token."""
    context_length: int = 32768
    """The model's context length (SGLang reads it from the model's config; ``--context-length``)."""
    allow_auto_truncate: bool = False
    enable_priority_scheduling: bool = False
    default_priority_value: int | None = None
    is_generation: bool = True
    """False for a reward/classification model: it answers ``/classify``, not ``/generate``."""
    startup_seconds: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    max_running: int = 64
    max_total_tokens: int = 65536
    crash_after: int | None = None
    hang: bool = False
    error_rate: float = 0.0
    perturb: bool = False
    sigterm_poll_seconds: float = 5.0

    _SIM_ONLY = ("startup_seconds", "ttft_ms", "itl_ms", "max_running", "max_total_tokens", "is_generation",
                 "crash_after", "hang", "error_rate", "perturb", "sigterm_poll_seconds")

    def server_args(self) -> dict[str, Any]:
        """The SGLang ``server_args`` view, so canary checks can compare replicas' launch args."""
        args = {k: v for k, v in asdict(self).items() if k not in self._SIM_ONLY}
        return args | {"max_running_requests": self.max_running, "max_total_tokens": self.max_total_tokens}

    def simulator_args(self) -> dict[str, Any]:
        """What only the simulator has (``/server_info``'s ``simulator``)."""
        return {k: v for k, v in asdict(self).items() if k in self._SIM_ONLY}

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

    def server_args(self) -> dict[str, Any]:
        """The SGLang ``server_args`` view, so canary checks can compare replicas' launch args."""
        args = asdict(self)
        sim_only = ("startup_seconds", "ttft_ms", "itl_ms", "max_running", "max_total_tokens", "is_generation",
                    "crash_after", "hang", "error_rate", "perturb", "sigterm_poll_seconds")
        sim = {name: args.pop(name) for name in sim_only}
        args["max_running_requests"] = sim["max_running"]
        args["max_total_tokens"] = sim["max_total_tokens"]
        args["simulator"] = sim
        return args

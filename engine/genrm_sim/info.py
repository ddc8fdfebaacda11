"""What the simulator says about itself: the bodies of SGLang's ``/model_info``, ``/server_info``
and ``/v1/loads``."""

from __future__ import annotations

import time
from typing import Any

from genrm_sim import contract
from genrm_sim.config import SimConfig
from genrm_sim.metrics import SimMetrics
from genrm_sim.model import Scheduler

SIM_VERSION = f"{contract.load().version}+genrm-sim"


def model_info(config: SimConfig) -> dict[str, Any]:
    generation = config.is_generation
    return {
        "model_path": config.model_path,
        "served_model_name": config.served_model_name,
        "tokenizer_path": config.model_path,
        "is_generation": generation,
        "preferred_sampling_params": None,
        "weight_version": config.revision or "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM" if generation else "LlamaForSequenceClassification"],
    }


def server_info(config: SimConfig, scheduler: Scheduler, started: float) -> dict[str, Any]:
    """``started``: when the simulator started (``time.time()``)."""
    return config.server_args() | {
        "startup_time": started,
        "internal_states": [{"dp_rank": 0, "num_running_reqs": scheduler.running}],
        "version": SIM_VERSION,
        "frontend": "python",
    }


def loads(config: SimConfig, scheduler: Scheduler, metrics: SimMetrics) -> dict[str, Any]:
    """SGLang's ``/v1/loads`` (JSON, all DP ranks, core section only)."""
    used = scheduler.used_tokens
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "version": SIM_VERSION,
        "accelerator": None,
        "num_accelerators": config.tp_size,
        "loads": [{
            "timestamp": time.time(), "dp_rank": 0,
            "num_running_reqs": scheduler.running, "num_waiting_reqs": scheduler.queued,
            "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
            "num_active_tokens": used, "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": config.max_total_tokens, "max_running_requests": config.max_running,
            "token_usage": used / config.max_total_tokens, "gen_throughput": metrics.throughput(),
            "cache_hit_rate": 0.0, "utilization": scheduler.running / config.max_running,
            "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None,
        }],
    }

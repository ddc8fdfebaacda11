"""What the simulator says about itself: the bodies of SGLang's ``/model_info``, ``/server_info``,
``/v1/models`` and ``/v1/loads``."""

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
        "weight_version": config.weight_version,
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM" if generation else "LlamaForSequenceClassification"],
    }


def model_card(config: SimConfig) -> dict[str, Any]:
    """One entry of ``/v1/models`` (and ``/v1/models/{model}``): SGLang's ``ModelCard`` of its served name."""
    return {"id": config.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": config.served_model_name, "parent": None, "max_model_len": config.context_length}


def server_info(config: SimConfig, metrics: SimMetrics) -> dict[str, Any]:
    """SGLang's server arguments (those the simulator models) with its start-up phases' durations
    (all of the simulated start-up is "loading weights") and one scheduler's internal state: its
    arguments again, with its capacity and memory use."""
    args = config.server_args()
    scheduler = args | {
        "world_size": config.tp_size, "effective_max_running_requests_per_dp": config.max_running,
        "last_gen_throughput": metrics.throughput(),
        "memory_usage": {"weight": 0.0, "kvcache": 0.0, "startup_available": 0.0,
                         "token_capacity": config.max_total_tokens, "token_capacity_swa": None,
                         "graph": dict.fromkeys(_GRAPH_PHASES, 0.0)},
    }
    return args | {
        "startup_time": {"load_weight": config.startup_seconds, "kv_cache_allocation": 0.0,
                         "scheduler_e2e": config.startup_seconds,
                         "cuda_graph": dict.fromkeys(_GRAPH_PHASES, 0.0), "tokenizer_e2e": 0.0},
        "internal_states": [scheduler],
        "max_total_num_tokens": config.max_total_tokens,
        "max_req_input_len": config.context_length,
        "simulator": config.simulator_args(),
        "version": SIM_VERSION,
        "frontend": "python",
    }


_GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
"""The phases SGLang captures graphs for (none here: the simulator has no graphs)."""
_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
"""``/v1/loads``'s ``include`` options."""


def loads(config: SimConfig, scheduler: Scheduler, metrics: SimMetrics, include: str | None) -> dict[str, Any]:
    """SGLang's ``/v1/loads`` (JSON, its one DP rank): the core figures and the ``include``d sections
    it has (all by default: memory, disaggregation, queues; no speculative decoding or LoRA); an
    unknown section is a ``ValueError``."""
    sections = {s.strip() for s in include.split(",")} if include else {"all"}
    if not sections <= _SECTIONS:
        raise ValueError(f"Invalid include sections: {sections - _SECTIONS}. Valid options: {sorted(_SECTIONS)}")
    used = scheduler.used_tokens
    load: dict[str, Any] = {
        "timestamp": time.time(), "dp_rank": 0,
        "num_running_reqs": scheduler.running, "num_waiting_reqs": scheduler.queued,
        "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
        "num_active_tokens": used, "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": config.max_total_tokens, "max_running_requests": config.max_running,
        "token_usage": used / config.max_total_tokens, "gen_throughput": metrics.throughput(),
        "cache_hit_rate": 0.0, "utilization": scheduler.running / config.max_running,
        "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None,
    }
    everything = "all" in sections
    if everything or "memory" in sections:
        load["memory"] = {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                          "token_capacity": config.max_total_tokens}
    if everything or "disagg" in sections:
        load["disaggregation"] = {"mode": "null", **dict.fromkeys((
            "prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs", "decode_prealloc_queue_reqs",
            "decode_transfer_queue_reqs", "decode_retracted_queue_reqs"), 0),
            "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}
    if everything or "queues" in sections:
        load["queues"] = {"waiting": scheduler.queued, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "version": SIM_VERSION,
        "accelerator": None,
        "num_accelerators": config.tp_size,
        "loads": [load],
    }

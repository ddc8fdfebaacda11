"""Which engine routes are reachable through the gateway, which are blocked by name, and the gateway's own.

Why an allowlist: the engine's admin routes (weight updates, cache flush, profiling, shutdown)
would let any judge client change or stop the replica; only judge traffic may pass.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from genrm_contract.demand import DEMAND_PATH
from genrm_contract.revisions import REVISION_PATH


@dataclass(frozen=True)
class ProxiedRoute:
    """An allowlisted engine route; ``name`` is the metrics label."""

    name: str
    method: str

    @property
    def has_body(self) -> bool:
        return self.method == "POST"


PROXIED: dict[str, ProxiedRoute] = {
    path: ProxiedRoute(path, method)
    for path, method in (
        ("/generate", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/classify", "POST"),          # reward (sequence-classification) models
        ("/v1/classify", "POST"),
        ("/v1/models", "GET"),
        ("/model_info", "GET"),         # is_generation: the operator's probes pick /generate or /classify
        ("/get_model_info", "GET"),     # deprecated spelling of /model_info, still served by SGLang
    )
}


GATEWAY_PATHS = frozenset({DEMAND_PATH, REVISION_PATH})
"""The gateway's own routes on the traffic port, under the pool's API key like the judge routes: demand
hints and the revision document. None is a path of the engine's, so none hides an engine route."""


@dataclass(frozen=True)
class EnginePaths:
    """A set of SGLang route paths, some of them templates (``/v1/responses/{response_id}``)."""

    paths: frozenset[str]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and (path in self.paths or any(p.fullmatch(path) for p in self._templates))

    @functools.cached_property
    def _templates(self) -> tuple[re.Pattern[str], ...]:
        """``{name}`` matches one path segment, ``{name:path}`` the rest of the path (Starlette's syntax)."""
        def pattern(template: str) -> re.Pattern[str]:
            parts = re.split(r"(\{[^}]*\})", template)
            return re.compile("".join(
                (".+" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
                for part in parts))

        return tuple(pattern(p) for p in sorted(self.paths) if "{" in p)


# Every other route of the pinned SGLang release (engine/genrm_sim/sglang_contract.json; a test keeps
# the two tables equal to it): the gateway refuses them with reason ``notAllowed`` (403) rather than
# ``notFound``, so an operator sees the refusal was deliberate.
BLOCKED_ENGINE_PATHS = EnginePaths(frozenset({
    # weights, memory, cache, sessions and scheduling: would change or stop the replica
    "/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed",
    "/update_weights_from_ipc", "/update_weight_version", "/begin_weight_update", "/end_weight_update",
    "/init_weights_update_group", "/destroy_weights_update_group", "/init_weights_send_group_for_remote_instance",
    "/send_weights_to_remote_instance", "/get_weights_by_name", "/weights_checker",
    "/get_remote_instance_transfer_engine_info", "/remote_instance_transfer_engine_info",
    "/release_memory_occupation", "/resume_memory_occupation", "/flush_cache", "/freeze_gc",
    "/hicache/storage-backend", "/hicache/storage-backend/clear", "/get_hicache_l3_cache_layout",
    "/add_external_corpus", "/remove_external_corpus", "/list_external_corpora",
    "/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter",
    "/open_session", "/close_session", "/abort_request", "/pause_generation", "/continue_generation",
    "/slow_down", "/pd_role_switch", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/set_internal_state",
    # debugging and profiling
    "/start_profile", "/stop_profile", "/set_trace_level", "/configure_logging", "/dumper/{method}",
    "/start_expert_distribution_record", "/stop_expert_distribution_record", "/dump_expert_distribution_record",
    # the engine's own health, state and metrics: the gateway answers for the replica
    "/", "/health", "/health_generate", "/ready", "/ping", "/server_info", "/get_server_info", "/v1/loads",
    "/metrics",
    # other APIs a judge pool does not serve
    "/encode", "/v1/embeddings", "/v1/score", "/v1/rerank", "/v1/decisions", "/v1/systemone",
    "/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize", "/parse_function_call", "/separate_reasoning",
    "/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel",
    "/v1/messages", "/v1/messages/count_tokens", "/v1/audio/transcriptions", "/v1/realtime",
    "/v1/models/{model:path}", "/api/chat", "/api/generate", "/api/tags", "/api/show", "/invocations",
    "/vertex_generate",
}))

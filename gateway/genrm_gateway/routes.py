"""Which engine routes are reachable through the gateway, and which are blocked by name.

Why an allowlist: the engine's admin routes (weight updates, cache flush, profiling, shutdown)
would let any judge client change or stop the replica; only judge traffic may pass.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        ("/v1/models", "GET"),
        ("/get_model_info", "GET"),
    )
}

# Engine routes known to exist that the gateway refuses with reason ``notAllowed`` (403) rather
# than ``notFound``, so an operator sees the refusal was deliberate.
BLOCKED_ENGINE_PATHS = frozenset({
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/update_weights_from_distributed",
    "/init_weights_update_group",
    "/flush_cache",
    "/shutdown",
    "/start_profile",
    "/stop_profile",
    "/abort_request",
    "/pause_generation",
    "/continue_generation",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/get_server_info",
    "/server_info",
    "/get_load",
    "/health",
    "/health_generate",
    "/set_internal_state",
    "/configure_logging",
    "/load_lora_adapter",
    "/unload_lora_adapter",
})

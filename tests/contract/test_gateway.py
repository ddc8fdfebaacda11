"""Every SGLang route is either proxied by the gateway or refused with 403 (the gateway's own routes are none of
them), and the engine load the gateway reads is made of series SGLang exports."""

from __future__ import annotations

from genrm_contract.demand import DEMAND_PATH
from genrm_contract.revisions import REVISION_PATH, REVISIONS_PATH
from genrm_gateway.engine import parse_sglang_metrics
from genrm_gateway.routes import BLOCKED_ENGINE_PATHS, GATEWAY_PATHS, PROXIED
from genrm_sim.api import create_app
from genrm_sim.config import SimConfig
from genrm_sim.contract import Contract


def test_every_sglang_route_is_proxied_or_refused_and_nothing_else_is_listed(sglang: Contract) -> None:
    contract_paths = {r.path for r in sglang.routes}
    proxied, blocked = set(PROXIED), set(BLOCKED_ENGINE_PATHS.paths)
    assert not proxied & blocked
    assert proxied | blocked == contract_paths, {
        "not handled (the gateway would answer 404)": sorted(contract_paths - proxied - blocked),
        "not an SGLang route": sorted((proxied | blocked) - contract_paths)}
    for path, route in PROXIED.items():
        assert route.method in sglang.route(path).methods, path


def test_the_gateways_own_routes_are_no_engines(sglang: Contract) -> None:
    """Demand hints and the revision document are the gateway's: none hides an SGLang route."""
    assert GATEWAY_PATHS == {DEMAND_PATH, REVISION_PATH} and REVISIONS_PATH not in GATEWAY_PATHS
    contract_paths = {r.path for r in sglang.routes}
    for path in GATEWAY_PATHS:
        assert path not in contract_paths and path not in PROXIED and path not in BLOCKED_ENGINE_PATHS, path


def test_templated_sglang_routes_are_refused_by_their_concrete_paths() -> None:
    for path in ("/v1/responses/resp_1", "/v1/responses/resp_1/cancel", "/v1/models/org/judge", "/dumper/dump"):
        assert path in BLOCKED_ENGINE_PATHS
    for path in ("/v1/responses/", "/dumper/a/b", "/nope", "/generate"):
        assert path not in BLOCKED_ENGINE_PATHS


def test_reward_model_routes_are_proxied_like_generation() -> None:
    assert PROXIED["/classify"].method == PROXIED["/v1/classify"].method == PROXIED["/generate"].method == "POST"


def test_the_load_the_gateway_reads_is_in_sglangs_series(sglang: Contract) -> None:
    """The gateway finds running, queued and KV usage in an SGLang-shaped scrape (the simulator's
    series are checked against the contract in test_simulator)."""
    _, sim = create_app(SimConfig(model_path="m", served_model_name="m", enable_metrics=True))
    load = parse_sglang_metrics(sim.metrics.render().decode())
    assert (load.running, load.queued, load.token_usage) == (0, 0, 0.0)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        assert sglang.metric(name).type == "gauge"

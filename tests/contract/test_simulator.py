"""The simulator accepts exactly SGLang's flags, serves every SGLang route, and exports SGLang's series."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.routing import APIRoute
from genrm_sim import cli
from genrm_sim.api import create_app
from genrm_sim.config import SimConfig
from genrm_sim.contract import Contract
from genrm_sim.dialects import ContractError, NativeGenerate
from prometheus_client.parser import text_string_to_metric_families


def test_the_parser_has_exactly_sglangs_flags_plus_the_simulators_own(sglang: Contract) -> None:
    options = {o for action in cli.build_parser()._actions for o in action.option_strings}
    sim_only = {o for o in options if o.startswith("--sim-")}
    expected = {n for f in sglang.flags for n in f.names}
    expected |= {"--no-" + n[2:] for f in sglang.flags if f.action == "boolean_optional" for n in f.names}
    assert options - sim_only - {"-h", "--help"} == expected


@pytest.mark.parametrize("argv", [["--model-path", "m", "--attention-backend", "nope"],
                                  ["--model-path", "m", "--port", "x"], ["--model-path", "m", "--nope"], []])
def test_what_sglang_would_exit_on_exits(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parse_config(argv)
    assert exited.value.code == 2


def test_every_sglang_route_and_method_is_served_none_404(sglang: Contract) -> None:
    app, _ = create_app(SimConfig(model_path="m", served_model_name="m", enable_metrics=True))
    served = {(r.path, m) for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()}
    for route in sglang.routes:
        if route.conditional and route.path != "/metrics":
            continue  # registered by SGLang only under an environment variable
        for method in route.methods:
            if method != "WEBSOCKET":
                assert (route.path, method) in served, (route.path, method)


def test_simulator_series_are_sglangs_with_sglangs_labels(sglang: Contract) -> None:
    _, sim = create_app(SimConfig(model_path="m", served_model_name="m", enable_metrics=True))
    families = list(text_string_to_metric_families(sim.metrics.render().decode()))
    assert len(families) >= 10
    for family in families:
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, exported by SGLang's client too
        name = family.name + "_total" if family.type == "counter" else family.name
        declared = sglang.metric(name)
        assert declared.type == family.type, name
        for sample in family.samples:
            assert tuple(sorted(sample.labels.keys() - {"le"})) == declared.labels, name


def test_a_failed_health_generation_marks_the_engine_unhealthy() -> None:
    """SGLang answers 503 once its one-token health generation got no output within the timeout."""
    _, sim = create_app(SimConfig(model_path="m", served_model_name="m", hang=True))
    sim.health_timeout = 1.5
    assert asyncio.run(sim.health()).status_code == 503
    assert sim.scheduler.unhealthy and not sim.healthy
    assert sim.scheduler.pending == 0  # the probe does not stay queued


_WRONG = {"int": (1.5, "floating point `1.5`"), "number": ("0.5", 'string "0.5"'), "bool": (1, "integer `1`"),
          "str": (True, "boolean `true`")}


def test_each_sampling_param_of_the_wrong_json_type_is_refused_with_sglangs_text(sglang: Contract) -> None:
    """Every scalar ``sampling_params`` key SGLang's schema types is held to that type, null allowed."""
    assert {"temperature", "top_p", "top_k", "max_new_tokens", "sampling_seed"} <= set(sglang.sampling_param_types)
    for key, (kind, expected) in sglang.sampling_param_types.items():
        value, shown = _WRONG[kind]
        with pytest.raises(ContractError) as refused:
            NativeGenerate().parse({"text": "x", "sampling_params": {key: value}}, "m", False)
        assert str(refused.value) == f"invalid type: {shown}, expected {expected}", key
        NativeGenerate().parse({"text": "x", "sampling_params": {key: None}}, "m", False)

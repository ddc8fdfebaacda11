"""``make sglang-contract`` reads SGLang's source without importing it.

The generator runs here on a miniature wheel that uses each construct the real SGLang source uses
(namespace field classes with ``A[T, help]`` and ``A[T, Arg(...)]``, choices from a constants
module, Literal types, BooleanOptionalAction, custom actions, explicit ``add_argument`` calls,
decorator routes with methods and env-renamed paths, included routers, the metrics mount, metric
collectors with common and extra labels), so it is tested without the network. The committed
contract is checked for what the project relies on.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from genrm_sim.contract import Contract

from hack import sglang_contract as generator

SOURCES = {
    "sglang/srt/server_args.py": '''
from sglang.srt.arg_groups.fields.serving import Serving
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--sampling-backend", type=str, choices=set(dynamic()), default=None)
        parser.add_argument("--config", type=str)
        parser.add_argument("--old-switch", action=DeprecatedStoreTrueAction, new_flag="--x")
        parser.add_argument("--old-value", action=DeprecatedStoreTrueAction, nargs=None, choices=["amd"])
_INPUT_NAMESPACES = [
    Serving,
]
''',
    "sglang/srt/arg_groups/fields/serving.py": '''
from sglang.srt.arg_groups.choices import BACKENDS
class Serving(msgspec.Struct):
    _NS_PATH = "serving"
    model_path: A[str, Arg(help="weights", aliases=["--model"])]
    port: A[int, "The port."] = 30000
    mem_fraction_static: A[Optional[float], "Fraction."] = None
    enable_metrics: A[bool, "Metrics."] = False
    attention_backend: A[Optional[str], Arg(help="kernels", choices=BACKENDS)] = None
    load_format: A[Literal["auto", "pt"], "Format."] = "auto"
    numa_node: A[Optional[List[int]], "Nodes."] = None
    fused: A[bool, Arg(help="x", action=argparse.BooleanOptionalAction)] = True
    lora_paths: A[Optional[list], Arg(help="x", action=LoRAPathAction,
                                      action_kwargs={"type": str, "nargs": "*"})] = None
    hidden: A[int, Arg(help="x", no_cli=True)] = 0
    derived: int = 0
''',
    "sglang/srt/arg_groups/choices.py": '''
BACKENDS = ["triton", "fa3"] + ["flashinfer"]
DETERMINISTIC_ATTENTION_BACKEND_CHOICES = ["fa3", "flashinfer"]
RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND = ["fa3"]
''',
    "sglang/srt/arg_groups/argparse_actions.py": '''
class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)
class LoRAPathAction(argparse.Action):
    pass
''',
    "sglang/srt/entrypoints/http_server.py": '''
HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
app.include_router(v1_loads_router)
app.include_router(elastic_ep_router)
@app.exception_handler(HTTPException)
async def handler(request, exc): ...
@app.get("/health")
@app.get("/health_generate")
async def health(): ...
@app.api_route("/generate", methods=["POST", "PUT"])
async def generate(): ...
@app.post("/v1/completions", dependencies=[Depends(validate_json_request)])
async def completions(): ...
@app.get(os.environ.get("SGLANG_OLLAMA_TAGS_ROUTE", "/api/tags"))
async def tags(): ...
if os.environ.get("DUMPER_SERVER_PORT") == "reuse":
    @app.api_route("/dumper/{method}", methods=["POST"])
    async def dumper(): ...
''',
    "sglang/srt/entrypoints/v1_loads.py": '''
@router.get("/v1/loads")
async def loads(): ...
''',
    "sglang/srt/entrypoints/elastic_ep.py": "",
    "sglang/srt/utils/common.py": '''
def add_prometheus_middleware(app):
    metrics_route = Mount("/metrics", make_asgi_app(registry=registry))
''',
    "sglang/srt/observability/metrics_collector.py": '''
class SchedulerMetricsCollector:
    def __init__(self, labels):
        self.num_running_reqs = Gauge(name="sglang:num_running_reqs", documentation="x",
                                      labelnames=labels.keys())
    @classmethod
    def init_new(cls):
        labels = {"model_name": "m", "tp_rank": 0}
class TokenizerMetricsCollector:
    def __init__(self, labels):
        self.prompt_tokens_total = Counter(name="sglang:prompt_tokens_total", documentation="x",
                                           labelnames=list(labels.keys()) + ["is_streaming"])
def tokenizer_metric_labels():
    labels = {"model_name": "m", "engine_type": "unified"}
    return labels
''',
    "sglang/api/v1/api_types.py": '''
class SamplingParams(msgspec.Struct):
    """sglang.api.v1.SamplingParams: JSON object (unknown keys rejected)."""
    max_new_tokens: Optional[int] = 128
    temperature: Optional[float] = 1.0
def decode_SamplingParams(value):
    m = _expect_map(value, expected="struct SamplingParams")
    kw = {}
    for key, x in m.items():
        if key == "max_new_tokens":
            kw["max_new_tokens"] = None if x is None else _expect_int(x, expected="i64")
        elif key == "temperature":
            kw["temperature"] = 1.0 if x is None else _expect_float(x, expected="f64")
        elif key == "stop":
            kw["stop"] = None if x is None else decode_StringOrList(x)
''',
}


def build(tmp_path: Path) -> dict[str, Any]:
    wheel = tmp_path / "sglang-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in SOURCES.items():
            archive.writestr(name, text)
    return generator.build_contract(wheel)


def test_flags_are_read_like_add_cli_args_from_dataclass(tmp_path: Path) -> None:
    flags = {f["names"][0]: f for f in build(tmp_path)["flags"]}
    assert set(flags) == {"--model-path", "--port", "--mem-fraction-static", "--enable-metrics",
                          "--attention-backend", "--load-format", "--numa-node", "--fused", "--lora-paths",
                          "--sampling-backend", "--config", "--old-switch", "--old-value"}
    assert flags["--model-path"]["names"] == ["--model-path", "--model"] and flags["--model-path"]["required"]
    assert (flags["--port"]["type"], flags["--port"]["default"], flags["--port"]["required"]) == ("int", 30000, False)
    assert flags["--mem-fraction-static"]["type"] == "float"
    assert flags["--enable-metrics"]["action"] == "store_true"
    assert flags["--attention-backend"]["choices"] == ["triton", "fa3", "flashinfer"]
    assert flags["--load-format"]["choices"] == ["auto", "pt"]
    assert (flags["--numa-node"]["nargs"], flags["--numa-node"]["type"]) == ("+", "int")
    assert flags["--fused"]["action"] == "boolean_optional"
    assert (flags["--lora-paths"]["action"], flags["--lora-paths"]["nargs"]) == ("store", "*")
    assert flags["--sampling-backend"]["choices"] is None and flags["--sampling-backend"]["choices_dynamic"]
    assert flags["--old-switch"]["action"] == "store_true"
    assert (flags["--old-value"]["action"], flags["--old-value"]["choices"]) == ("store", ["amd"])


def test_routes_metrics_sampling_params_and_constants_are_read(tmp_path: Path) -> None:
    contract = build(tmp_path)
    routes = {r["path"]: r for r in contract["routes"]}
    assert set(routes) == {"/health", "/health_generate", "/generate", "/v1/completions", "/api/tags",
                           "/dumper/{method}", "/v1/loads", "/metrics"}
    assert routes["/generate"]["methods"] == ["POST", "PUT"] and not routes["/generate"]["json_only"]
    assert routes["/v1/completions"]["json_only"]
    assert routes["/api/tags"]["env"] == "SGLANG_OLLAMA_TAGS_ROUTE"
    assert routes["/dumper/{method}"]["conditional"] and routes["/metrics"]["conditional"]
    assert not routes["/health"]["conditional"]
    metrics = {m["name"]: m for m in contract["metrics"]}
    assert metrics["sglang:num_running_reqs"]["labels"] == ["model_name", "tp_rank"]
    assert metrics["sglang:prompt_tokens_total"]["labels"] == ["engine_type", "is_streaming", "model_name"]
    assert contract["sampling_params"] == ["max_new_tokens", "temperature"]
    assert contract["sampling_param_types"] == {"max_new_tokens": {"type": "int", "expected": "i64"},
                                                "temperature": {"type": "number", "expected": "f64"}}
    assert contract["deterministic_attention_backends"] == ["fa3", "flashinfer"]
    assert contract["health_check_timeout_seconds"] == 20


def test_the_committed_contract_is_sglang_0_5_23_and_has_what_the_project_relies_on(sglang: Contract) -> None:
    assert sglang.version == generator.SGLANG_VERSION == "0.5.23"
    assert len(sglang.flags) > 400 and len(sglang.routes) > 80
    assert sglang.flag("--model").dest == "model_path"
    assert sglang.flag("--tensor-parallel-size").dest == "tp_size"
    assert "fa3" in sglang.deterministic_attention_backends
    assert "torch_native" not in sglang.deterministic_attention_backends
    assert sglang.route("/ready").methods == ("GET",)
    assert sglang.route("/v1/chat/completions").json_only
    assert not any(r.path == "/get_load" for r in sglang.routes)  # not a route of 0.5.23: /v1/loads is
    assert "sampling_seed" in sglang.sampling_params

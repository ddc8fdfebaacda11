"""``genrm-sim``: accepts exactly ``python -m sglang.launch_server``'s command line, plus ``--sim-*`` knobs.

Why the same flags, strictly: the operator renders one engine command line for both the real engine
and the simulator, and SGLang exits on a flag it does not know or a value outside a flag's choices.
The parser is therefore built from the pinned SGLang release's contract (``sglang_contract.json``):
a typo in ``spec.engine.extraArgs`` fails here as it would crash-loop a real pod. Valid SGLang flags
the simulator does not model are accepted with one warning. SGLang's start-up checks that matter to a
pool are repeated (deterministic inference refuses attention backends it does not support). A
``--config`` YAML file is merged into the command line as SGLang merges it (``configfile``): the
operator hands the engine its API key that way, off every command line. Every ``--sim-*`` flag
also reads ``GENRM_SIM_*`` so a pod can turn on failure injection through its environment without
changing its args.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn
import yaml

from genrm_sim import contract
from genrm_sim.api import create_app
from genrm_sim.config import SimConfig
from genrm_sim.configfile import ConfigMerger
from genrm_sim.model import Scheduler

_TRUE = {"1", "true", "yes", "on"}
_TYPES: dict[str | None, Callable[[str], Any]] = {"int": int, "float": float, "str": str, None: str}
# SGLang flags whose values the simulator uses; every other SGLang flag is accepted and ignored.
_MODELLED = frozenset({
    "model_path", "served_model_name", "host", "port", "random_seed", "enable_metrics",
    "enable_deterministic_inference", "tp_size", "revision", "weight_version", "max_total_tokens",
    "max_running_requests", "is_embedding", "attention_backend", "enable_priority_scheduling", "default_priority_value",
    "context_length", "allow_auto_truncate", "api_key",
})
KEEP_ALIVE_SECONDS = 5
"""SGLang's ``SGLANG_TIMEOUT_KEEP_ALIVE`` (uvicorn's ``timeout_keep_alive``): idle connections close after it."""
SIGTERM_POLL_SECONDS = 5.0
"""SGLang's ``sigterm_watchdog`` looks at the exit flag and the remaining requests every 5 s."""


def _env(name: str, convert: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(f"GENRM_SIM_{name}")
    return default if raw is None or raw == "" else convert(raw)


def _flag(raw: str) -> bool:
    return raw.strip().lower() in _TRUE


def _add_sglang_flags(parser: argparse._ArgumentGroup) -> None:
    """Every flag of the pinned SGLang with its arity, type and choices; absent ones stay absent."""
    for flag in contract.load().flags:
        kwargs: dict[str, Any] = {"dest": flag.dest, "default": argparse.SUPPRESS}
        if flag.action == "store_true":
            kwargs["action"] = "store_true"
        elif flag.action == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=_TYPES[flag.type], nargs=flag.nargs, choices=flag.choices, required=flag.required)
        parser.add_argument(*flag.names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genrm-sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_sglang_flags(parser.add_argument_group(f"sglang.launch_server {contract.load().version} flags"))
    sim = parser.add_argument_group("simulator only (each also from env GENRM_SIM_<NAME>)")
    sim.add_argument("--sim-startup-seconds", "--sim-slow-start", dest="sim_startup_seconds", type=float,
                     default=_env("STARTUP_SECONDS", float, _env("SLOW_START", float, 0.0)),
                     help="weight-loading time, with the HTTP port still closed")
    sim.add_argument("--sim-ttft-ms", dest="sim_ttft_ms", type=float, default=_env("TTFT_MS", float, 20.0))
    sim.add_argument("--sim-itl-ms", dest="sim_itl_ms", type=float, default=_env("ITL_MS", float, 5.0))
    sim.add_argument("--sim-max-running", dest="sim_max_running", type=int,
                     default=_env("MAX_RUNNING", int, 64),
                     help="running-batch size when --max-running-requests is not given; beyond it requests queue")
    sim.add_argument("--sim-crash-after", dest="sim_crash_after", type=int,
                     default=_env("CRASH_AFTER", int, None),
                     help="serve N requests, then exit hard in the middle of the next one")
    sim.add_argument("--sim-hang", dest="sim_hang", action="store_true", default=_env("HANG", _flag, False),
                     help="accept requests but never answer them")
    sim.add_argument("--sim-error-rate", dest="sim_error_rate", type=float,
                     default=_env("ERROR_RATE", float, 0.0), help="fraction of requests answered 500")
    sim.add_argument("--sim-perturb", dest="sim_perturb", action="store_true",
                     default=_env("PERTURB", _flag, False),
                     help="answer differently from an unperturbed simulator with the same seed")
    sim.add_argument("--sim-classifier", dest="sim_classifier", action="store_true",
                     default=_env("CLASSIFIER", _flag, False),
                     help="serve a sequence-classification reward model (/classify), as SGLang does for "
                          "*ForSequenceClassification and *ForRewardModel architectures")
    sim.add_argument("--sim-sigterm-poll-seconds", dest="sim_sigterm_poll_seconds", type=float,
                     default=_env("SIGTERM_POLL_SECONDS", float, SIGTERM_POLL_SECONDS),
                     help="how often a SIGTERMed engine checks whether it may exit (SGLang: 5)")
    return parser


def _check_like_sglang(args: argparse.Namespace) -> None:
    """The start-up checks of SGLang's argument resolution that a pool's flags can trip."""
    allowed = contract.load().deterministic_attention_backends
    backend = getattr(args, "attention_backend", None)
    if getattr(args, "enable_deterministic_inference", False) and backend is not None and backend not in allowed:
        sys.exit(f"genrm-sim: ValueError: Currently only {list(allowed)} attention backends are supported for "
                 f"deterministic inference, but you explicitly specified '{backend}'.")


def _int(value: object, default: int) -> int:
    return default if value is None else int(str(value))


def parse_config(argv: Sequence[str] | None = None) -> SimConfig:
    parser = build_parser()
    try:
        merged = ConfigMerger(parser).merge(sys.argv[1:] if argv is None else argv)
    except (ValueError, OSError, yaml.YAMLError) as exc:
        sys.exit(f"genrm-sim: {type(exc).__name__}: {exc}")
    args = parser.parse_args(merged)
    _check_like_sglang(args)
    given = vars(args)
    ignored = sorted({flag.names[0] for flag in contract.load().flags
                      if flag.dest in given and flag.dest not in _MODELLED})
    if ignored:
        print(f"genrm-sim: ignoring SGLang flags the simulator does not model: {' '.join(ignored)}",
              file=sys.stderr)
    seed = given.get("random_seed")
    return SimConfig(
        model_path=args.model_path,
        served_model_name=given.get("served_model_name") or args.model_path,
        host=given.get("host", "127.0.0.1"),
        port=given.get("port", 30000),
        random_seed=seed if seed is not None else random.randint(0, 1 << 30),
        enable_metrics=given.get("enable_metrics", False),
        enable_deterministic_inference=given.get("enable_deterministic_inference", False),
        tp_size=given.get("tp_size", 1),
        revision=given.get("revision"),
        weight_version=given.get("weight_version", SimConfig.weight_version),
        attention_backend=given.get("attention_backend"),
        api_key=given.get("api_key"),
        context_length=_int(given.get("context_length"), SimConfig.context_length),
        allow_auto_truncate=given.get("allow_auto_truncate", False),
        enable_priority_scheduling=given.get("enable_priority_scheduling", False),
        default_priority_value=given.get("default_priority_value"),
        is_generation=not (given.get("is_embedding", False) or args.sim_classifier),
        max_total_tokens=_int(given.get("max_total_tokens"), 65536),
        startup_seconds=args.sim_startup_seconds,
        ttft_ms=args.sim_ttft_ms,
        itl_ms=args.sim_itl_ms,
        max_running=_int(given.get("max_running_requests"), args.sim_max_running),
        crash_after=args.sim_crash_after,
        hang=args.sim_hang,
        error_rate=args.sim_error_rate,
        perturb=args.sim_perturb,
        sigterm_poll_seconds=args.sim_sigterm_poll_seconds,
    )


class SGLangLikeServer(uvicorn.Server):
    """SIGTERM as SGLang does it: /health and /ready turn 503, requests keep being served, and a
    watchdog that wakes every ``sigterm_poll_seconds`` lets the process exit once no request is left
    (at once if the last health check failed). A second signal exits at once (uvicorn's force exit).
    """

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, poll_seconds: float) -> None:
        super().__init__(config)
        self._scheduler = scheduler
        self._poll_seconds = poll_seconds

    async def serve(self, sockets: list[Any] | None = None) -> None:
        watchdog = asyncio.ensure_future(self._sigterm_watchdog())
        try:
            await super().serve(sockets)
        finally:
            watchdog.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._scheduler.exiting:
            self.force_exit = True
            self.should_exit = True
            return
        self._scheduler.exiting = True
        print(f"genrm-sim: signal {sig}: draining requests and shutting down", file=sys.stderr, flush=True)

    async def _sigterm_watchdog(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            if self._scheduler.exiting and (self._scheduler.unhealthy or not self._scheduler.pending):
                break
        if self._scheduler.unhealthy:
            print("genrm-sim: signal received while health check failed: force exiting", file=sys.stderr, flush=True)
            self.force_exit = True
        self.should_exit = True

def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    app, sim = create_app(config)
    # SGLang opens its HTTP port only once its schedulers have loaded the weights (launch_server runs
    # _launch_subprocesses, then the HTTP server): while loading, a connection is refused.
    time.sleep(config.startup_seconds)
    server = SGLangLikeServer(
        uvicorn.Config(app, host=config.host, port=config.port, loop="uvloop", http="httptools",
                       log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS,
                       timeout_graceful_shutdown=600),
        sim.scheduler,
        config.sigterm_poll_seconds,
    )
    server.run()

"""``genrm-sim``: accepts ``python -m sglang.launch_server``'s command line, plus ``--sim-*`` knobs.

Why the same flags: the operator renders one engine command line for both the real engine and
the simulator. SGLang flags the simulator cannot honour are accepted and ignored (one warning), and
every ``--sim-*`` flag also reads ``GENRM_SIM_*`` so a pod can turn on failure injection through
its environment without changing its args.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import uvicorn

from genrm_sim.api import create_app
from genrm_sim.config import SimConfig
from genrm_sim.model import Scheduler

_TRUE = {"1", "true", "yes", "on"}


def _env(name: str, convert: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(f"GENRM_SIM_{name}")
    return default if raw is None or raw == "" else convert(raw)


def _flag(raw: str) -> bool:
    return raw.strip().lower() in _TRUE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genrm-sim", description=__doc__)
    sglang = parser.add_argument_group("sglang.launch_server flags the simulator honours")
    sglang.add_argument("--model-path", "--model", required=True)
    sglang.add_argument("--served-model-name", default=None)
    sglang.add_argument("--host", default="127.0.0.1")
    sglang.add_argument("--port", type=int, default=30000)
    sglang.add_argument("--random-seed", type=int, default=None,
                        help="like SGLang, a random seed per process when unset")
    sglang.add_argument("--enable-metrics", action="store_true")
    sglang.add_argument("--enable-deterministic-inference", action="store_true")
    sglang.add_argument("--tp-size", "--tensor-parallel-size", "--tp", type=int, default=1)
    sglang.add_argument("--revision", default=None)
    sglang.add_argument("--max-total-tokens", type=int, default=65536)
    sim = parser.add_argument_group("simulator only (each also from env GENRM_SIM_<NAME>)")
    sim.add_argument("--sim-startup-seconds", "--sim-slow-start", dest="startup_seconds", type=float,
                     default=_env("STARTUP_SECONDS", float, _env("SLOW_START", float, 0.0)),
                     help="weight-loading time before /health turns 200")
    sim.add_argument("--sim-ttft-ms", dest="ttft_ms", type=float, default=_env("TTFT_MS", float, 20.0))
    sim.add_argument("--sim-itl-ms", dest="itl_ms", type=float, default=_env("ITL_MS", float, 5.0))
    sim.add_argument("--sim-max-running", dest="max_running", type=int,
                     default=_env("MAX_RUNNING", int, 64), help="beyond it requests queue")
    sim.add_argument("--sim-crash-after", dest="crash_after", type=int,
                     default=_env("CRASH_AFTER", int, None),
                     help="serve N requests, then exit hard in the middle of the next one")
    sim.add_argument("--sim-hang", dest="hang", action="store_true", default=_env("HANG", _flag, False),
                     help="accept requests but never answer them")
    sim.add_argument("--sim-error-rate", dest="error_rate", type=float,
                     default=_env("ERROR_RATE", float, 0.0), help="fraction of requests answered 500")
    sim.add_argument("--sim-perturb", dest="perturb", action="store_true",
                     default=_env("PERTURB", _flag, False),
                     help="answer differently from an unperturbed simulator with the same seed")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> SimConfig:
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        print(f"genrm-sim: ignoring SGLang flags the simulator does not model: {' '.join(unknown)}",
              file=sys.stderr)
    return SimConfig(
        model_path=args.model_path,
        served_model_name=args.served_model_name or args.model_path,
        host=args.host,
        port=args.port,
        random_seed=args.random_seed if args.random_seed is not None else random.randint(0, 1 << 30),
        enable_metrics=args.enable_metrics,
        enable_deterministic_inference=args.enable_deterministic_inference,
        tp_size=args.tp_size,
        revision=args.revision,
        max_total_tokens=args.max_total_tokens,
        startup_seconds=args.startup_seconds,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        max_running=args.max_running,
        crash_after=args.crash_after,
        hang=args.hang,
        error_rate=args.error_rate,
        perturb=args.perturb,
    )


class SGLangLikeServer(uvicorn.Server):
    """SIGTERM as SGLang does it: /health turns 503, running requests finish, then the process exits.

    A second signal exits at once (uvicorn's force exit).
    """

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self._scheduler = scheduler
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._scheduler.exiting or self._loop is None:
            self.force_exit = True
            self.should_exit = True
            return
        self._scheduler.exiting = True
        print(f"genrm-sim: signal {sig}: gracefully exiting once running requests finish",
              file=sys.stderr, flush=True)
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._exit_when_idle()))

    async def _exit_when_idle(self) -> None:
        await self._scheduler.wait_idle()
        self.should_exit = True


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    app, sim = create_app(config)
    server = SGLangLikeServer(
        uvicorn.Config(app, host=config.host, port=config.port, loop="uvloop", http="httptools",
                       log_level="warning", access_log=False, timeout_keep_alive=30,
                       timeout_graceful_shutdown=600),
        sim.scheduler,
    )
    server.run()

"""``genrm-gateway serve`` (the sidecar) and ``genrm-gateway drain`` (its preStop hook).

Every flag falls back to an environment variable, so the chart can configure the sidecar through
env while tests and humans use flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from genrm_gateway.app import Gateway
from genrm_gateway.coalesce import CoalescingHttpToolsProtocol
from genrm_gateway.config import EngineAddress, GatewayConfig
from genrm_gateway.prestop import PreStopDrain
from genrm_gateway.server import GatewayServer

# Far beyond any judge request: uvicorn must never cut in-flight requests on shutdown by itself.
GRACEFUL_SHUTDOWN_SECONDS = 3600


def _env(name: str, convert: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else convert(raw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genrm-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def port_and_propagation(command: argparse.ArgumentParser) -> None:
        command.add_argument("--port", type=int, default=_env("GENRM_GATEWAY_PORT", int, 8000))
        command.add_argument("--propagation-seconds", type=float,
                             default=_env("GENRM_PROPAGATION_SECONDS", float, 5.0),
                             help="how long endpoints take to stop routing here after soft drain")

    serve = commands.add_parser("serve", help="run the sidecar")
    serve.add_argument("--host", default=_env("GENRM_GATEWAY_HOST", str, "0.0.0.0"))
    port_and_propagation(serve)
    serve.add_argument("--engine-url", default=_env("GENRM_ENGINE_URL", str, "http://127.0.0.1:30000"))
    serve.add_argument("--max-body-bytes", type=int, default=_env("GENRM_MAX_BODY_BYTES", int, 1 << 20))
    serve.add_argument("--quiet-seconds", type=float, default=_env("GENRM_QUIET_SECONDS", float, 2.0),
                       help="how long in-flight zero and an idle engine must hold before Drained")
    serve.add_argument("--engine-poll-seconds", type=float,
                       default=_env("GENRM_ENGINE_POLL_SECONDS", float, 1.0),
                       help="how often the engine's health and load are read")

    drain = commands.add_parser("drain", help="drain the local gateway (the preStop hook)")
    port_and_propagation(drain)
    drain.add_argument("--wait", action="store_true", required=True,
                       help="block until Drained or the deadline (the only mode)")
    drain.add_argument("--deadline-seconds", type=float, required=True)
    drain.add_argument("--drain-id", default="preStop")
    return parser


def serve(args: argparse.Namespace) -> None:
    config = GatewayConfig(
        host=args.host,
        port=args.port,
        engine=EngineAddress.parse(args.engine_url),
        max_body_bytes=args.max_body_bytes,
        quiet_seconds=args.quiet_seconds,
        propagation_seconds=args.propagation_seconds,
        engine_poll_seconds=args.engine_poll_seconds,
    )
    gateway = Gateway(config)
    server = GatewayServer(
        uvicorn.Config(gateway, host=config.host, port=config.port, loop="uvloop", http=CoalescingHttpToolsProtocol,
                       lifespan="on", log_level="warning", access_log=False, server_header=False,
                       proxy_headers=False,
                       timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS),
        gateway,
    )
    server.run()


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
        return
    sys.exit(PreStopDrain(port=args.port, drain_id=args.drain_id, deadline_seconds=args.deadline_seconds,
                          propagation_seconds=args.propagation_seconds).run())

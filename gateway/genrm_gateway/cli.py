"""``genrm-gateway serve`` (the sidecar), ``genrm-gateway drain`` (its preStop hook),
``genrm-gateway engine-key`` (the init container of a key-protected pool) and ``genrm-gateway
activator`` (what a pool's Service points at while the pool is at zero).

Every flag falls back to an environment variable, so the chart can configure the sidecar through
env while tests and humans use flags. No flag takes an API key itself: a command line is visible to
every process of the node and in the pod spec, so the key comes from a file or the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from genrm_contract.drained import control_token
from genrm_contract.sidecar import ENGINE_KEY_ENV, JUDGE_REVISION_FLAG, JUDGE_REVISION_PATTERN

from genrm_gateway.activator import STOP_DEADLINE_SECONDS, Activator, ActivatorServer
from genrm_gateway.apikey import checked, read_key_file, write_engine_files
from genrm_gateway.app import Gateway
from genrm_gateway.config import EngineAddress, GatewayConfig, Limits
from genrm_gateway.prestop import PreStopDrain
from genrm_gateway.server import GatewayServer

# Far beyond any judge request: uvicorn must never cut in-flight requests on shutdown by itself.
GRACEFUL_SHUTDOWN_SECONDS = 3600
DEFAULTS = GatewayConfig()
# Open files beyond the client connections and an engine connection for each: the listening
# sockets, the control port's clients (kubelet, operator, Prometheus), the event loop's own, stdio.
OPEN_FILES_MARGIN = 256


def _env(name: str, convert: Callable[[str], Any], default: Any) -> Any:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else convert(raw)


def _judge_revision(value: str) -> str:
    """A judge revision fit for a header as it is: nothing from a flag reaches a response unchecked."""
    if value and not re.fullmatch(JUDGE_REVISION_PATTERN, value):
        raise argparse.ArgumentTypeError(f"a judge revision matches {JUDGE_REVISION_PATTERN}, not {value!r}")
    return value


def _add_limits(command: argparse.ArgumentParser) -> None:
    """One flag per field of ``Limits`` (``--max-head-bytes``, env ``GENRM_MAX_HEAD_BYTES``, ...)."""
    for limit in dataclasses.fields(Limits):
        convert = type(limit.default)
        command.add_argument(f"--{limit.name.replace('_', '-')}", type=convert,
                             default=_env(f"GENRM_{limit.name.upper()}", convert, limit.default),
                             help=limit.metadata["help"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genrm-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def control_port_and_propagation(command: argparse.ArgumentParser) -> None:
        command.add_argument("--control-port", type=int,
                             default=_env("GENRM_CONTROL_PORT", int, DEFAULTS.control_port),
                             help="probes, the drain API and /metrics")
        command.add_argument("--propagation-seconds", type=float,
                             default=_env("GENRM_PROPAGATION_SECONDS", float, DEFAULTS.propagation_seconds),
                             help="how long endpoints take to stop routing here after soft drain")

    serve = commands.add_parser("serve", help="run the sidecar")
    serve.add_argument("--host", default=_env("GENRM_GATEWAY_HOST", str, DEFAULTS.host))
    serve.add_argument("--port", type=int, default=_env("GENRM_GATEWAY_PORT", int, DEFAULTS.port),
                       help="judge traffic (the Service's target)")
    control_port_and_propagation(serve)
    serve.add_argument("--engine-url", default=_env("GENRM_ENGINE_URL", str, "http://127.0.0.1:30000"))
    serve.add_argument("--quiet-seconds", type=float,
                       default=_env("GENRM_QUIET_SECONDS", float, DEFAULTS.quiet_seconds),
                       help="how long in-flight zero and an idle engine must hold before Drained")
    serve.add_argument("--engine-poll-seconds", type=float,
                       default=_env("GENRM_ENGINE_POLL_SECONDS", float, DEFAULTS.engine_poll_seconds),
                       help="how often the engine's health and load are read")
    serve.add_argument("--engine-api-key-file", default=_env("GENRM_ENGINE_API_KEY_FILE", str, None),
                       help="the engine's API key (SGLang's --api-key), sent on every engine call and demanded "
                            "from judge clients on the traffic port")
    serve.add_argument("--peers-valid-seconds", type=float,
                       default=_env("GENRM_PEERS_VALID_SECONDS", float, DEFAULTS.peers_valid_seconds),
                       help="how long the peers the operator named stay in use after its last control call "
                            "(tests shorten it)")
    serve.add_argument(JUDGE_REVISION_FLAG, type=_judge_revision, default=_env("GENRM_JUDGE_REVISION", str, ""),
                       help="the replica's judge revision, sent as x-genrm-revision on every answer (the operator "
                            "sets it; the engine's --weight-version has the same value)")
    serve.add_argument("--loopback-peers", action="store_true",
                       help="testing only: accept loopback peer addresses (in a pod, loopback is the pod itself)")
    _add_limits(serve)

    key = commands.add_parser("engine-key", help=f"write a key-protected engine's --config file and the gateway's "
                                                 f"key file from ${ENGINE_KEY_ENV} (the pod's init container)")
    key.add_argument("--dir", required=True, help="the pod's volume both files go to")

    activator = commands.add_parser("activator", help="hold requests for pools at zero until a replica serves")
    activator.add_argument("--host", default=_env("GENRM_ACTIVATOR_HOST", str, DEFAULTS.host))
    activator.add_argument("--port", type=int, default=_env("GENRM_ACTIVATOR_PORT", int, DEFAULTS.port),
                           help="held traffic (where the Service of a pool at zero points)")
    activator.add_argument("--control-port", type=int,
                           default=_env("GENRM_ACTIVATOR_CONTROL_PORT", int, DEFAULTS.control_port),
                           help="the operator's routes and the held-request state (control token)")
    activator.add_argument("--stop-deadline-seconds", type=float,
                           default=_env("GENRM_ACTIVATOR_STOP_DEADLINE_SECONDS", float, STOP_DEADLINE_SECONDS),
                           help="after SIGTERM, what is still held this long is answered with a retryable 503 "
                                "and no forward starts; the pod's grace period less the time its last forwards "
                                "may take")
    _add_limits(activator)

    drain = commands.add_parser("drain", help="drain the local gateway (the preStop hook)")
    control_port_and_propagation(drain)
    drain.add_argument("--wait", action="store_true", required=True,
                       help="block until Drained or the deadline (the only mode)")
    drain.add_argument("--deadline-seconds", type=float, required=True)
    drain.add_argument("--drain-id", default="preStop")
    return parser


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def ensure_open_files(max_connections: int) -> None:
    """Raise the soft open-file limit to the hard one; exit when that cannot hold
    ``max_connections`` client connections, an engine connection for each and the margin.

    Why: past the limit, accepting and connecting fail, so the probes and judge requests get
    resets instead of the documented ``503 tooManyConnections``; a container's soft limit is often
    1,024. Each client connection runs one request at a time, so it holds one engine connection
    at most (a pipelined request waits for the one before it).
    """
    needed = 2 * max_connections + OPEN_FILES_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        sys.exit(f"genrm-gateway: --max-connections {max_connections} needs {needed} open files (a client and an "
                 f"engine connection each, and {OPEN_FILES_MARGIN} more), but the hard RLIMIT_NOFILE is {hard}; "
                 "raise the container's open-file limit or lower maxConnections")
    if hard != resource.RLIM_INFINITY:
        target = hard
    else:  # an unlimited soft limit is refused for open files; ask for what is needed
        target = soft if soft == resource.RLIM_INFINITY or soft >= needed else needed
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def serve(args: argparse.Namespace) -> None:
    if args.port == args.control_port:
        sys.exit("genrm-gateway: --port and --control-port must differ")
    try:
        api_key = None if args.engine_api_key_file is None else read_key_file(args.engine_api_key_file)
    except ValueError as exc:
        sys.exit(f"genrm-gateway: {exc}")
    limits = Limits(**{limit.name: getattr(args, limit.name) for limit in dataclasses.fields(Limits)})
    ensure_open_files(limits.max_connections)
    config = GatewayConfig(
        host=args.host,
        port=args.port,
        control_port=args.control_port,
        engine=EngineAddress.parse(args.engine_url),
        limits=limits,
        quiet_seconds=args.quiet_seconds,
        propagation_seconds=args.propagation_seconds,
        engine_poll_seconds=args.engine_poll_seconds,
        engine_api_key=api_key,
        peers_valid_seconds=args.peers_valid_seconds,
        loopback_peers=args.loopback_peers,
        judge_revision=args.judge_revision,  # checked by the flag's type, the environment's value included
    )
    gateway = Gateway(config)
    sockets = [_listen(config.host, config.port), _listen(config.host, config.control_port)]
    server = GatewayServer(
        uvicorn.Config(gateway, loop="uvloop", http=gateway.protocol, ws="none",
                       lifespan="on", log_level="warning", access_log=False, server_header=False,
                       proxy_headers=False, timeout_keep_alive=round(limits.keep_alive_seconds),
                       timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS, headers=config.response_headers()),
        gateway,
    )
    server.run(sockets)


def activate(args: argparse.Namespace) -> None:
    """Run the activator. On SIGTERM it keeps taking traffic for the propagation window, then stops
    taking it and exits once it holds nothing, or at ``--stop-deadline-seconds`` with what it still
    holds refused (`ActivatorServer`); forwarded answers still streaming then get up to
    ``GRACEFUL_SHUTDOWN_SECONDS`` (the kubelet's kill comes first)."""
    if args.port == args.control_port:
        sys.exit("genrm-gateway activator: --port and --control-port must differ")
    if args.stop_deadline_seconds <= 0:
        sys.exit("genrm-gateway activator: --stop-deadline-seconds must be positive")
    token = control_token()
    if not token:
        sys.exit("genrm-gateway activator: a control token is required (the operator's routes need it)")
    limits = Limits(**{limit.name: getattr(args, limit.name) for limit in dataclasses.fields(Limits)})
    ensure_open_files(limits.max_connections)
    app = Activator(args.port, args.control_port, token, limits, args.stop_deadline_seconds)
    server = ActivatorServer(uvicorn.Config(
        app, loop="uvloop", http=app.protocol, ws="none", lifespan="on", log_level="warning", access_log=False,
        server_header=False, proxy_headers=False, timeout_keep_alive=round(limits.keep_alive_seconds),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS), app)
    server.run([_listen(args.host, args.port), _listen(args.host, args.control_port)])


def engine_key(args: argparse.Namespace) -> None:
    try:
        write_engine_files(Path(args.dir), checked(os.environ.get(ENGINE_KEY_ENV, ""), f"${ENGINE_KEY_ENV}"))
    except (ValueError, OSError) as exc:
        sys.exit(f"genrm-gateway engine-key: {exc}")


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
        return
    if args.command == "engine-key":
        engine_key(args)
        return
    if args.command == "activator":
        activate(args)
        return
    sys.exit(PreStopDrain(port=args.control_port, drain_id=args.drain_id, deadline_seconds=args.deadline_seconds,
                          propagation_seconds=args.propagation_seconds).run())

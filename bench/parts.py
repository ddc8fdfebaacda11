"""``make bench-parts``: the gateway's HTTP parts against maintained alternatives, in one run.

Why: the gateway keeps two pieces of HTTP code of its own, a uvicorn protocol subclass on the
client side (limits, pipelining bound, hand-back, coalesced writes) and a pooled engine client.
Each has to earn its place against a maintained part that would do the job with its own limits:

* servers, each running the gateway's own ASGI app in front of the same zero-latency simulator,
  measured with the same load generator and interleaved per round: the shipped protocol, uvicorn's
  h11 protocol (its pure-Python parser, the one with the strictest reading of RFC 9112) and
  granian (hyper, in Rust);
* engine clients, each sending the gateway's judge request to the simulator from one event loop:
  the gateway's pool, aiohttp (with its own connection limit and timeouts) and httpx (h11 inside),
  as the client process's CPU per request and requests per second.

Loopback only. The server rows keep the gateway's whole request path (admission, in-flight, the
engine client); only the HTTP server under it changes, so a row's difference is that server's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack

import aiohttp
import httpx
import uvicorn
import uvloop
from genrm_gateway.app import Gateway
from genrm_gateway.config import EngineAddress, GatewayConfig
from genrm_gateway.upstream import EnginePool, Exchange
from genrm_testing import free_port, launched, wait_ready
from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops

from bench.gateway import BODY, ROUNDS, RUN_SECONDS, WARMUP_SECONDS, measure, median_result
from bench.loadgen import LoadResult

SERVERS = ("gateway", "uvicorn-h11", "granian")
CONCURRENCIES = (1, 64)
CLIENT_CONCURRENCIES = (1, 64)
CLIENT_SECONDS = 2.0
ENGINE_ENV = "GENRM_BENCH_ENGINE_URL"


def tree_cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` and its descendants (granian serves from a child process)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)], ticks[int(entry)] = int(fields[1]), int(fields[11]) + int(fields[12])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, of in parents.items() if of == parent and child not in tree]
        tree.update(children)
        frontier += children
    return sum(ticks.get(member, 0) for member in tree) / os.sysconf("SC_CLK_TCK")


def _gateway(engine_url: str, port: int) -> Gateway:
    return Gateway(GatewayConfig(host="127.0.0.1", port=port, control_port=free_port(),
                                 engine=EngineAddress.parse(engine_url), propagation_seconds=0))


def granian_app() -> Gateway:
    """granian's factory target (it imports the app in its own worker)."""
    return _gateway(os.environ[ENGINE_ENV], int(os.environ["GENRM_BENCH_PORT"]))


def serve(server: str, engine_url: str, port: int) -> None:
    """One alternative server in front of the gateway's app, in this process."""
    if server == "uvicorn-h11":
        uvicorn.run(_gateway(engine_url, port), host="127.0.0.1", port=port, loop="uvloop", http="h11",
                    ws="none", lifespan="on", log_level="warning", access_log=False, server_header=False)
    elif server == "granian":
        os.environ |= {ENGINE_ENV: engine_url, "GENRM_BENCH_PORT": str(port)}
        Granian("bench.parts:granian_app", address="127.0.0.1", port=port, interface=Interfaces.ASGI,
                workers=1, loop=Loops.uvloop, http=HTTPModes.http1, websockets=False, factory=True,
                log_enabled=False).serve()
    else:
        raise SystemExit(f"unknown server {server}")


# --- engine clients ---------------------------------------------------------------------------------


Call = Callable[[], Awaitable[int]]


async def _run_client(call: Call, concurrency: int) -> tuple[float, float]:
    """Requests per second and the process's CPU microseconds per request over ``CLIENT_SECONDS``."""
    async def worker(until: float, count: list[int]) -> None:
        while time.perf_counter() < until:
            status = await call()
            assert status == 200, status
            count[0] += 1

    await asyncio.gather(*(worker(time.perf_counter() + 0.3, [0]) for _ in range(concurrency)))  # warm up
    count = [0]
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(wall + CLIENT_SECONDS, count) for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return count[0] / wall, cpu / count[0] * 1e6


async def _clients(engine_url: str, concurrency: int) -> dict[str, tuple[float, float]]:
    body = BODY.encode()
    pool = EnginePool(EngineAddress.parse(engine_url))
    request = pool.serialize("POST", "/generate", body, ((b"content-type", b"application/json"),))

    async def gateway_call() -> int:
        exchange = Exchange()
        await pool.send(exchange, request)
        await exchange.read()
        return exchange.status

    results = {"gateway": await _run_client(gateway_call, concurrency)}
    pool.close()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=300)
    async with aiohttp.ClientSession(engine_url, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=4096)) as session:
        async def aiohttp_call() -> int:
            async with session.post("/generate", data=body, headers={"content-type": "application/json"}) as r:
                await r.read()
                return r.status

        results["aiohttp"] = await _run_client(aiohttp_call, concurrency)
    async with httpx.AsyncClient(base_url=engine_url, limits=httpx.Limits(max_connections=4096),
                                 timeout=httpx.Timeout(300, connect=5)) as client:
        async def httpx_call() -> int:
            return (await client.post("/generate", content=body, headers={"content-type": "application/json"})
                    ).status_code

        results["httpx"] = await _run_client(httpx_call, concurrency)
    return results


# --- the run ----------------------------------------------------------------------------------------


def _start_servers(stack: ExitStack, engine_url: str) -> tuple[dict[str, int], dict[str, int]]:
    """Each server in front of the engine: their ports (the engine's as ``direct``) and pids."""
    py = sys.executable
    ports = {"direct": int(engine_url.rsplit(":", 1)[1])}
    pids: dict[str, int] = {}
    for server in SERVERS:
        port = ports[server] = free_port()
        if server == "gateway":
            command = [py, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--control-port", str(free_port()), "--engine-url", engine_url, "--propagation-seconds", "0"]
        else:
            command = [py, "-m", "bench.parts", "--serve", server, "--engine-url", engine_url,
                       "--port", str(port)]
        pids[server] = stack.enter_context(launched(command, env=os.environ | {"GENRM_CONTROL_TOKEN": "bench"})).pid
        wait_ready(f"http://127.0.0.1:{port}/v1/models")
    return ports, pids


Figures = dict[tuple[str, int], tuple[LoadResult, float]]


def _measure_servers(ports: dict[str, int], pids: dict[str, int]) -> Figures:
    """Each server's load figures and CPU microseconds per request, medians over interleaved rounds."""
    figures: Figures = {}
    print(f"{'server':<12} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'cpu us/req':>11}")
    for concurrency in CONCURRENCIES:
        runs: dict[str, list[LoadResult]] = {name: [] for name in ports}
        cpu: dict[str, list[float]] = {name: [0.0] for name in ports}
        for _ in range(ROUNDS):
            for name, port in ports.items():
                before = tree_cpu_seconds(pids[name]) if name in pids else 0.0
                run = measure(port, concurrency, RUN_SECONDS, WARMUP_SECONDS)
                runs[name].append(run)
                if name in pids:  # the warm-up's requests are served too, at about the same rate
                    served = run.rps * (RUN_SECONDS + WARMUP_SECONDS)
                    cpu[name].append((tree_cpu_seconds(pids[name]) - before) / served * 1e6)
        for name, samples in runs.items():
            result, per_request = median_result(samples), statistics.median(cpu[name][1:] or cpu[name])
            figures[(name, concurrency)] = (result, per_request)
            print(f"{name:<12} {concurrency:>5} {result.rps:>9.0f} {result.p50_ms:>8.3f} "
                  f"{result.p99_ms:>8.3f} {result.errors:>6} {per_request:>11.1f}", flush=True)
    return figures


def _measure_clients(engine_url: str) -> dict[tuple[str, int], tuple[float, float]]:
    """Each engine client's requests per second and CPU microseconds per request, medians over rounds."""
    figures: dict[tuple[str, int], tuple[float, float]] = {}
    print(f"{'client':<12} {'conc':>5} {'req/s':>9} {'cpu us/req':>11}")
    for concurrency in CLIENT_CONCURRENCIES:
        rounds = [uvloop.run(_clients(engine_url, concurrency)) for _ in range(ROUNDS)]
        for name in rounds[0]:
            rps = statistics.median(r[name][0] for r in rounds)
            cpu = statistics.median(r[name][1] for r in rounds)
            figures[(name, concurrency)] = (rps, cpu)
            print(f"{name:<12} {concurrency:>5} {rps:>9.0f} {cpu:>11.1f}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.parts", description=__doc__)
    parser.add_argument("--serve", choices=SERVERS[1:], help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.engine_url, args.port)
        return
    engine_port = free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    with ExitStack() as stack:
        stack.enter_context(launched([
            sys.executable, "-m", "genrm_sim", "--model-path", "bench-judge", "--port", str(engine_port),
            "--random-seed", "1", "--enable-metrics", "--sim-ttft-ms", "0", "--sim-itl-ms", "0",
            "--sim-max-running", "4096"]))
        wait_ready(f"{engine_url}/ready")
        servers = _measure_servers(*_start_servers(stack, engine_url))
        clients = _measure_clients(engine_url)
    (direct1, _), (direct64, _) = servers[("direct", 1)], servers[("direct", 64)]
    server_line = " ".join(
        f"{name}_c64_ratio={servers[(name, 64)][0].rps / direct64.rps:.3f} "
        f"{name}_c1_added_ms={servers[(name, 1)][0].p50_ms - direct1.p50_ms:.3f} "
        f"{name}_c64_cpu_us={servers[(name, 64)][1]:.1f}" for name in SERVERS)
    client_line = " ".join(f"client_{name}_c64_cpu_us={clients[(name, 64)][1]:.1f}"
                           for name in ("gateway", "aiohttp", "httpx"))
    print(f"parts-bench: {server_line} {client_line}")


if __name__ == "__main__":
    main()

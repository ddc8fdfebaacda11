"""``make bench-gateway``: the gateway's added cost, measured against the engine directly and nginx.

Why one run for all targets: the same zero-latency simulator, load generator and machine state
serve the direct, the gateway and the nginx measurements, interleaved per concurrency, so the
differences are the proxies' and not the machine's drift. Everything listens on 127.0.0.1.

A fourth row, ``py-floor`` (``bench/floor.py``), is the leanest proxy Python allows with the judge
work no gateway can skip: what any data path in Python pays, whatever its design, beside what
the gateway and nginx pay.

``--engine sglang`` (``make bench-gateway ENGINE=sglang``) measures the same way against real SGLang
on CPU with its tiny model (``genrm_testing.realengine``): there a request costs ~0.1 s of model
work, so the question is whether the gateway costs throughput or latency next to a real engine's
own batching, at the concurrencies two cores can serve.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from genrm_testing import free_port, launched, realengine, wait_ready

from bench.loadgen import LoadResult

CONCURRENCIES = (1, 64, 256)
# Each figure is the median over ROUNDS interleaved runs: one run on a 2-core machine is noisy.
ROUNDS = 3
# Unloaded, what a proxy adds is as small as the drift between rounds: more rounds there.
C1_ROUNDS = 9
RUN_SECONDS = 2.0
WARMUP_SECONDS = 0.5
REAL_CONCURRENCIES = (1, 8, 32)
"""Real SGLang on two cores answers ~10 such requests a second alone and batches a few dozen."""
REAL_ROUNDS = 3
REAL_RUN_SECONDS = 8.0
REAL_WARMUP_SECONDS = 2.0
NGINX = Path("/usr/sbin/nginx")
BODY = json.dumps({"text": "Question: 2+2? Answer: 4. Judge the answer.",
                   "sampling_params": {"max_new_tokens": 16, "temperature": 0}})

NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 512; keepalive_requests 10000000; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def ensure_nginx() -> bool:
    """Install Debian's nginx once when missing (as root); False when it stays unavailable."""
    if NGINX.exists():
        return True
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nginx-light"]):
        try:
            subprocess.run(command, env=env, check=True, timeout=300, capture_output=True)
        except (subprocess.SubprocessError, OSError):
            if command[1] == "update":
                return False
            try:
                subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], env=env, check=True,
                               timeout=300, capture_output=True)
            except (subprocess.SubprocessError, OSError):
                return False
    return NGINX.exists()


def wait_listening(port: int, seconds: float = 30.0) -> None:
    """Until a loopback port accepts connections (the floor proxy answers nothing but judge calls)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def measure(port: int, concurrency: int, seconds: float, warmup: float) -> LoadResult:
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--body", BODY,
         "--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", str(warmup)],
        check=True, capture_output=True, timeout=60 + seconds,
    ).stdout
    return LoadResult(**json.loads(out))


def median_result(samples: list[LoadResult]) -> LoadResult:
    """Each figure's median over the rounds (errors summed)."""
    return LoadResult(
        requests=int(statistics.median(r.requests for r in samples)),
        errors=sum(r.errors for r in samples),
        rps=statistics.median(r.rps for r in samples),
        p50_ms=statistics.median(r.p50_ms for r in samples),
        p99_ms=statistics.median(r.p99_ms for r in samples),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=("sim", "sglang"), default="sim")
    if parser.parse_args(argv).engine == "sglang":
        real_engine()
    else:
        simulated_engine()


def real_engine() -> None:
    """Direct, gateway and nginx in front of real SGLang; one line with the ratios at the end."""
    with ExitStack() as stack:
        log = Path(tempfile.mkdtemp(prefix="genrm-bench-sglang-")) / "engine.log"
        engine = stack.enter_context(realengine.run_engine(log))
        targets = {"direct": engine.port, **fronts(stack, engine.port, floor=False)}
        runs = rounds(targets, REAL_CONCURRENCIES, REAL_ROUNDS, REAL_RUN_SECONDS, REAL_WARMUP_SECONDS)
    direct = {c: median_result(runs[("direct", c)]) for c in REAL_CONCURRENCIES}
    gateway = {c: median_result(runs[("gateway", c)]) for c in REAL_CONCURRENCIES}
    figures = [f"c{c}_throughput_ratio={gateway[c].rps / direct[c].rps:.3f} "
               f"c{c}_p50_added_ms={median_added(runs, 'gateway', c)}" for c in REAL_CONCURRENCIES]
    print(f"gateway-bench-sglang: {' '.join(figures)} direct_c1_p50_ms={direct[1].p50_ms:.1f}")


def fronts(stack: ExitStack, engine_port: int, floor: bool = True) -> dict[str, int]:
    """The gateway, the Python floor (``floor``) and nginx (when it can be had) in front of the engine."""
    py = sys.executable
    gateway_port, control_port = free_port(), free_port()
    stack.enter_context(launched([
            py, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(gateway_port),
            "--control-port", str(control_port), "--engine-url", f"http://127.0.0.1:{engine_port}",
            "--propagation-seconds", "0"],
            env=os.environ | {"GENRM_CONTROL_TOKEN": "bench"}))
    wait_ready(f"http://127.0.0.1:{engine_port}/ready")
    wait_ready(f"http://127.0.0.1:{control_port}/healthz/ready")
    targets = {"gateway": gateway_port}
    if floor:
        floor_port = free_port()
        stack.enter_context(launched([py, "-m", "bench.floor", str(floor_port), str(engine_port)]))
        wait_listening(floor_port)
        targets["py-floor"] = floor_port
    if ensure_nginx():
        nginx_port = free_port()
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="genrm-bench-nginx-")))
        conf = workdir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=workdir, engine_port=engine_port, port=nginx_port))
        stack.enter_context(launched([str(NGINX), "-p", str(workdir), "-e", str(workdir / "error.log"),
                                     "-c", str(conf), "-g", "daemon off;"]))
        wait_ready(f"http://127.0.0.1:{nginx_port}/v1/models")
        targets["nginx"] = nginx_port
    return targets


Runs = dict[tuple[str, int], list[LoadResult]]


def rounds(targets: dict[str, int], concurrencies: tuple[int, ...], count: int, seconds: float,
           warmup: float) -> Runs:
    """Every target at every concurrency, interleaved round by round; a table row per median."""
    runs: Runs = {}
    print(f"{'target':<8} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for concurrency in concurrencies:
        for _ in range(C1_ROUNDS if concurrency == 1 and count == ROUNDS else count):
            for name, port in targets.items():
                runs.setdefault((name, concurrency), []).append(measure(port, concurrency, seconds, warmup))
        for name in targets:
            result = median_result(runs[(name, concurrency)])
            print(f"{name:<8} {concurrency:>5} {result.rps:>9.0f} {result.p50_ms:>8.3f} "
                  f"{result.p99_ms:>8.3f} {result.errors:>6}", flush=True)
    return runs


def added(runs: Runs, name: str, concurrency: int) -> list[float]:
    """The p50 a target adds to direct's, round by round (each round measures both back to back)."""
    return [r.p50_ms - d.p50_ms for r, d in zip(runs.get((name, concurrency), []), runs[("direct", concurrency)],
                                                 strict=False)]


def median_added(runs: Runs, name: str, concurrency: int) -> str:
    each = added(runs, name, concurrency)
    return f"{statistics.median(each):.3f}" if each else "na"


def simulated_engine() -> None:
    """Direct, gateway, the Python floor and nginx in front of the zero-latency simulator."""
    engine_port = free_port()
    with ExitStack() as stack:
        stack.enter_context(launched([
            sys.executable, "-m", "genrm_sim", "--model-path", "bench-judge", "--port", str(engine_port),
            "--random-seed", "1", "--enable-metrics", "--sim-ttft-ms", "0", "--sim-itl-ms", "0",
            "--sim-max-running", "4096"]))
        targets = {"direct": engine_port, **fronts(stack, engine_port)}
        runs = rounds(targets, CONCURRENCIES, ROUNDS, RUN_SECONDS, WARMUP_SECONDS)
    nginx_c1 = added(runs, "nginx", 1)
    nginx_range = f"{min(nginx_c1):.3f}..{max(nginx_c1):.3f}" if nginx_c1 else "na"
    direct, gateway = median_result(runs[("direct", 64)]), median_result(runs[("gateway", 64)])
    print(f"gateway-bench: c64_throughput_ratio={gateway.rps / direct.rps:.3f} "
          f"c64_p50_added_ms={median_added(runs, 'gateway', 64)} c64_p99_added_ms={gateway.p99_ms - direct.p99_ms:.3f} "
          f"nginx_c64_p50_added_ms={median_added(runs, 'nginx', 64)} "
          f"c1_p50_added_ms={median_added(runs, 'gateway', 1)} "
          f"nginx_c1_p50_added_ms={median_added(runs, 'nginx', 1)} nginx_c1_rounds_ms={nginx_range} "
          f"py_floor_c1_p50_added_ms={median_added(runs, 'py-floor', 1)}")


if __name__ == "__main__":
    main()

"""``make bench-gateway``: the gateway's added cost, measured against the engine directly and nginx.

Why one run for all targets: the same zero-latency simulator, load generator and machine state
serve the direct, the gateway and the nginx measurements, interleaved per concurrency, so the
differences are the proxies' and not the machine's drift. Everything listens on 127.0.0.1.

A fourth row, ``py-floor`` (``bench/floor.py``), is the leanest proxy Python allows with the judge
work no gateway can skip: what any data path in Python pays, whatever its design, beside what
the gateway and nginx pay.
"""

from __future__ import annotations

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

from genrm_testing import free_port, launched, wait_ready

from bench.loadgen import LoadResult

CONCURRENCIES = (1, 64, 256)
# Each figure is the median over ROUNDS interleaved runs: one run on a 2-core machine is noisy.
ROUNDS = 3
# Unloaded, what a proxy adds is as small as the drift between rounds: more rounds there.
C1_ROUNDS = 9
RUN_SECONDS = 2.0
WARMUP_SECONDS = 0.5
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


def measure(port: int, concurrency: int) -> LoadResult:
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--body", BODY,
         "--concurrency", str(concurrency), "--seconds", str(RUN_SECONDS), "--warmup", str(WARMUP_SECONDS)],
        check=True, capture_output=True, timeout=60,
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


def main() -> None:
    py = sys.executable
    engine_port, gateway_port, control_port = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        stack.enter_context(launched([
            py, "-m", "genrm_sim", "--model-path", "bench-judge", "--port", str(engine_port),
            "--random-seed", "1", "--enable-metrics", "--sim-ttft-ms", "0", "--sim-itl-ms", "0",
            "--sim-max-running", "4096"]))
        stack.enter_context(launched([
            py, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(gateway_port),
            "--control-port", str(control_port), "--engine-url", f"http://127.0.0.1:{engine_port}",
            "--propagation-seconds", "0"],
            env=os.environ | {"GENRM_CONTROL_TOKEN": "bench"}))
        wait_ready(f"http://127.0.0.1:{engine_port}/ready")
        wait_ready(f"http://127.0.0.1:{control_port}/healthz/ready")
        targets = {"direct": engine_port, "gateway": gateway_port}
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
        results: dict[tuple[str, int], LoadResult] = {}
        runs: dict[tuple[str, int], list[LoadResult]] = {}
        print(f"{'target':<8} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        for concurrency in CONCURRENCIES:
            for _ in range(C1_ROUNDS if concurrency == 1 else ROUNDS):
                for name, port in targets.items():
                    runs.setdefault((name, concurrency), []).append(measure(port, concurrency))
            for name in targets:
                result = results[(name, concurrency)] = median_result(runs[(name, concurrency)])
                print(f"{name:<8} {concurrency:>5} {result.rps:>9.0f} {result.p50_ms:>8.3f} "
                      f"{result.p99_ms:>8.3f} {result.errors:>6}", flush=True)

    def added(name: str, concurrency: int) -> list[float]:
        """The p50 a target adds to direct's, round by round (each round measures both back to back)."""
        return [r.p50_ms - d.p50_ms for r, d in zip(runs.get((name, concurrency), []), runs[("direct", concurrency)],
                                                     strict=False)]

    def median_added(name: str, concurrency: int) -> str:
        rounds = added(name, concurrency)
        return f"{statistics.median(rounds):.3f}" if rounds else "na"

    nginx_c1 = added("nginx", 1)
    nginx_range = f"{min(nginx_c1):.3f}..{max(nginx_c1):.3f}" if nginx_c1 else "na"
    direct, gateway = results[("direct", 64)], results[("gateway", 64)]
    print(f"gateway-bench: c64_throughput_ratio={gateway.rps / direct.rps:.3f} "
          f"c64_p50_added_ms={median_added('gateway', 64)} c64_p99_added_ms={gateway.p99_ms - direct.p99_ms:.3f} "
          f"nginx_c64_p50_added_ms={median_added('nginx', 64)} c1_p50_added_ms={median_added('gateway', 1)} "
          f"nginx_c1_p50_added_ms={median_added('nginx', 1)} nginx_c1_rounds_ms={nginx_range} "
          f"py_floor_c1_p50_added_ms={median_added('py-floor', 1)}")


if __name__ == "__main__":
    main()

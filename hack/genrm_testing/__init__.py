"""Helpers to run the simulator (and its neighbours) as real processes on loopback ports.

Why one module: the unit and end-to-end tests, the local cluster and the gateway benchmark all need
free ports and to start an engine, wait for it and stop it cleanly; one implementation keeps them
consistent. A development tool: the shipped packages never import it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from genrm_testing.waiting import wait_for


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(url: str, seconds: float = 30.0, status: int = 200) -> None:
    """Poll ``url`` until it answers ``status``; a refused or failed connection is "not yet", and
    the deadline fails with the last status or error (`waiting.wait_for`).

    One poll may take until the deadline: SGLang's ``/health`` runs a generation and answers after
    a second or more, so a short per-request limit would never see it succeed.
    """
    deadline = time.monotonic() + seconds
    wait_for(f"{url} to answer {status}",
             lambda: httpx.get(url, timeout=max(1.0, deadline - time.monotonic())).status_code,
             timeout=seconds, interval=0.05, done=lambda code: code == status)


@contextmanager
def launched(args: Sequence[str], env: dict[str, str] | None = None,
             stop_seconds: float = 10.0) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args``; on exit SIGTERM it, and SIGKILL it if it outlives ``stop_seconds``."""
    proc = subprocess.Popen(list(args), env=env, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(stop_seconds)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class RunningSim:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def run_sim(*args: str, env: dict[str, str] | None = None, ready_path: str | None = "/ready",
            model: str = "judge-sim") -> Iterator[RunningSim]:
    """A ``genrm-sim`` process on a free loopback port (zero latency and a SIGTERM watchdog that
    looks every 0.1 s instead of SGLang's 5 s, unless ``args`` say otherwise), yielded once
    ``ready_path`` answers 200 (at once when None, to start neighbours meanwhile)."""
    port = free_port()
    command = [sys.executable, "-m", "genrm_sim", "--model-path", model, "--host", "127.0.0.1",
               "--port", str(port), "--enable-metrics", "--sim-ttft-ms", "0", "--sim-itl-ms", "0",
               "--sim-sigterm-poll-seconds", "0.1", *args]
    with launched(command, env=None if env is None else os.environ | env) as proc:
        sim = RunningSim(proc, port)
        if ready_path is not None:
            wait_ready(f"{sim.url}{ready_path}")
        yield sim


CONTROL_TOKEN = "test-token"
"""The control token of every gateway ``run_gateway`` starts, unless it is given another."""


@dataclass(frozen=True)
class RunningGateway:
    process: subprocess.Popen[bytes]
    port: int
    control_port: int

    @property
    def url(self) -> str:
        """The traffic port."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def control(self) -> str:
        """The control port: probes, drain API, metrics, the operator's verification probes."""
        return f"http://127.0.0.1:{self.control_port}"


@contextmanager
def run_gateway(engine_url: str, *args: str, ready: bool = True, token: str = CONTROL_TOKEN,
                ) -> Iterator[RunningGateway]:
    """A ``genrm-gateway serve`` process for ``engine_url`` on free loopback ports, with short drain
    windows, a 0.1 s engine poll and the control ``token`` (``args`` may override the rest),
    yielded once its readiness probe answers 200 (its liveness probe, when not ``ready``)."""
    port, control_port = free_port(), free_port()
    command = [sys.executable, "-m", "genrm_gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--control-port", str(control_port), "--engine-url", engine_url,
               "--quiet-seconds", "0.2", "--propagation-seconds", "0.2", "--engine-poll-seconds", "0.1", *args]
    with launched(command, env=os.environ | {"GENRM_CONTROL_TOKEN": token}) as proc:
        gateway = RunningGateway(proc, port, control_port)
        wait_ready(f"{gateway.control}/healthz/{'ready' if ready else 'live'}")
        yield gateway


@contextmanager
def run_activator(*args: str) -> Iterator[RunningGateway]:
    """A ``genrm-gateway activator`` process on free loopback ports with ``CONTROL_TOKEN`` (its handle
    is a gateway's: the same two ports), yielded once its control port answers."""
    port, control_port = free_port(), free_port()
    command = [sys.executable, "-m", "genrm_gateway", "activator", "--host", "127.0.0.1", "--port", str(port),
               "--control-port", str(control_port), *args]
    with launched(command, env=os.environ | {"GENRM_CONTROL_TOKEN": CONTROL_TOKEN}) as proc:
        running = RunningGateway(proc, port, control_port)
        wait_ready(f"{running.control}/v1/state", status=401)
        yield running

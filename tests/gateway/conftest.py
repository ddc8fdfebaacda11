"""A gateway process in front of an engine (the simulator, or a spy), on loopback ephemeral ports."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
from genrm_contract.sidecar import IDLE_REPORT_SECONDS
from genrm_testing import CONTROL_TOKEN, RunningGateway, RunningSim, run_gateway, run_sim
from genrm_testing.waiting import wait_for

TOKEN = CONTROL_TOKEN
AUTH = {"authorization": f"Bearer {TOKEN}"}


class Gateway(RunningGateway):
    """A running ``genrm-gateway serve`` process, with its state document at hand."""

    def state(self) -> dict[str, object]:
        document: dict[str, object] = httpx.get(f"{self.control}/v1/state", headers=AUTH).json()
        return document

    def wait_reported_idle(self, seconds: float = 10.0) -> None:
        """Until the state document calls the gateway idle: idleness is a significant field (scale to
        zero reads it), so a test that watches the version for another change looks after this."""
        wait_for("the gateway to report itself idle", lambda: self.state().get("idleSinceSeconds") or 0, seconds,
                 interval=0.1, done=lambda idle: idle >= IDLE_REPORT_SECONDS + 0.1)  # type: ignore[operator]

    def drain(self, drain_id: str, phase: str, **extra: object) -> httpx.Response:
        return httpx.post(f"{self.control}/v1/drain", headers=AUTH,
                          json={"drainId": drain_id, "phase": phase, **extra})

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.control}/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


@dataclass(frozen=True)
class Stack(Gateway):
    """A gateway in front of a simulator."""

    sim: RunningSim


@contextmanager
def gateway_process(engine_url: str, *gateway_args: str, wait_ready_probe: bool = True,
                    token: str = CONTROL_TOKEN) -> Iterator[Gateway]:
    """A gateway for ``engine_url`` with short drain windows and the control ``token``, once its probe
    answers."""
    with run_gateway(engine_url, *gateway_args, ready=wait_ready_probe, token=token) as running:
        yield Gateway(running.process, running.port, running.control_port)


def sent_unread(port: int, data: bytes, seconds: float = 3.0) -> socket.socket:
    """A connection that sent as much of ``data`` as the gateway took within ``seconds`` and read
    nothing, with a 4 KiB receive window (so answers back up at once); the caller closes it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent:])
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:  # the gateway closed the connection
            break
    sock.setblocking(True)
    return sock


@contextmanager
def gateway_stack(*gateway_args: str, sim_args: tuple[str, ...] = (), wait_ready_probe: bool = True,
                  token: str = CONTROL_TOKEN) -> Iterator[Stack]:
    with run_sim("--random-seed", "3", *sim_args, ready_path=None) as sim, \
            gateway_process(sim.url, *gateway_args, wait_ready_probe=wait_ready_probe, token=token) as gateway:
        yield Stack(gateway.process, gateway.port, gateway.control_port, sim)


@pytest.fixture(scope="module")
def shared() -> Iterator[Stack]:
    """A stack that tests must leave Serving."""
    with gateway_stack("--max-body-bytes", "4096") as stack:
        yield stack


@pytest.fixture
def fresh() -> Iterator[Stack]:
    """A stack of one's own, for tests that drain it."""
    with gateway_stack(sim_args=("--sim-ttft-ms", "30", "--sim-itl-ms", "2")) as stack:
        yield stack

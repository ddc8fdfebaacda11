"""Container probes (httpGet, tcpSocket, exec) with the kubelet's timing rules.

Why from the host: a kubelet probes podIP:port from outside the pod, so a container that binds
only 127.0.0.1 fails its probe exactly as in a real cluster. httpGet and tcpSocket dial the pod IP
(an address inside a namespace the agent created); exec runs inside the pod's namespace.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

#: Runs an exec probe's command in the pod (argv, timeout) and returns its exit code.
ExecRunner = Callable[[list[str], float], int]


def resolve_port(port: int | str, container: dict[str, Any]) -> int:
    """A probe port is a number or the name of one of the container's ports."""
    if isinstance(port, int) or port.isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"container {container['name']} has no port named {port!r}")


def run_probe(probe: dict[str, Any], pod_ip: str, container: dict[str, Any], run_exec: ExecRunner) -> bool:
    """Run one probe attempt; any error or timeout counts as a failure, like the kubelet."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            spec = probe["httpGet"]
            host = spec.get("host") or pod_ip
            if host != pod_ip:
                return False  # never dial addresses outside the pod network
            conn = http.client.HTTPConnection(host, resolve_port(spec["port"], container), timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
                conn.request("GET", spec.get("path", "/"), headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            with socket.create_connection((pod_ip, port), timeout=timeout):
                return True
        if "exec" in probe:
            return run_exec(list(probe["exec"]["command"]), timeout) == 0
    except (OSError, ValueError, http.client.HTTPException, subprocess.TimeoutExpired):
        return False
    return False  # grpc probes are not supported


class ProbeState:
    """Schedules one probe of one container run and tracks its result with the thresholds.

    Like the kubelet's probe worker (one goroutine per probe, on a ticker of ``periodSeconds``), each
    attempt runs on a thread of its own (`launch`), so an answer that takes up to ``timeoutSeconds``
    holds up neither the pod's other probes nor the noticing of a container that exited, and attempts
    start a period apart, start to start; an attempt that outlasts the period is followed by the next
    one as soon as it ends (the ticker's dropped ticks), never by two at once."""

    def __init__(self, probe: dict[str, Any], started_at: float, initial: bool) -> None:
        self.probe = probe
        self.period = float(probe.get("periodSeconds", 10))
        self.success_threshold = int(probe.get("successThreshold", 1))
        self.failure_threshold = int(probe.get("failureThreshold", 3))
        self.next_at = started_at + float(probe.get("initialDelaySeconds", 0))
        self.result = initial
        self._successes = 0
        self._failures = 0
        self._attempt: threading.Event | None = None
        """Set when the running attempt has ended (None: no attempt running)."""
        self._outcome = False

    @property
    def failed(self) -> bool:
        """The failure threshold was reached (for liveness and startup probes: restart)."""
        return self._failures >= self.failure_threshold

    def due(self, now: float) -> bool:
        return self._attempt is None and now >= self.next_at

    def launch(self, attempt: Callable[[], bool], now: float, done: Callable[[], None]) -> None:
        """Start one attempt on its own thread, which calls ``done`` when it ends (the pod's loop then
        takes the outcome in through `finished` at once, not at its next tick)."""
        self.next_at = now + self.period
        ended = self._attempt = threading.Event()

        def run() -> None:
            try:
                self._outcome = attempt()
            finally:
                ended.set()
                done()
        self._outcome = False
        threading.Thread(target=run, name="probe", daemon=True).start()

    def finished(self) -> bool | None:
        """The thresholded result once the running attempt has ended and been recorded, else None."""
        if self._attempt is None or not self._attempt.is_set():
            return None
        self._attempt = None
        return self.record(self._outcome)

    def record(self, ok: bool) -> bool:
        """Feed one attempt's outcome; return the (possibly changed) thresholded result."""
        if ok:
            self._successes, self._failures = self._successes + 1, 0
            if self._successes >= self.success_threshold:
                self.result = True
        else:
            self._failures, self._successes = self._failures + 1, 0
            if self._failures >= self.failure_threshold:
                self.result = False
        return self.result

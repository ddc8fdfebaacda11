"""Hollow replicas: one process answers for the sidecars and engines of many pods (as kubemark's
hollow kubelets do for nodes), so the operator can be measured against 1,000 replicas on 2 cores.

Why this shape: the operator must see what it sees in a real cluster, namely pods with real,
non-loopback pod IPs in EndpointSlices, readiness that follows the sidecar, and a sidecar per
pod IP that speaks the drain protocol of `genrm_contract.sidecar`. So:

* A hollow node (``NodeConfig(hollow=True)``) runs none of its pods' containers. The agent gives
  each hollow pod a fresh address of the pod network, all of them on the ``eth0`` of one network
  namespace (`HollowNode`, created with the first address as its own), and reports the pod
  Running with that podIP.
* One asyncio server (`serve`, started in that namespace) listens on the traffic and control
  ports on every address and dispatches by the local address a connection came in on: each pod
  IP is one `HollowReplica`, registered by the agent with the timings its pod spec gives
  (``--sim-startup-seconds`` of the engine, ``--quiet-seconds`` and ``--propagation-seconds`` of
  the gateway).
* The replica implements the contract's control API (ready, live, state, drain, undrain, a small
  ``/metrics``) with the gateway's own drain state machine (``genrm_contract.drain``): Serving ->
  SoftDrain -> Fenced -> Drained once fenced and idle for the quiet period (a fence without a soft
  drain first soft-drains for the propagation window); requests complete at once, so in-flight is 0.
  The traffic port answers ``/model_info``, ``/generate`` and ``/classify`` (and the control port
  the same under ``PROBE_PREFIX``, the operator's verification probes) with answers that depend
  only on the prompt and the sampling seed, so every replica of a pool agrees; refused with 503
  ``draining`` once fenced.
* Readiness: the agent asks the server for every replica's readiness once per probe period
  (one request for all) and reports a pod's Ready condition when it changes, so a draining
  replica goes unready as a real one does. On deletion the pod's address is removed and the
  object deleted at once (no preStop: the operator deletes only drained replicas).
* Not emulated: the bearer token is only required to be present, and there is no engine load.

Admin routes (``/hollow/...`` on the control port) register and forget replicas and report
readiness and when each replica became Drained (the benchmark's drained→delete). The benchmark's
sidecar calls are the operator's own count (``genrm_operator_sidecar_requests_total``), so real and
hollow replicas are measured alike.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import queue
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from genrm_contract.drain import DrainConflict, DrainMachine
from genrm_contract.sidecar import (
    CONTROL_PORT,
    DRAIN_PATH,
    LIVE_PATH,
    MAX_WAIT_SECONDS,
    METRICS_PATH,
    PROBE_PREFIX,
    PROPAGATION_SECONDS,
    QUIET_SECONDS,
    READY_PATH,
    REASON_HEADER,
    STATE_PATH,
    TRAFFIC_PORT,
    UNDRAIN_PATH,
    VERSION_PARAM,
    WAIT_PARAM,
    DrainRequest,
    DrainState,
    EngineReport,
    RefusalReason,
    Series,
    StateDocument,
    UndrainRequest,
    Versions,
    answers_ready,
    retry_headers,
)
from pydantic import ValidationError

from genrm_cluster.kubeapi import JSON
from genrm_cluster.netns import PodNetns, PodNetwork, ip
from genrm_cluster.podrunner import PodConditions, StatusSink, now_rfc3339

log = logging.getLogger("genrm_cluster.hollow")

ADMIN = "/hollow"
READY_POLL_SECONDS = 1.0
"""The gateway container's readiness probe period (core/children.py)."""
WORKERS = 4
"""Threads carrying out hollow pods' work (address, registration, status); a pod always uses the same one."""

# --- the server: many replicas in one process ---------------------------------------------------


@dataclass
class HollowReplica:
    """One pod's sidecar and engine. Times are ``time.monotonic()``; ``drained_at`` is wall time."""

    startup: float = 0.0
    quiet: float = QUIET_SECONDS
    propagation: float = PROPAGATION_SECONDS
    generation: bool = True
    registered: float = field(default_factory=time.monotonic)
    machine: DrainMachine = field(init=False)
    """The contract's drain state machine, the one the gateway runs."""
    idle_since: float = field(default_factory=time.monotonic)
    """Requests complete at once and the engine has no load: idle since registration."""
    drained_at: float | None = None
    admitted: int = 0
    refused: int = 0
    versions: Versions = field(default_factory=Versions)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set (and replaced) by every drain call, so waiting state polls look again at once."""

    def __post_init__(self) -> None:
        self.machine = DrainMachine(quiet_seconds=self.quiet, propagation_seconds=self.propagation)

    @property
    def drain_id(self) -> str | None:
        return self.machine.drain_id

    def touch(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def next_change(self, now: float) -> float:
        """When the state changes with time alone: the engine comes up, a deferred fence, Drained."""
        if not self.engine_up(now):
            return self.registered + self.startup
        due = self.machine.next_change(self.idle_since)
        return now + MAX_WAIT_SECONDS if due is None else due

    def engine_up(self, now: float) -> bool:
        return now >= self.registered + self.startup

    def _become(self, machine: DrainMachine, now: float) -> None:
        if machine.state is DrainState.DRAINED and self.machine.state is not DrainState.DRAINED:
            fenced = machine.fenced_at if machine.fenced_at is not None else now
            self.drained_at = time.time() - (now - max(fenced, self.idle_since + machine.quiet_seconds))
        self.machine = machine

    def current(self, now: float) -> DrainState:
        """The gateway's DrainController.state: a deferred fence comes due, a quiet fence is Drained."""
        self._become(self.machine.at(now, self.idle_since), now)
        return self.machine.state

    def drain(self, request: DrainRequest, now: float) -> bool:
        """False: another drain is in progress (409)."""
        try:
            self._become(self.machine.drain(request.drain_id, request.phase, request.quiet_seconds, now,
                                            self.idle_since, request.reason, request.active_revision), now)
        except DrainConflict:
            return False
        self.touch()
        return True

    def undrain(self, request: UndrainRequest, now: float) -> bool:
        before = self.machine.state
        try:
            self._become(self.machine.undrain(request.drain_id, now, self.idle_since), now)
        except DrainConflict:
            return False
        if self.machine.state is not before:
            self.touch()
        return True

    def document(self, now: float) -> dict[str, Any]:
        return self.stamped(now).wire()

    def stamped(self, now: float) -> StateDocument:
        up = self.engine_up(now)
        return self.versions.stamp(StateDocument(
            state=self.current(now), drain_id=self.drain_id, inflight=0, admitted_total=self.admitted,
            completed_total=self.admitted, refused_total=self.refused,
            engine=EngineReport(up=up, healthy=up, running_requests=0 if up else None,
                                queued_requests=0 if up else None, token_usage=0.0 if up else None),
            idle_since_seconds=round(now - self.idle_since, 3), drain_reason=self.machine.reason,
        ))

    async def wait(self, version: int, seconds: float) -> dict[str, Any]:
        """The long poll of the contract: answered once the version is not ``version``, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            document = self.stamped(now)
            if document.version != version or now >= deadline:
                return document.wire()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.0, min(deadline, self.next_change(now)) - now))
            except TimeoutError:
                pass

    def ready(self, now: float) -> bool:
        return self.engine_up(now) and answers_ready(self.current(now), self.drain_id)


Reply = tuple[int, bytes, dict[str, str]]


def _json(code: int, doc: Any, headers: dict[str, str] | None = None) -> Reply:
    return code, json.dumps(doc).encode(), headers or {}


def _refuse(code: int, reason: RefusalReason, message: str) -> Reply:
    """The gateway's refusal: its error shape, its reason and its retry marker (`retry_headers`)."""
    return _json(code, {"error": {"code": code, "reason": reason, "message": message}},
                 {REASON_HEADER: reason, **dict(retry_headers(reason))})


def long_poll(query: dict[str, list[str]]) -> tuple[int, float] | None:
    """The (version, seconds) of a state long poll, or None when either is malformed or out of range:
    the gateway's bounds (`genrm_gateway.control`), so the operator meets the same answers here."""
    try:
        version, seconds = int(query[VERSION_PARAM][0]), float(query.get(WAIT_PARAM, ["0"])[0])
    except (KeyError, ValueError):
        return None
    return (version, seconds) if version >= 0 and 0 <= seconds <= MAX_WAIT_SECONDS else None


def answer_text(prompt: str, seed: object) -> str:
    """The same for every replica given the prompt and the sampling seed (verification compares them)."""
    return "hollow-" + hashlib.sha256(f"{seed}|{prompt}".encode()).hexdigest()[:24]


class HollowServer:
    """Replicas by pod IP, and the ASGI app that answers for all of them."""

    def __init__(self, traffic_port: int = TRAFFIC_PORT, control_port: int = CONTROL_PORT) -> None:
        self.traffic_port, self.control_port = traffic_port, control_port
        self.replicas: dict[str, HollowReplica] = {}
        self.forgotten: set[str] = set()
        self.drained_at: dict[str, float] = {}
        """Wall time each replica (by address) became Drained, kept after it is forgotten."""

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        local, port = scope["server"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode())
        replica = self.replicas.get(local)
        if (replica is not None and port == self.control_port and scope["path"] == STATE_PATH
                and VERSION_PARAM in query and headers.get("authorization", "").startswith("Bearer ")):
            if (poll := long_poll(query)) is None:
                code, payload, extra = _refuse(400, RefusalReason.BAD_REQUEST,
                                               f"{VERSION_PARAM} must be an integer >= 0 and "
                                               f"{WAIT_PARAM} a number of seconds from 0 to {MAX_WAIT_SECONDS}")
            else:
                code, payload, extra = _json(200, await replica.wait(*poll))
        else:
            code, payload, extra = self.handle(local, port, scope["method"], scope["path"], headers, body)
        out = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in extra.items())]
        await send({"type": "http.response.start", "status": code, "headers": out})
        await send({"type": "http.response.body", "body": payload})

    def handle(self, local: str, port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        if path.startswith(ADMIN + "/"):
            return self.admin(method, path[len(ADMIN):], body)
        replica = self.replicas.get(local)
        if replica is None:
            return _refuse(503, RefusalReason.ENGINE_DOWN, f"no hollow replica at {local}")
        now = time.monotonic()
        if port == self.control_port:
            return self.control(replica, method, path, headers, body, now)
        return self.traffic(replica, method, path, body, now)

    def control(self, replica: HollowReplica, method: str, path: str, headers: dict[str, str], body: bytes,
                now: float) -> Reply:
        if path == LIVE_PATH:
            return _json(200, {"status": "live"})
        if path == READY_PATH:
            if replica.ready(now):
                return _json(200, {"ready": True})
            return _refuse(503, RefusalReason.ENGINE_DOWN if not replica.engine_up(now) else RefusalReason.DRAINING,
                           "not ready")
        if path == METRICS_PATH:
            state = replica.current(now)
            lines = [f"{Series.INFLIGHT} 0", f"{Series.ENGINE_UP} {int(replica.engine_up(now))}",
                     f"{Series.ENGINE_RUNNING} 0", f"{Series.ENGINE_QUEUED} 0", f"{Series.ENGINE_KV_CACHE} 0",
                     *(f'{Series.DRAIN_STATE}{{state="{s.value}"}} {int(s is state)}' for s in DrainState)]
            return 200, ("\n".join(lines) + "\n").encode(), {"content-type": "text/plain; version=0.0.4"}
        probe = path.startswith(PROBE_PREFIX + "/")
        if not probe and path not in (STATE_PATH, DRAIN_PATH, UNDRAIN_PATH):
            return _refuse(404, RefusalReason.NOT_FOUND, "not found")
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _refuse(401, RefusalReason.UNAUTHENTICATED, "a bearer token is required")
        if probe:
            return self.traffic(replica, method, path[len(PROBE_PREFIX):], body, now)
        if path == STATE_PATH and method == "GET":
            return _json(200, replica.document(now))
        if method != "POST":
            return _refuse(405, RefusalReason.METHOD_NOT_ALLOWED, "method not allowed")
        try:
            if path == DRAIN_PATH:
                ok = replica.drain(DrainRequest.model_validate_json(body), now)
            else:
                ok = replica.undrain(UndrainRequest.model_validate_json(body), now)
        except ValidationError as exc:
            return _refuse(400, RefusalReason.BAD_REQUEST, str(exc.errors()[:1]))
        if not ok:
            return _refuse(409, RefusalReason.DRAIN_CONFLICT, f"drain in progress has drain id {replica.drain_id!r}")
        return _json(200, replica.document(now))

    def traffic(self, replica: HollowReplica, method: str, path: str, body: bytes, now: float) -> Reply:
        if not replica.engine_up(now):
            return _refuse(503, RefusalReason.ENGINE_UNAVAILABLE, "engine starting")
        if path == "/model_info" and method == "GET":
            return _json(200, {"model_path": "hollow", "is_generation": replica.generation})
        if path == "/v1/models" and method == "GET":
            return _json(200, {"object": "list", "data": [{"id": "hollow", "object": "model"}]})
        if path not in ("/generate", "/classify") or method != "POST":
            return _refuse(404, RefusalReason.NOT_FOUND, "not found")
        if replica.current(now) in (DrainState.FENCED, DrainState.DRAINED):
            replica.refused += 1
            return _refuse(503, RefusalReason.DRAINING, "the replica is draining")
        try:
            doc = json.loads(body)
        except ValueError:
            return _refuse(400, RefusalReason.INVALID_JSON, "invalid JSON")
        replica.admitted += 1
        replica.idle_since = now
        prompt = str(doc.get("text", ""))
        if path == "/classify":
            score = int(hashlib.sha256(prompt.encode()).hexdigest()[:6], 16) / 0xFFFFFF
            return _json(200, {"embedding": [score], "meta_info": {"id": "hollow", "finish_reason": None}})
        text = answer_text(prompt, (doc.get("sampling_params") or {}).get("sampling_seed"))
        return _json(200, {"text": text, "meta_info": {"id": "hollow", "finish_reason": {"type": "stop"},
                                                       "prompt_tokens": len(prompt.split()), "completion_tokens": 8}})

    def admin(self, method: str, path: str, body: bytes) -> Reply:
        now = time.monotonic()
        if path == "/replicas" and method == "POST":
            doc = json.loads(body)
            self.forgotten.discard(doc["ip"])
            self.replicas[doc["ip"]] = HollowReplica(
                startup=float(doc.get("startupSeconds", 0)), quiet=float(doc.get("quietSeconds", QUIET_SECONDS)),
                propagation=float(doc.get("propagationSeconds", PROPAGATION_SECONDS)),
                generation=bool(doc.get("generation", True)))
            return _json(200, {})
        if path == "/forget" and method == "POST":
            address = json.loads(body)["ip"]
            gone = self.replicas.pop(address, None)
            if gone is not None and gone.current(now) is DrainState.DRAINED and gone.drained_at is not None:
                self.drained_at[address] = gone.drained_at
            self.forgotten.add(address)
            return _json(200, {})
        if path == "/ready":
            return _json(200, {a: r.ready(now) for a, r in self.replicas.items()})
        if path == "/stats":
            drained = {**self.drained_at, **{a: r.drained_at for a, r in self.replicas.items()
                                             if r.current(now) is DrainState.DRAINED}}
            return _json(200, {"replicas": len(self.replicas), "drainedAt": drained})
        return _refuse(404, RefusalReason.NOT_FOUND, "no such admin route")


def serve(traffic_port: int, control_port: int) -> None:
    """Run the hollow server on every address of the current network namespace until killed."""
    import uvicorn

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sockets = []
    for port in (traffic_port, control_port):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(4096)
        sockets.append(sock)
    config = uvicorn.Config(HollowServer(traffic_port, control_port), http="httptools", lifespan="off",
                            access_log=False, log_level="warning", timeout_keep_alive=75, backlog=4096)
    asyncio.run(uvicorn.Server(config).serve(sockets=sockets))


# --- the node side: addresses, registration, pod status -----------------------------------------


def _arg(args: list[str], flag: str, default: str) -> str:
    """The value after ``flag`` (or of ``flag=value``) in a container's args."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def replica_timings(pod: JSON) -> dict[str, Any]:
    """What the hollow replica takes from the pod spec: the engine's start-up, the gateway's drain timings."""
    args: list[str] = []
    for c in pod["spec"]["containers"]:
        args += [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    return {"startupSeconds": float(_arg(args, "--sim-startup-seconds", "1")),
            "quietSeconds": float(_arg(args, "--quiet-seconds", str(QUIET_SECONDS))),
            "propagationSeconds": float(_arg(args, "--propagation-seconds", str(PROPAGATION_SECONDS))),
            "generation": "--sim-classifier" not in args}


class HollowPod:
    """The agent's runner for one hollow pod (the interface NodeAgent uses of a PodRunner)."""

    def __init__(self, node: HollowNode, pod: JSON, on_status: StatusSink) -> None:
        self.node, self.pod, self.on_status = node, pod, on_status
        self.address: str | None = None
        self.ready = False
        self.deleting = False
        self.finished = threading.Event()
        self.started_at = now_rfc3339()
        self._condition = PodConditions()
        self._worker = node.worker_for(pod["metadata"]["uid"])

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def log_paths(self) -> dict[str, Path]:
        return {}

    def start(self) -> None:
        self._worker.put(self._start)

    def terminate(self, grace_seconds: float) -> None:
        self._worker.put(self._stop)

    def kill(self) -> None:
        if self.node.stopping:
            self.finished.set()  # the whole namespace goes with the node
        else:
            self._worker.put(self._stop)

    def set_ready(self, ready: bool) -> None:
        if ready != self.ready and self.address is not None and not self.finished.is_set():
            self.ready = ready
            self._worker.put(self._report)

    def _start(self) -> None:
        if self.finished.is_set():
            return
        self.address = self.node.add_replica(self.pod)
        self.node.track(self)
        self._report()

    def _stop(self) -> None:
        if self.finished.is_set():
            return
        if self.address is not None:
            self.node.remove_replica(self.address)
        self.ready = False
        self.finished.set()

    def _report(self) -> None:
        for _ in range(5):
            if self.finished.is_set() or self.on_status(self.pod, self.status()):
                return
            time.sleep(0.5)

    def status(self) -> JSON:
        host = self.node.network.host_ip
        ready = self.ready
        containers = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "restartCount": 0,
                       "ready": ready or not c.get("readinessProbe"), "started": True,
                       "state": {"running": {"startedAt": self.started_at}},
                       "containerID": f"hollow://{self.pod['metadata']['uid'][:8]}-{c['name']}"}
                      for c in self.pod["spec"]["containers"]]
        return {
            "phase": "Running", "hostIP": host, "hostIPs": [{"ip": host}], "startTime": self.started_at,
            "podIP": self.address, "podIPs": [{"ip": self.address}],
            "conditions": [self._condition("PodReadyToStartContainers", True),
                           self._condition("Initialized", True),
                           self._condition("ContainersReady", ready), self._condition("Ready", ready)],
            "containerStatuses": containers,
        }


class HollowNode:
    """The namespace holding every hollow pod's address, the server in it, and the readiness loop."""

    def __init__(self, network: PodNetwork, workdir: Path) -> None:
        self.network = network
        self.workdir = workdir
        self.netns: PodNetns | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pods: dict[str, HollowPod] = {}  # by address
        self.stopping = False
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Callable[[], None]]] = [queue.Queue() for _ in range(WORKERS)]
        self._http = httpx.Client(timeout=5.0)

    @property
    def admin_url(self) -> str:
        assert self.netns is not None
        return f"http://{self.netns.ip}:{CONTROL_PORT}{ADMIN}"

    def start(self) -> None:
        self.netns = self.network.add_pod()
        log_path = self.workdir / "hollow.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen([*self.netns.exec_prefix(), sys.executable, "-m", "genrm_cluster.hollow",
                                          "--port", str(TRAFFIC_PORT), "--control-port", str(CONTROL_PORT)],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._http.get(f"{self.admin_url}/stats").raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"hollow server did not start; see {log_path}") from None
                time.sleep(0.1)
        for q in self._queues:
            threading.Thread(target=self._work, args=(q,), name="hollow-worker", daemon=True).start()
        threading.Thread(target=self._readiness_loop, name="hollow-ready", daemon=True).start()
        log.info("hollow node: server pid %d in %s at %s", self.proc.pid, self.netns.name, self.netns.ip)

    def stop(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._http.close()

    def stats(self) -> JSON:
        result: JSON = self._http.get(f"{self.admin_url}/stats").json()
        return result

    def worker_for(self, uid: str) -> queue.Queue[Callable[[], None]]:
        return self._queues[int(hashlib.sha1(uid.encode()).hexdigest()[:8], 16) % WORKERS]

    def runner(self, pod: JSON, on_status: StatusSink) -> HollowPod:
        return HollowPod(self, pod, on_status)

    def add_replica(self, pod: JSON) -> str:
        assert self.netns is not None
        address = self.network.next_address()
        ip("-n", self.netns.name, "addr", "add", f"{address}/32", "dev", "eth0")
        # Reached through the node's own address rather than on the bridge: every address on the
        # bridge takes an entry of the kernel's neighbour table, which all namespaces share (1,024 by
        # default), and past it the newest pods were silently unreachable (the kernel logs "neighbor
        # table overflow"). A route per pod costs no neighbour entry; the router's is for Services.
        for netns, dev in self._route_places():
            ip(*netns, "route", "replace", f"{address}/32", "via", self.netns.ip, "dev", dev)
        self._http.post(f"{self.admin_url}/replicas", json={"ip": address, **replica_timings(pod)}).raise_for_status()
        return address

    def track(self, pod: HollowPod) -> None:
        """Follow the pod's readiness from now on."""
        if pod.address is not None:
            with self._lock:
                self.pods[pod.address] = pod

    def remove_replica(self, address: str) -> None:
        assert self.netns is not None
        with self._lock:
            self.pods.pop(address, None)
        try:
            self._http.post(f"{self.admin_url}/forget", json={"ip": address})
        except httpx.HTTPError as err:
            log.info("hollow: forget %s: %s", address, err)
        ip("-n", self.netns.name, "addr", "del", f"{address}/32", "dev", "eth0", check=False)
        for netns, _dev in self._route_places():
            ip(*netns, "route", "del", f"{address}/32", check=False)

    def _route_places(self) -> list[tuple[tuple[str, ...], str]]:
        """Where a hollow pod's address is routed: the host (via the bridge) and the router namespace of
        Services (via its eth0)."""
        router = self.network.router
        assert router is not None
        return [((), self.network.bridge), (("-n", router.name), "eth0")]

    def _work(self, q: queue.Queue[Callable[[], None]]) -> None:
        while not self.stopping:
            task = q.get()
            try:
                task()
            except Exception:
                log.exception("hollow: task failed")

    def _readiness_loop(self) -> None:
        while not self.stopping:
            time.sleep(READY_POLL_SECONDS)
            try:
                ready: dict[str, bool] = self._http.get(f"{self.admin_url}/ready").json()
            except (httpx.HTTPError, ValueError, RuntimeError) as err:  # RuntimeError: closed at stop
                if not self.stopping:
                    log.info("hollow: readiness poll failed: %s", err)
                continue
            with self._lock:
                pods = list(self.pods.items())
            for address, pod in pods:
                pod.set_ready(ready.get(address, False))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="genrm_cluster.hollow", description="hollow replica server")
    parser.add_argument("--port", type=int, default=TRAFFIC_PORT)
    parser.add_argument("--control-port", type=int, default=CONTROL_PORT)
    args = parser.parse_args(argv)
    serve(args.port, args.control_port)


if __name__ == "__main__":
    main()

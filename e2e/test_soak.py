"""Soak: random scaling, operator SIGKILLs and engine crashes under unmodified-client load.

For `GENRM_SOAK_SECONDS` (180 in `make test`, 480 in `make soak`) the unmodified clients of
`plainclients.py` send through the pool's Service ClusterIP while, all seeded by
`GENRM_SOAK_SEED` (printed, so a run can be repeated):

* `kubectl scale` sets a random target in 1..5 every 2-6 s;
* a change of the engine's environment rolls every replica out every 20-40 s (a Rollout, or the
  work of one that a scale supersedes);
* the operator is SIGKILLed at least 20 times at random moments and restarted after 0-3 s;
* a few engines of serving replicas are SIGKILLed while another replica serves (the container
  restarts, the operator replaces the replica; the sole replica's crash is an outage that no
  pool can hide, so a crash waits until two replicas serve).

Every second a monitor checks the invariants:

* pods holding GPUs (every pod of the pool, Terminating ones included, failed ones excepted)
  stay within the bound of `core/reconcile.py`: at most the largest target of the last
  `TARGET_WINDOW_SECONDS` (the operator acts on what it saw a moment ago) or the previous count,
  plus the rollout's surge (`maxSurge`, 1) while its work is left (a Rollout runs, replicas of two
  revisions are left) or one was asked for in that window;
* every published pod passed verification, and is ready (unready for at most
  `UNREADY_GRACE_SECONDS`: an engine crash makes it unready before the operator unpublishes it);
* every pod is controlled by the pool;
* no pod that ever served is deleted while its sidecar reported requests in flight (the last
  report before the deletion is seen; the drain quiet period outlasts a sampling interval).

A request that reaches a crashed replica waits up to `ENGINE_WAIT_SECONDS` for the restarted
engine (the gateway's engine wait). A watch on the pool Service's EndpointSlices records every
moment it has no ready endpoint (start, end). Every failed request is attributed, by its span
(sent, ended) and its answer:

* in flight at an engine crash: sent before the kill and ended at or after it with the gateway's
  `502 engineDisconnected` (the engine closed the connection under the request, so it was running
  inside the engine when it died; only the crashed replica's gateway answers that). Allowed, as
  long as per crash they do not exceed the requests that can have been in flight on that replica
  at the kill (admitted by a read of the sidecar's counters just after it, less those completed by
  a read just before it: a single reading before the kill undercounts requests admitted in
  between) and the `openai` clients (default retries) lose none;
* during an empty-Service moment (its span meets one);
* other.

Any loss not in flight at an engine crash fails the soak. Finally the pool must converge to the
last target. The closing `soak-summary:` line gives the figures, the empty-Service moments (count
and seconds) and the attribution counts.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from genrm_operator.core.names import (
    EVER_PUBLISHED_ANNOTATION,
    PUBLISHED_LABEL,
    TOKEN_KEY,
    VERIFICATION_ANNOTATION,
    secret_name,
)

from .emptyservice import EmptyServiceWatch, Moment
from .harness import SOAK, Cluster, OperatorProcess, SoakFigures, pool_manifest, wait_for
from .plainclients import Failure

POOL = "soak"
TARGETS = (1, 5)
SCALE_EVERY = (2.0, 6.0)
ROLL_EVERY = (20.0, 40.0)
MAX_SURGE = 1
"""spec.rollout.maxSurge's default, which the soak pool keeps: pods a rollout may add above the target."""
RESTART_AFTER = (0.0, 3.0)
MIN_OPERATOR_KILLS = 20
TARGET_WINDOW_SECONDS = 10.0
UNREADY_GRACE_SECONDS = 10.0
ENGINE_WAIT_SECONDS = 12.0
"""How long a request that reaches a crashed replica with no peer to take it (the pool at one
replica, or every peer refusing) waits for its engine (`engineWaitSeconds`; by default it is
refused at once). The soak's pool goes down to one replica, and a lone replica's clients lose
nothing when their requests wait for the engine's restart instead of getting a 503. The simulator's
container answers again a few seconds after the kill, longer on the saturated 2-core CI machine
(the local kubelet's 1 s back-off, the process start, the 1 s start-up the pool asks for, with its
port closed until then as SGLang's is)."""
CONVERGE_TIMEOUT = 240.0
OPENAI_KINDS = ("openai", "openai-async")
ENGINE_DIED = "HTTP 502 (engineDisconnected)"
"""How the plain clients record a request that was running inside an engine when it died."""
CONTROL_PORT = 8001
"""spec.gateway.controlPort's default, which the soak pool keeps."""
TRAFFIC_PORT = 8000
"""spec.gateway.port's default, likewise."""

Pod = dict[str, Any]


@dataclass
class Crash:
    """One engine SIGKILL and what the sidecar held at that moment."""

    at: float
    """time.monotonic() just before the kill."""
    done: float
    """time.monotonic() once the engine is seen dead: SIGKILL is delivered when the process next runs, so
    a request may still enter the engine after the kill call returns, and dies with it."""
    pod: str
    address: str
    """The replica's traffic address (``ip:port``), to match failures that name their replica."""
    inflight: int
    """In flight as the sidecar reported just before the kill."""
    held: int
    """At most in flight at the kill: admitted by just after it, less completed by just before it."""
    serving: int
    """Published replicas at the time, the crashed one included."""


@dataclass
class Monitor:
    """The once-a-second invariant checks (see the module docstring)."""

    cluster: Cluster
    namespace: str
    token: str
    pool_uid: str
    targets: deque[tuple[float, int]] = field(default_factory=deque)
    violations: list[str] = field(default_factory=list)
    last_count: int = 0
    unready_since: dict[str, float] = field(default_factory=dict)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Last sidecar report (/v1/state) per pod UID."""
    judged_deletions: set[str] = field(default_factory=set)
    rolled: list[float] = field(default_factory=list)
    """When the soak changed the pod template (each a rollout)."""

    def target_set(self, target: int) -> None:
        self.targets.append((time.monotonic(), target))

    def surge(self, now: float) -> int:
        """The rollout's surge while its work is left: a Rollout runs, replicas of two revisions are
        left (a scale that superseded a rollout carries its surge replica on), or one was asked for
        in the window."""
        status = self.cluster.pool(self.namespace, POOL).get("status") or {}
        mixed = status.get("currentRevision") != status.get("updateRevision")
        asked = any(now - at < TARGET_WINDOW_SECONDS for at in self.rolled)
        return MAX_SURGE if asked or mixed or (status.get("operation") or {}).get("type") == "Rollout" else 0

    def bound(self, now: float) -> int:
        while len(self.targets) > 1 and self.targets[1][0] < now - TARGET_WINDOW_SECONDS:
            self.targets.popleft()
        return max(t for _, t in self.targets)

    def check(self, http: httpx.Client) -> None:
        now = time.monotonic()
        pods = self.cluster.pods(self.namespace, POOL)
        holders = [p for p in pods if not failed(p)]
        allowed = max(self.bound(now), self.last_count)
        # The pool is read only when the count goes past the bound without a surge.
        if len(holders) > allowed and len(holders) > allowed + (surge := self.surge(now)):
            self.violate(f"{len(holders)} pods hold GPUs > max(target {self.bound(now)} of the last "
                         f"{TARGET_WINDOW_SECONDS:g}s, previous count {self.last_count}) + surge {surge}: "
                         f"{names(holders)}")
        self.last_count = len(holders)
        for pod in pods:
            self.check_pod(pod, now, http)

    def check_pod(self, pod: Pod, now: float, http: httpx.Client) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), {})
        if (owner.get("kind"), owner.get("uid")) != ("GenRMPool", self.pool_uid):
            self.violate(f"{name} is not controlled by the pool: {owner}")
        annotations = meta.get("annotations") or {}
        if meta.get("labels", {}).get(PUBLISHED_LABEL) == "true":
            if annotations.get(VERIFICATION_ANNOTATION) != "passed":
                self.violate(f"{name} is published with verification {annotations.get(VERIFICATION_ANNOTATION)!r}")
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in pod.get("status", {}).get("conditions") or [])
            since = self.unready_since.setdefault(uid, now) if not ready else self.unready_since.pop(uid, now)
            if not ready and now - since > UNREADY_GRACE_SECONDS:
                self.violate(f"{name} published but unready for {now - since:.0f}s")
        if meta.get("deletionTimestamp"):
            if uid not in self.judged_deletions:
                self.judged_deletions.add(uid)
                last = self.reports.get(uid)
                served = annotations.get(EVER_PUBLISHED_ANNOTATION) == "true"
                if served and not failed(pod) and last is not None and last.get("inflight", 0) > 0:
                    self.violate(f"{name} deleted while its sidecar last reported {last}")
            return
        report = self.sidecar_state(pod, http)
        if report is not None:
            self.reports[uid] = report

    def sidecar_state(self, pod: Pod, http: httpx.Client) -> dict[str, Any] | None:
        """The sidecar's own report (GET /v1/state on the control port); None when unreachable."""
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            return None
        try:
            response = http.get(f"http://{ip}:{CONTROL_PORT}/v1/state",
                                headers={"Authorization": f"Bearer {self.token}"})
        except httpx.HTTPError:
            return None
        return dict(response.json()) if response.status_code == 200 else None

    def violate(self, message: str) -> None:
        print(f"soak violation: {message}", flush=True)
        self.violations.append(message)


def failed(pod: Pod) -> bool:
    """Crashed or failed: excepted from the pod-count bound, replaced by the operator."""
    status = pod.get("status") or {}
    return status.get("phase") in ("Failed", "Succeeded") or any(
        c.get("restartCount", 0) > 0 for c in status.get("containerStatuses") or [])


def names(pods: list[Pod]) -> list[str]:
    return [p["metadata"]["name"] + ("(terminating)" if p["metadata"].get("deletionTimestamp") else "")
            for p in pods]


def published(pods: list[Pod]) -> list[Pod]:
    return [p for p in pods if p["metadata"].get("labels", {}).get(PUBLISHED_LABEL) == "true"
            and not p["metadata"].get("deletionTimestamp")]


def engine_pid(pod: Pod) -> int | None:
    for c in pod.get("status", {}).get("containerStatuses") or []:
        if c["name"] == "engine" and c.get("containerID", "").startswith("genrm://") and "running" in c["state"]:
            return int(c["containerID"].removeprefix("genrm://"))
    return None


@dataclass
class Attribution:
    """Every failed request, by cause (see the module docstring)."""

    in_flight: dict[int, list[Failure]]
    """Per crash (index into the crashes), the requests in flight on its replica that its kill ended."""
    empty_service: list[Failure]
    other: list[Failure]

    @property
    def in_flight_count(self) -> int:
        return sum(len(lost) for lost in self.in_flight.values())


def in_flight_at(failure: Failure, crash: Crash) -> bool:
    """Sent before the kill, ended at or after it, by the engine's death, on that crash's replica
    (when the failure names its replica)."""
    return (failure.started <= crash.done and failure.at >= crash.at and failure.text.startswith(ENGINE_DIED)
            and failure.replica in (None, crash.address))


def attribute(failures: list[Failure], crashes: list[Crash], moments: list[Moment]) -> Attribution:
    """In flight at a crash (the latest one it meets) first, then an empty-Service moment, else other."""
    result = Attribution({i: [] for i in range(len(crashes))}, [], [])
    for f in failures:
        owners = [i for i, c in enumerate(crashes) if in_flight_at(f, c)]
        if owners:
            result.in_flight[owners[-1]].append(f)
        elif any(m.overlaps(f.started, f.at) for m in moments):
            result.empty_service.append(f)
        else:
            result.other.append(f)
    return result


def test_soak_random_scaling_operator_kills_and_engine_crashes_lose_nothing(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    seconds = float(os.environ.get("GENRM_SOAK_SECONDS") or 180)
    seed = int(os.environ.get("GENRM_SOAK_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nsoak: seed={seed} seconds={seconds:g} (GENRM_SOAK_SEED={seed} repeats this run)", flush=True)
    rng = random.Random(seed)
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        POOL, namespace, replicas=2, drain={"propagationSeconds": 2, "quietSeconds": 2, "timeoutSeconds": 60},
        gateway={"limits": {"engineWaitSeconds": ENGINE_WAIT_SECONDS}}))
    cluster.wait_serving(namespace, POOL, 2)
    pool = cluster.pool(namespace, POOL)
    secret = json.loads(cluster.kubectl("get", "secret", secret_name(POOL), "-n", namespace, "-o", "json"))
    token = base64.b64decode(secret["data"][TOKEN_KEY]).decode()
    monitor = Monitor(cluster, namespace, token, pool["metadata"]["uid"])
    monitor.target_set(2)

    kill_count = max(MIN_OPERATOR_KILLS, int(seconds / 12))
    kill_at = sorted(rng.uniform(5, seconds - 10) for _ in range(kill_count))
    crash_at = sorted(rng.uniform(20, seconds - 20) for _ in range(max(3, int(seconds / 60))))
    crashes: list[Crash] = []
    scale_changes, target, rollouts = 0, 2, 0
    stop = threading.Event()

    def monitor_loop() -> None:
        with httpx.Client(timeout=1.0) as http:
            while not stop.wait(1.0):
                try:
                    monitor.check(http)
                except AssertionError as exc:  # kubectl hiccup: the next second checks again
                    print(f"soak monitor: {exc}", flush=True)

    with EmptyServiceWatch(cluster.api, namespace, POOL) as service, \
            cluster.plain_clients(namespace, POOL) as plain:
        checker = threading.Thread(target=monitor_loop, name="soak-monitor", daemon=True)
        checker.start()
        start = time.monotonic()
        next_scale = start + rng.uniform(*SCALE_EVERY)
        next_roll = start + rng.uniform(*ROLL_EVERY)
        while (now := time.monotonic()) < start + seconds:
            elapsed = now - start
            if kill_at and elapsed >= kill_at[0]:
                kill_at.pop(0)
                operator.kill()
                stop.wait(rng.uniform(*RESTART_AFTER))
                operator.start()
            if crash_at and elapsed >= crash_at[0]:
                crash = _crash_an_engine(cluster, namespace, monitor, rng)
                if crash is not None:
                    crash_at.pop(0)
                    crashes.append(crash)
                else:
                    crash_at[0] = elapsed + 2.0  # until two replicas serve
            if now >= next_scale:
                target = rng.randint(*TARGETS)
                monitor.target_set(target)
                cluster.scale(namespace, POOL, target)
                scale_changes += 1
                next_scale = now + rng.uniform(*SCALE_EVERY)
            if now >= next_roll:
                rollouts += 1
                monitor.rolled.append(now)
                cluster.kubectl("patch", "genrmpool", POOL, "-n", namespace, "--type", "merge", "-p", json.dumps(
                    {"spec": {"engine": {"env": [{"name": "SOAK_ROLLOUT", "value": str(rollouts)}]}}}))
                next_roll = now + rng.uniform(*ROLL_EVERY)
            time.sleep(0.1)
        if operator.proc is None or operator.proc.poll() is not None:
            operator.start()
        converge_start = time.monotonic()
        cluster.wait_serving(namespace, POOL, target, timeout=CONVERGE_TIMEOUT)
        converge_s = time.monotonic() - converge_start
        stop.set()
        checker.join(5)

    until = time.monotonic()
    moments = service.moments()
    for moment in moments:
        print(f"soak: the Service had no ready endpoint from +{moment.start - start:.1f}s for "
              f"{moment.seconds(until):.1f}s", flush=True)
    lost = attribute(plain.stats.failures, crashes, moments)
    excess: list[str] = []
    for i, crash in enumerate(crashes):
        ended = lost.in_flight[i]
        openai_lost = [f for f in ended if f.kind in OPENAI_KINDS]
        print(f"soak: engine crash {crash.pod} at +{crash.at - start:.1f}s in_flight={crash.inflight} "
              f"held<={crash.held} serving={crash.serving} failed={len(ended)} openai_failed={len(openai_lost)}",
              flush=True)
        if len(ended) > crash.held or openai_lost:
            excess += [f"crash of {crash.pod} (in flight {crash.inflight}, at most {crash.held} at the kill, "
                       f"{crash.serving} serving): {f}"
                       for f in ended]
    SOAK.figures = SoakFigures(
        seed=seed,
        requests=plain.stats.total_sent, failed=plain.stats.failed, scale_changes=scale_changes, rollouts=rollouts,
        operator_kills=kill_count, engine_kills=len(crashes), violations=len(monitor.violations),
        converge_s=converge_s, empty_service_moments=len(moments),
        empty_service_s=sum(m.seconds(until) for m in moments), lost_in_flight_at_crash=lost.in_flight_count,
        lost_empty_service=len(lost.empty_service), lost_other=len(lost.other))
    print(SOAK.figures.line(), flush=True)
    assert not monitor.violations, "\n".join(monitor.violations)
    unattributed = [f"+{f.started - start:.1f}s..+{f.at - start:.1f}s {cause}: {f}"
                    for cause, failures in (("empty Service", lost.empty_service), ("other", lost.other))
                    for f in failures]
    assert not unattributed, (f"{len(unattributed)} failures not in flight at an engine crash:\n"
                              + "\n".join(unattributed[:200]))
    assert not excess, "failures beyond what the crashed engines held:\n" + "\n".join(excess[:200])
    assert plain.stats.total_sent > 1000


def dead_by(pid: int, timeout: float = 5.0) -> float:
    """time.monotonic() once ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    stat = Path(f"/proc/{pid}/stat")

    def dead() -> bool:
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True
    wait_for(f"process {pid} to die", dead, timeout, interval=0.001)
    return time.monotonic()


def _crash_an_engine(cluster: Cluster, namespace: str, monitor: Monitor, rng: random.Random) -> Crash | None:
    """SIGKILL the engine of a random published replica; None unless another one serves too."""
    serving = published(cluster.pods(namespace, POOL))
    candidates = [(p, pid) for p in serving if (pid := engine_pid(p)) is not None]
    if len(serving) < 2 or not candidates:
        return None
    pod, pid = rng.choice(candidates)
    with httpx.Client(timeout=1.0) as http:
        report = monitor.sidecar_state(pod, http) or {}
        at = time.monotonic()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        done = dead_by(pid)
        after = monitor.sidecar_state(pod, http) or {}
    inflight = int(report.get("inflight", 0))
    held = max(inflight, int(after.get("admittedTotal", 0)) - int(report.get("completedTotal", 0)))
    print(f"soak: killed the engine of {pod['metadata']['name']} (pid {pid}), sidecar said {report}", flush=True)
    address = f"{pod['status']['podIP']}:{TRAFFIC_PORT}"
    return Crash(at, done, pod["metadata"]["name"], address, inflight, held, len(serving))

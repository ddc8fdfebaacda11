"""Runs one pod's containers as local processes and reports the pod's status like a kubelet.

Why one thread per pod: a pod's life is a sequential story (network, volumes, init containers,
containers, probes, restarts, termination), which reads best as one loop. The loop ticks every
0.25 s and does almost nothing per tick, so a dozen pods cost little CPU.

Semantics kept from the kubelet: init containers run in order to completion; init containers with
`restartPolicy: Always` are sidecars that keep running (and stop after the main containers);
restart policies with exponential back-off (1 s doubling to 20 s, shorter than the kubelet's
10 s-300 s so tests stay fast; reset after 60 s of running) and `restartCount`; startup, readiness
and liveness probes (a liveness or startup failure restarts the container); on deletion each
container's preStop (exec in the pod's namespace with the container's env, httpGet or sleep), then
SIGTERM to the container's first process, then SIGKILL to all of its processes when that one exits or
the grace period is used up. Container output is appended to
`<pod dir>/logs/<container>.log` across restarts.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genrm_cluster import procutil
from genrm_cluster.contain import ContainerSpec, exec_argv, supervisor_argv
from genrm_cluster.imagestore import ImageRoot, ImageStore
from genrm_cluster.kubeapi import JSON, KubeAPI
from genrm_cluster.netns import PodNetns, PodNetwork
from genrm_cluster.podspec import ConfigError, PodFiles
from genrm_cluster.probes import ProbeState, run_probe

log = logging.getLogger("genrm_cluster.agent")

TICK_SECONDS = 0.25
BACKOFF_INITIAL, BACKOFF_MAX, BACKOFF_RESET_AFTER = 1.0, 20.0, 60.0

#: Called with (pod, status) whenever the reported status changes; False asks for a retry.
StatusSink = Callable[[JSON, JSON], bool]


def now_rfc3339() -> str:
    """Now as the second-precision RFC 3339 timestamp of pod and node status fields."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodConditions:
    """A pod's status conditions, each keeping its lastTransitionTime until its status flips (as the kubelet's)."""

    def __init__(self) -> None:
        self._transitions: dict[str, tuple[str, str]] = {}

    def __call__(self, kind: str, ok: bool) -> JSON:
        status = "True" if ok else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, now_rfc3339())
        return {"type": kind, "status": status, "lastProbeTime": None,
                "lastTransitionTime": self._transitions[kind][1]}


@dataclass
class Container:
    """One container of the pod and the state of its current run."""

    spec: JSON
    kind: str  # "init", "sidecar" or "main"
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    image: ImageRoot | None = None
    """The image it runs from, when the cluster's image store has it (`contain`); else a host process."""
    contained: ContainerSpec | None = None
    """Its current run's container, when it runs from ``image``."""
    restart_count: int = 0
    started_at: float = 0.0
    next_start_at: float = 0.0
    backoff: float = BACKOFF_INITIAL
    probes: dict[str, ProbeState] = field(default_factory=dict)
    done: bool = False  # exited and will not be restarted

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def started(self) -> bool:
        startup = self.probes.get("startupProbe")
        return self.running and (startup is None or startup.result)

    @property
    def ready(self) -> bool:
        readiness = self.probes.get("readinessProbe")
        return self.started and (readiness is None or readiness.result)

    def terminated(self, code: int) -> JSON:
        """The `terminated` state of the current run ending with `code` (negative: signal)."""
        assert self.proc is not None
        state: JSON = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.state.get("running", {}).get("startedAt", now_rfc3339()),
            "finishedAt": now_rfc3339(),
            "containerID": f"genrm://{self.proc.pid}",
        }
        if code < 0:
            state["signal"] = -code
        return state

    def exited(self, code: int, now: float, restart_policy: str) -> None:
        """The current run ended with ``code``: done, or (by the pod's restart policy) waiting
        out its back-off before the next run."""
        terminated = self.terminated(code)
        self.proc = None
        self.probes = {}
        restart = (self.kind == "sidecar" or (restart_policy == "Always" and self.kind == "main")
                   or (restart_policy != "Never" and code != 0))
        if not restart:
            self.state, self.done = {"terminated": terminated}, True
            return
        if now - self.started_at >= BACKOFF_RESET_AFTER:
            self.backoff = BACKOFF_INITIAL
        self.last_state = {"terminated": terminated}
        self.restart_count += 1
        self.next_start_at = now + self.backoff
        self.state = {"waiting": {"reason": "CrashLoopBackOff",
                                  "message": f"back-off {self.backoff:.0f}s restarting failed container"}}
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)

    def status(self) -> JSON:
        status: JSON = {
            "name": self.name, "image": self.spec.get("image", ""), "imageID": "",
            "ready": self.ready, "started": self.started, "restartCount": self.restart_count,
            "state": self.state,
        }
        if self.proc is not None:
            status["containerID"] = f"genrm://{self.proc.pid}"
        if self.last_state:
            status["lastState"] = self.last_state
        return status


def active_containers(containers: list[Container]) -> list[Container]:
    """Containers that should be running now: init containers gate everything after them."""
    active = []
    for c in containers:
        active.append(c)
        if c.kind == "init" and not (c.done and c.state.get("terminated", {}).get("exitCode") == 0):
            break
        if c.kind == "sidecar" and not c.started:
            break
    return active


class PodRunner:
    """Owns one pod: its namespace, files, processes, probes and status. See module docstring."""

    def __init__(self, api: KubeAPI, pod: JSON, network: PodNetwork, pod_dir: Path,
                 on_status: StatusSink, images: Mapping[str, Path] | None = None,
                 image_store: ImageStore | None = None) -> None:
        self.api = api
        self.images = images
        self.image_store = image_store
        self.pod = pod
        self.network = network
        self.pod_dir = pod_dir
        self.on_status = on_status
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.containers: list[Container] = [
            Container(c, "sidecar" if c.get("restartPolicy") == "Always" else "init",
                      pod_dir / "logs" / f"{c['name']}.log")
            for c in spec.get("initContainers") or []
        ] + [Container(c, "main", pod_dir / "logs" / f"{c['name']}.log") for c in spec["containers"]]
        self.netns: PodNetns | None = None
        self.files: PodFiles | None = None
        self.phase = "Pending"
        self.message = ""
        self.start_time = now_rfc3339()
        self._condition = PodConditions()
        self._last_reported: JSON | None = None
        self._wake = threading.Event()
        self._terminate_grace: float | None = None
        self._kill = False
        self.deleting = False  # set by the agent once graceful deletion began
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.key}", daemon=True)

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def log_paths(self) -> dict[str, Path]:
        return {c.name: c.log_path for c in self.containers}

    def start(self) -> None:
        self.thread.start()

    def terminate(self, grace_seconds: float) -> None:
        """Graceful stop (pod deletion): preStop, SIGTERM, SIGKILL after `grace_seconds`."""
        if self._terminate_grace is None:
            self._terminate_grace = grace_seconds
        self._wake.set()

    def kill(self) -> None:
        """Immediate stop without hooks (force deletion, agent shutdown)."""
        self._kill = True
        self._wake.set()

    # --- the pod's life -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._prepare()
            while not self._kill and self._terminate_grace is None:
                self._tick()
                self._wake.wait(TICK_SECONDS)
                self._wake.clear()
            if self._kill:
                self._stop_all(grace=2.0, hooks=False)
            else:
                self._stop_all(grace=self._terminate_grace or 0.0, hooks=True)
                self._report()
        except Exception:
            log.exception("pod %s: runner failed", self.key)
            self._stop_all(grace=0.0, hooks=False)
        finally:
            if self.netns is not None:
                self.network.remove_pod(self.netns)
            self.finished.set()

    def _prepare(self) -> None:
        """Network first (the pod IP feeds the downward API), then volumes (retried while missing)."""
        self.netns = self.network.add_pod()
        self.files = PodFiles(self.api, self.pod, self.pod_dir, self.netns.ip, self.network.host_ip, self.images,
                              self.network.api_service_ip)
        for c in self.containers:
            log.info("pod %s container %s log: %s", self.key, c.name, c.log_path)
        while not (self._kill or self._terminate_grace is not None):
            try:
                for c in self.containers:
                    c.image = self._image(c)
                self.files.materialise_volumes()
                for c in self.containers:
                    c.env = self.files.env(c.spec, c.image)
                return
            except ConfigError as err:
                self.message = str(err)
                for c in self.containers:
                    c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
                self._report()
                self._wake.wait(2.0)

    def _image(self, c: Container) -> ImageRoot | None:
        """The image ``c`` runs from, if the cluster's store has it; a store that fails is a container that
        cannot be created (retried), as an image a runtime cannot unpack."""
        if self.image_store is None:
            return None
        try:
            return self.image_store.root(c.spec.get("image", ""))
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as err:
            raise ConfigError(f"image {c.spec.get('image', '')}: {err}") from err

    def _tick(self) -> None:
        now = time.monotonic()
        if self.phase in ("Succeeded", "Failed"):
            return
        for c in active_containers(self.containers):
            if c.proc is None or not c.running:
                if c.proc is not None:
                    self._on_exit(c, now)
                if not c.done and now >= c.next_start_at:
                    self._start_container(c, now)
            else:
                self._run_probes(c, now)
        self._update_phase()
        self._report()

    def _start_container(self, c: Container, now: float) -> None:
        assert self.files is not None and self.netns is not None
        try:
            if c.image is not None:
                where = self.pod_dir / "containers" / c.name
                (where / "pid").unlink(missing_ok=True)  # an exec never finds the last run's process
                c.contained = self.files.contained(c.spec, c.env, c.image, where / f"root-{c.restart_count}",
                                                   where / "pid")
                argv = supervisor_argv(c.contained.write(where / "spec.json"))
            else:
                argv = self.files.argv(c.spec, c.env)
        except ConfigError as err:
            c.state = {"waiting": {"reason": "CreateContainerError", "message": str(err)}}
            c.next_start_at = now + BACKOFF_MAX
            return
        workdir = Path(c.spec.get("workingDir") or self.pod_dir) if c.image is None else self.pod_dir
        # The supervisor gets the agent's own PATH only: the container's environment is in its spec.
        env = c.env if c.contained is None else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        c.proc = procutil.spawn([*self.netns.exec_prefix(), *argv], c.log_path, env=env,
                                cwd=workdir if workdir.is_dir() else self.pod_dir)
        c.started_at = now
        c.state = {"running": {"startedAt": now_rfc3339()}}
        c.probes = {
            kind: ProbeState(c.spec[kind], now, initial=(kind == "livenessProbe"))
            for kind in ("startupProbe", "readinessProbe", "livenessProbe") if c.spec.get(kind)
        }

    def _on_exit(self, c: Container, now: float) -> None:
        assert c.proc is not None
        procutil.stop_group(c.proc, grace_seconds=0.0)  # reap leftovers of the container's group
        c.exited(c.proc.wait(), now, self.restart_policy)

    def _run_probes(self, c: Container, now: float) -> None:
        assert self.netns is not None
        startup = c.probes.get("startupProbe")
        order = ["startupProbe"] if startup is not None and not startup.result else [
            "readinessProbe", "livenessProbe"]
        for kind in order:
            state = c.probes.get(kind)
            if state is None:
                continue
            if state.due(now):
                state.launch(functools.partial(run_probe, state.probe, self.netns.ip, c.spec,
                                               functools.partial(self._exec, c)), now, self._wake.set)
            if state.finished() is None:
                continue
            if state.failed and kind != "readinessProbe" and c.proc is not None:
                log.info("pod %s container %s: %s failed, restarting", self.key, c.name, kind)
                procutil.stop_container(c.proc, grace_seconds=self._grace())
                return

    def _exec(self, c: Container, argv: list[str], timeout: float) -> int:
        """Run a command inside the pod's namespace with the container's env (hooks, probes)."""
        assert self.netns is not None and self.files is not None
        if c.contained is not None:
            # nsenter is a root process on the host until it has entered: the container's variables are
            # given to the command inside (`exec_argv`), never to nsenter itself.
            cmd, env = exec_argv(c.contained, argv), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        else:
            env = c.env
            cmd = [*self.netns.exec_prefix(), *self.files.argv({**c.spec, "command": argv, "args": []}, c.env)]
        with c.log_path.open("ab") as out:
            return subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout).returncode

    def _grace(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    # --- status ---------------------------------------------------------------------------------

    def _update_phase(self) -> None:
        mains = [c for c in self.containers if c.kind == "main"]
        if all(c.done for c in mains):
            ok = all(c.state["terminated"]["exitCode"] == 0 for c in mains)
            self._finish("Succeeded" if ok else "Failed")
        elif any(c.kind == "init" and c.done and c.state["terminated"]["exitCode"] != 0
                 for c in self.containers):
            self._finish("Failed")
        elif all(c.proc is not None or c.restart_count > 0 or c.done for c in mains):
            self.phase = "Running"

    def _finish(self, phase: str) -> None:
        """A terminal phase: stop what still runs (sidecars) without hooks."""
        self.phase = phase
        self._stop_all(grace=self._grace(), hooks=False)

    def status(self) -> JSON:
        """The pod status as the kubelet would report it."""
        inits = [c for c in self.containers if c.kind != "main"]
        mains = [c for c in self.containers if c.kind == "main"]
        initialized = all(c.done or c.started for c in inits)
        ready = self.phase == "Running" and all(c.ready for c in mains) and all(
            c.ready for c in inits if c.kind == "sidecar")
        status: JSON = {
            "phase": self.phase,
            "hostIP": self.network.host_ip, "hostIPs": [{"ip": self.network.host_ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.netns is not None),
                self._condition("Initialized", initialized),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": [c.status() for c in mains],
        }
        if inits:
            status["initContainerStatuses"] = [c.status() for c in inits]
        if self.netns is not None:
            status["podIP"], status["podIPs"] = self.netns.ip, [{"ip": self.netns.ip}]
        if self.message:
            status["message"] = self.message
        return status

    def _report(self) -> None:
        status = self.status()
        if status != self._last_reported and self.on_status(self.pod, status):
            self._last_reported = status

    # --- termination ----------------------------------------------------------------------------

    def _stop_all(self, grace: float, hooks: bool) -> None:
        """Stop main containers first, then sidecars and init containers, within `grace` seconds."""
        deadline = time.monotonic() + grace
        for group in (["main"], ["sidecar", "init"]):
            running = [c for c in self.containers if c.kind in group and c.running]
            threads = [threading.Thread(target=self._stop_container, args=(c, deadline, hooks))
                       for c in running]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if self.phase not in ("Succeeded", "Failed"):
            failed = any(c.state.get("terminated", {}).get("exitCode", 0) != 0 for c in self.containers)
            self.phase = "Failed" if failed else "Succeeded"

    def _stop_container(self, c: Container, deadline: float, hooks: bool) -> None:
        assert c.proc is not None
        if hooks:
            self._pre_stop(c, deadline)
        code = procutil.stop_container(c.proc, grace_seconds=max(0.0, deadline - time.monotonic()))
        c.state, c.done = {"terminated": c.terminated(code)}, True

    def _pre_stop(self, c: Container, deadline: float) -> None:
        hook: dict[str, Any] = (c.spec.get("lifecycle") or {}).get("preStop") or {}
        timeout = max(0.1, deadline - time.monotonic())
        assert self.netns is not None
        try:
            if "exec" in hook:
                log.info("pod %s container %s: preStop exec", self.key, c.name)
                self._exec(c, list(hook["exec"]["command"]), timeout)
            elif "httpGet" in hook:
                probe = {"httpGet": hook["httpGet"], "timeoutSeconds": timeout}
                run_probe(probe, self.netns.ip, c.spec, lambda argv, t: 0)
            elif "sleep" in hook:
                time.sleep(min(float(hook["sleep"]["seconds"]), timeout))
        except (subprocess.TimeoutExpired, OSError) as err:
            log.info("pod %s container %s: preStop ended: %s", self.key, c.name, err)


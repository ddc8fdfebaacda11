"""Test harness for the end-to-end suite: the cluster handle, the operator process, waits.

The operator runs as a real separate process (so tests can SIGKILL it), talks
to the local cluster's real kube-apiserver, and reaches replica sidecars at
their pod addresses inside the network namespaces the node agent created.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
from genrm_cluster.cluster import LocalCluster
from genrm_testing import free_port
from genrm_testing.waiting import wait_for as wait_for
from kubernetes import client, config

from .plainclients import PlainClients

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    """Figures for the suite's closing `e2e-summary` line."""

    requests: int = 0
    failed: int = 0
    scale_ops: int = 0
    operator_kills: int = 0
    plain_requests: int = 0
    plain_failed: int = 0
    spread_old_share: float = float("nan")
    """The first replica's share of the requests in the 30 s after a scale 1 -> 4 spread (test_spread)."""
    spread_min_new_share: float = float("nan")
    """The smallest share of the three new replicas over the same 30 s."""
    speed_guard: str = ""
    """The operator speed guard's line (test_operator_speed), when it ran."""
    trainer_client: str = ""
    """The trainer client's line (test_trainer_client), when it ran."""


TALLY = Tally()


@dataclass(frozen=True)
class SoakFigures:
    """What the soak did and found, for its closing `soak-summary` line."""

    seed: int
    """`GENRM_SOAK_SEED` that repeats the run's plan."""
    requests: int
    failed: int
    scale_changes: int
    rollouts: int
    """Changes of the pod template, each rolling every replica out."""
    operator_kills: int
    engine_kills: int
    violations: int
    converge_s: float
    empty_service_moments: int
    """Stretches in which the pool's Service had no ready endpoint."""
    empty_service_s: float
    lost_in_flight_at_crash: int
    """Failed requests that were in flight on an engine when it was killed (allowed)."""
    lost_empty_service: int
    """Failed requests that met an empty-Service moment."""
    lost_other: int

    def line(self) -> str:
        return (f"soak-summary: seed={self.seed} requests={self.requests} failed={self.failed} "
                f"scale_changes={self.scale_changes} rollouts={self.rollouts} "
                f"operator_kills={self.operator_kills} engine_kills={self.engine_kills} "
                f"violations={self.violations} converge_s={self.converge_s:.1f} "
                f"empty_service_moments={self.empty_service_moments} empty_service_s={self.empty_service_s:.1f} "
                f"lost_in_flight_at_crash={self.lost_in_flight_at_crash} "
                f"lost_empty_service={self.lost_empty_service} lost_other={self.lost_other}")


@dataclass
class SoakResult:
    """Set by the soak test when it ran, so the terminal summary can repeat its line."""

    figures: SoakFigures | None = None


SOAK = SoakResult()


@dataclass
class Cluster:
    """What e2e tests use: kubectl (returns stdout), the API client, and log paths."""

    local: LocalCluster
    api: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = config.new_client_from_config(str(self.local.kubeconfig))

    @property
    def kubeconfig(self) -> str:
        return str(self.local.kubeconfig)

    @property
    def bin_dir(self) -> str:
        return str(self.local.bin_dir)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0) -> str:
        done = self.local.kubectl(*args, check=False, input=input, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout if check else done.stdout + done.stderr

    def kubectl_fails(self, *args: str, input: str | None = None) -> str:
        """Run kubectl expecting a rejection; return its error text."""
        done = self.local.kubectl(*args, check=False, input=input)
        assert done.returncode != 0, f"kubectl {' '.join(args)} unexpectedly succeeded: {done.stdout}"
        return done.stderr

    def service_url(self, namespace: str, name: str) -> str:
        """The pool Service's ClusterIP URL; refused unless that address stays on this host."""
        return self.local.service_url(namespace, name)

    def plain_clients(self, namespace: str, pool: str) -> PlainClients:
        """Unmodified clients (openai, httpx, requests) against the pool's Service ClusterIP."""
        return PlainClients(self.service_answering(namespace, pool), served_model(self.pool(namespace, pool)))

    def service_answering(self, namespace: str, pool: str) -> str:
        """The pool Service's ClusterIP URL, once it answers: kube-proxy programs a new Service within
        about a second, and a request before that is not what the scenarios are about."""
        url = self.service_url(namespace, pool)
        wait_for(f"Service {namespace}/{pool} to answer at {url}",
                 lambda: httpx.get(f"{url}/v1/models", timeout=2.0).status_code, timeout=30, interval=0.2,
                 done=lambda code: code == 200)
        return url

    def pool(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "genrmpool", name, "-n", namespace, "-o", "json"))

    def pods(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-n", namespace, "-l", f"genrm.io/pool={pool}", "-o", "json")
        return list(json.loads(out)["items"])

    def serving_replicas(self, namespace: str, name: str) -> int:
        return int((self.pool(namespace, name).get("status") or {}).get("servingReplicas") or 0)

    def published(self, namespace: str, pool: str) -> list[str]:
        """Names of the pool's pods the Service routes to (published and not being deleted)."""
        return sorted(p["metadata"]["name"] for p in self.pods(namespace, pool)
                      if p["metadata"]["labels"].get("genrm.io/published") == "true"
                      and not p["metadata"].get("deletionTimestamp"))

    def pod_addresses(self, namespace: str, pool: str) -> dict[str, str]:
        """Pod name -> pod IP of the pool's live pods (through the API client: cheap enough to poll)."""
        pods = client.CoreV1Api(self.api).list_namespaced_pod(namespace, label_selector=f"genrm.io/pool={pool}")
        return {p.metadata.name: p.status.pod_ip for p in pods.items
                if p.status.pod_ip and not p.metadata.deletion_timestamp}

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.kubectl("scale", "genrmpool", name, "-n", namespace, f"--replicas={replicas}")
        TALLY.scale_ops += 1

    def wait_serving(self, namespace: str, name: str, replicas: int, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the pool is converged: N serving, no operation, no extra pods."""
        def converged() -> dict[str, Any] | None:
            pool = self.pool(namespace, name)
            status = pool.get("status") or {}
            live = [p for p in self.pods(namespace, name) if not p["metadata"].get("deletionTimestamp")]
            ok = (status.get("servingReplicas") == replicas and not status.get("operation")
                  and status.get("observedGeneration") == pool["metadata"]["generation"] and len(live) == replicas)
            return pool if ok else None
        return wait_for(f"{namespace}/{name} to serve {replicas} replicas", converged, timeout)

    def debug_dump(self, namespace: str) -> str:
        """Pool status, pods, events and the logs of the pods involved (printed on failure)."""
        parts = [self.kubectl("get", "genrmpools,pods,endpointslices", "-n", namespace, "-o", "wide", check=False),
                 self.kubectl("get", "genrmpools", "-n", namespace, "-o", "yaml", check=False),
                 self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)]
        for pod in json.loads(self.kubectl("get", "pods", "-n", namespace, "-o", "json", check=False) or "{}")\
                .get("items", []):
            for container, path in self.local.logs_for(pod["metadata"]["name"], namespace).items():
                parts.append(f"--- {pod['metadata']['name']}/{container} ({path})\n{tail(path)}")
        return "\n".join(parts)


def served_model(pool: dict[str, Any]) -> str:
    """The model name the OpenAI API of a pool's replicas answers to."""
    model = pool["spec"]["model"]
    return str(model.get("servedName") or model["path"])


def account_plain(plain: PlainClients) -> None:
    """Add a finished run of the unmodified clients to the summary line."""
    TALLY.plain_requests += plain.stats.total_sent
    TALLY.plain_failed += plain.stats.failed


def plain_report(plain: PlainClients) -> str:
    """The unmodified clients' failures, verbatim (up to 200 lines), for an assertion message."""
    stats = plain.stats
    listing = "\n".join(str(f) for f in stats.failures[:200])
    return (f"{stats.failed} of {stats.total_sent} plain-client requests failed "
            f"(sent per client {stats.sent}):\n{listing}")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<{exc}>"


def helm(cluster: Cluster, *args: str, timeout: float = 300) -> str:
    """The built helm against ``cluster``; its output, or an assertion with its error."""
    done = subprocess.run([str(Path(cluster.bin_dir) / "helm"), *args, "--kubeconfig", cluster.kubeconfig],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


def deploy_activator(cluster: Cluster, release: str = "e2e", namespace: str = "genrm-system") -> tuple[str, str]:
    """The chart's activator (two pods, its Service and token) in ``namespace``, rendered from the chart
    as `helm install` makes it; its Service (``namespace/name``) and control token, for the operator."""
    cluster.kubectl("apply", "-f", "-", input=cluster.kubectl("create", "namespace", namespace,
                                                               "--dry-run=client", "-o", "yaml"))
    helm = [str(Path(cluster.bin_dir) / "helm"), "template", release, str(REPO / "charts" / "genrm-operator"),
            "-n", namespace, "--kube-version", "1.36.3", "--show-only", "templates/activator.yaml"]
    rendered = subprocess.run(helm, capture_output=True, text=True, check=True)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=rendered.stdout)
    name = f"{release}-genrm-operator-activator"
    cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", namespace, "--timeout=120s", timeout=130)
    token = cluster.kubectl("get", "secret", name, "-n", namespace, "-o", "jsonpath={.data.token}")
    return f"{namespace}/{name}", base64.b64decode(token).decode()


class OperatorProcess:
    """The operator as a child process: start, SIGKILL, restart."""

    def __init__(self, kubeconfig: str, log_dir: Path, activator: tuple[str, str] | None = None) -> None:
        """``activator``: the activator's Service (``namespace/name``) and its control token."""
        self.kubeconfig = kubeconfig
        self.activator = activator
        self.log_path = log_dir / "operator.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "operator already running"
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
        extra: list[str] = []
        if self.activator is not None:
            extra = [f"--activator-service={self.activator[0]}"]
            env["GENRM_ACTIVATOR_TOKEN"] = self.activator[1]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "genrm_operator", "--metrics-host", "127.0.0.1",
                 "--metrics-port", str(self.metrics_port),
                 "--liveness", f"http://127.0.0.1:{free_port()}/healthz", *extra],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, as in a node crash or OOM kill."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        TALLY.operator_kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def log_tail(self, lines: int = 80) -> str:
        return tail(self.log_path, lines)


def pool_manifest(name: str, namespace: str, replicas: int = 1, **spec: Any) -> str:
    """A simulator pool with fast timings for tests, as YAML/JSON text for kubectl apply."""
    engine = {
        "image": "genrm/sim:test", "command": ["genrm-sim"], "seed": 7, "gpusPerReplica": 1,
        "extraArgs": ["--sim-startup-seconds", "1", "--sim-ttft-ms", "5", "--sim-itl-ms", "1"],
        "startupTimeoutSeconds": 60,
    }
    engine.update(spec.pop("engine", {}))
    body = {
        "apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "model": {"path": "sim/judge"}, "engine": engine,
                 "drain": {"propagationSeconds": 2, "quietSeconds": 1, "timeoutSeconds": 60}, **spec},
    }
    return json.dumps(body)


class Sampler:
    """A background thread calling ``sample`` every ``interval`` seconds while in the ``with`` block:
    what the cluster benchmarks read beside their load (requests held, pods alive)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


@contextlib.contextmanager
def operated_cluster(log_dir: Path | None, activator: bool = False) -> Iterator[tuple[Cluster, OperatorProcess]]:
    """A local cluster (2 nodes x 8 GPUs) with the CRD and the operator running (beside the chart's
    activator when asked): what every cluster benchmark starts from. The operator's log goes to
    ``log_dir``, else to a temporary directory."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    with LocalCluster(nodes=2, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"]) as local, \
            tempfile.TemporaryDirectory() as work:
        cluster = Cluster(local)
        operator = OperatorProcess(cluster.kubeconfig, log_dir or Path(work),
                                   deploy_activator(cluster) if activator else None)
        operator.start()
        try:
            yield cluster, operator
        finally:
            operator.stop()

"""``make bench-operator``: what the operator costs and how fast it acts, beside the ReplicaSet controller.

On the local cluster, for each size (P pools of R replicas, one namespace per pool), with real
simulator pods or hollow ones (``--hollow``: one process answers for every replica's sidecar and
engine, `genrm_cluster.hollow`), the operator (a real process, `harness.OperatorProcess`) gets:

* an idle window: operator CPU (``/proc/<pid>/stat``), its API writes and reads, sidecar calls;
* a scale storm: every pool scaled out by one at once, then (converged) in by one, ``--rounds``
  times, while a Deployment in the same cluster is scaled out a few times (its pods pin to no
  node, so only the ReplicaSet controller works);
* a Deployment burst, after the storm, beside the same idle pools: as many Deployments as pools
  (one namespace each) scaled out by one at once, ``--rounds`` times, so the ReplicaSet
  controller answers a burst as large as the operator's, through an API server as busy with it.

Figures:

* reaction: the scale request's arrival at the API server to the operator's first pod create
  (scale-out) or first pod patch (the unpublish of scale-in) in that pool's namespace; for the
  Deployment, to the ReplicaSet controller's first pod create (``rs_react``). Both ends come from
  the API server's audit log (microsecond timestamps, the client named by its user agent: the
  operator's kube client sends ``genrm-operator``, kopf ``kopf/<version>``); the same for the
  Deployment burst (``rs_burst``, printed on its own line before the last);
* where a pool's reaction time goes (``operator-bench-split:``, after each size's row and before
  the burst line): the scale request inside the API server, its delivery to a watch of the pools
  (the benchmark's own, which sees a version when the operator's does), the operator's own part up
  to its first request for that pool, and the status write that records the decision before the
  create or unpublish; medians, and means over the slowest tenth of the reactions;
* publish overhead: pod Ready (the kubelet's report of the sidecar's readiness) to the published
  label, both as a watch shows them; drain overhead (hollow only): the replica's Drained instant
  (the hollow server's clock) to the operator's pod delete (audit);
* cost: operator CPU idle and during the storm (cores), RSS (MB), API writes and reads per minute
  by the operator (audit: ``apiserver_request_total`` has no client label, so the audit log is
  where the API server says who wrote), pool status writes per pool scale change in the storm
  (``st/op``, audit), sidecar calls per second (the operator's own count of the requests it made to
  sidecars, ``genrm_operator_sidecar_requests_total``, read from its ``/metrics``: the same figure
  for real and hollow replicas);
* the API server's CPU in the storm (cores), and per request (after each mode's sizes, with the
  operator stopped: `Bench.request_costs`): a pool status write as the operator sends it (a PUT of
  the status alone) beside a merge patch of only what changed (``operator-bench-write:``); a scale
  request and a pod create, which with the status write before it add up to the API server's work
  before the last pool of a storm can act (``operator-bench-floor:``, ``critical_cpu_s``).

Run from the repository root: ``python -m bench.operator_storm --hollow --sizes 10x5,50x20``.
The last line is ``operator-bench: pools=P replicas=R react_p50_s= ...`` for the largest size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from genrm_cluster.cluster import LocalCluster
from genrm_cluster.kubeapi import JSON, ApiError, KubeAPI
from genrm_operator.shell.kube import status_update
from genrm_operator.shell.metrics import SIDECAR_REQUESTS
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness import REPO, Cluster, OperatorProcess, pool_manifest

OPERATOR_AGENTS = ("genrm-operator", "kopf/")
RS_USER = "system:serviceaccount:kube-system:replicaset-controller"
RS_NAMESPACE = "bench-rs"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["watch"]},
        {"level": "Metadata", "userGroups": ["system:masters"]},
        {"level": "Metadata", "users": [RS_USER]},
        {"level": "None"},
    ],
}
SIDECAR_CALLS = next(iter(SIDECAR_REQUESTS.describe())).name
"""The operator's counter of its requests to sidecars (the family name, without ``_total``)."""
SPLIT = ("react", "api", "delivery", "operator", "write")
"""A pool's reaction time (``react``) as the sum of: the scale request inside the API server, from its
arrival to its answer (``api``); from that answer to a watch of the pools showing the new replicas
(``delivery``: etcd and the API server bringing it to watchers); from there to the operator's first
request for that pool (``operator``: its watch, queue and decision); from that request to the pod
create or unpublish (``write``: the status write that records the decision first, when there is one)."""
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
WRITE_ROUNDS = 6
"""Rounds of each kind of request in `Bench.request_costs`, alternated."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- measuring -----------------------------------------------------------------------------------


def stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Audit:
    """The API server's audit log, read as it grows."""

    path: Path
    offset: int = 0
    events: list[JSON] = field(default_factory=list)

    def read(self) -> list[JSON]:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offset += end
            for line in data[:end].splitlines():
                event = json.loads(line)
                event["t"] = stamp(event["requestReceivedTimestamp"])
                event["answered"] = stamp(event["stageTimestamp"])
                self.events.append(event)
        return self.events

    @staticmethod
    def by_operator(event: JSON) -> bool:
        return str(event.get("userAgent", "")).startswith(OPERATOR_AGENTS)

    def status_writes(self, start: float, end: float) -> int:
        """The operator's writes of pool status between two wall times."""
        return sum(1 for e in self.read() if start <= e["t"] < end and self.by_operator(e) and e["verb"] in WRITES
                   and (e.get("objectRef") or {}).get("subresource") == "status"
                   and (e.get("objectRef") or {}).get("resource") == "genrmpools")

    def operator_calls(self, start: float, end: float) -> tuple[int, int]:
        """(writes, reads) the operator sent between two wall times."""
        calls = [e for e in self.read() if start <= e["t"] < end and self.by_operator(e)]
        writes = sum(1 for e in calls if e["verb"] in WRITES)
        return writes, len(calls) - writes


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


@dataclass
class Watch:
    """One kind of object as a watch shows it, each version handed to ``see`` with its arrival time."""

    api: KubeAPI
    path: str
    params: dict[str, str]
    see: Callable[[JSON, float], None]
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, name=f"bench-watch{self.path.replace('/', '-')}", daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                listing = self.api.get(self.path, params=self.params)
                for item in listing["items"]:
                    self.see(item, time.time())
                rv = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(self.path, rv, self.params, timeout_seconds=300):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.see(event["object"], time.time())
                    if self.stop.is_set():
                        return
            except (ApiError, OSError, ValueError, KeyError) as err:
                print(f"watch of {self.path} restarting: {err}", file=sys.stderr)
                time.sleep(0.5)
            except Exception as err:  # httpx errors
                if not self.stop.is_set():
                    print(f"watch of {self.path} restarting: {err}", file=sys.stderr)
                    time.sleep(0.5)


@dataclass
class PodWatch:
    """Pods of the pools as a watch shows them: when each became Ready, published, and its IP."""

    api: KubeAPI
    ready_at: dict[str, float] = field(default_factory=dict)
    published_at: dict[str, float] = field(default_factory=dict)
    ip_of: dict[str, str] = field(default_factory=dict)  # "ns/name" -> pod IP

    def __post_init__(self) -> None:
        self.watch = Watch(self.api, "/api/v1/pods", {"labelSelector": "genrm.io/pool"}, self._see)

    def _see(self, pod: JSON, now: float) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        if status.get("podIP"):
            self.ip_of[f"{meta['namespace']}/{meta['name']}"] = status["podIP"]
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if ready and uid not in self.ready_at and uid not in self.published_at:
            self.ready_at[uid] = now
        if (meta.get("labels") or {}).get("genrm.io/published") == "true" and uid not in self.published_at:
            self.published_at[uid] = now

    def publish_overheads(self, since: float) -> list[float]:
        """Ready -> published of the pods that became Ready after ``since`` (and were published)."""
        return [self.published_at[uid] - t for uid, t in self.ready_at.items()
                if t >= since and uid in self.published_at]


@dataclass
class PoolWatch:
    """When a watch of the pools showed each pool's ``spec.replicas`` values: the API server's delivery
    of a scale to its watchers, which the operator's own watch gets at the same moment (measured
    beside the operator's: a few milliseconds apart), so reaction time can be split at it."""

    api: KubeAPI
    seen: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))
    latest: dict[str, JSON] = field(default_factory=dict)
    """Each pool (by namespace) as the watch last showed it: what convergence is judged on."""

    def __post_init__(self) -> None:
        self.watch = Watch(self.api, "/apis/genrm.io/v1alpha1/genrmpools", {}, self._see)

    def _see(self, pool: JSON, now: float) -> None:
        self.seen[pool["metadata"]["namespace"]].append((now, int(pool["spec"].get("replicas", 0))))
        self.latest[pool["metadata"]["namespace"]] = pool

    def delivered(self, namespace: str, replicas: int, after: float) -> float | None:
        """When the watch first showed ``replicas`` in the pool at or after ``after``."""
        return next((t for t, r in list(self.seen[namespace]) if t >= after and r == replicas), None)


@dataclass
class Change:
    """One scale request of the benchmark: where, which way, answered by whom."""

    namespace: str
    kind: str  # "out", "in", "rs" (the Deployment beside the storm) or "burst" (the Deployment burst)
    sent: float  # wall time just before sending (the audit's arrival time replaces it)
    replicas: int = 0  # what it scaled to (pools: where the pool watch shows it delivered)


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Figures:
    mode: str
    pools: int
    per_pool: int
    provision_s: float = math.nan
    react: list[float] = field(default_factory=list)
    react_out: list[float] = field(default_factory=list)
    react_in: list[float] = field(default_factory=list)
    split: dict[str, list[float]] = field(default_factory=lambda: {part: [] for part in SPLIT})
    """The pools' reactions split at the scale's answer, its delivery to a watch and the operator's first request."""
    rs_react: list[float] = field(default_factory=list)
    rs_burst: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    drain_delete: list[float] = field(default_factory=list)
    cpu_idle: float = math.nan
    cpu_storm: float = math.nan
    api_cpu_storm: float = math.nan
    """The API server's CPU in the storm (cores)."""
    rss: float = math.nan
    writes_idle: float = math.nan
    writes_storm: float = math.nan
    status_per_op: float = math.nan
    """The operator's pool status writes in the storm per pool scale change."""
    reads_idle: float = math.nan
    sidecar_idle: float = math.nan
    sidecar_storm: float = math.nan
    missed: int = 0

    @property
    def replicas(self) -> int:
        return self.pools * self.per_pool

    def line(self) -> str:
        return (f"operator-bench: pools={self.pools} replicas={self.replicas} "
                f"react_p50_s={pct(self.react, .5):.3f} react_p99_s={pct(self.react, .99):.3f} "
                f"rs_react_p50_s={pct(self.rs_react, .5):.3f} "
                f"publish_overhead_p50_s={pct(self.publish, .5):.3f} "
                f"publish_overhead_p99_s={pct(self.publish, .99):.3f} "
                f"cpu_idle_cores={self.cpu_idle:.3f} rss_mb={self.rss:.0f} api_writes_per_min={self.writes_idle:.1f} "
                f"rs_burst_p99_s={pct(self.rs_burst, .99):.3f} p99_to_burst={self.p99_to_burst:.2f}")

    @property
    def p99_to_burst(self) -> float:
        """The operator's reaction p99 over the ReplicaSet controller's under a burst as large, in the same
        run: the API server and the machine are as busy for both, so the ratio is what a slower operator
        changes and a slower machine does not."""
        return pct(self.react, .99) / pct(self.rs_burst, .99)

    def split_line(self) -> str:
        """Where the pools' reaction time goes: median, and the mean over the slowest tenth of reactions."""
        order = sorted(range(len(self.split["react"])), key=self.split["react"].__getitem__)
        slowest = order[len(order) - max(1, len(order) // 10):] if order else []
        parts = [f"reactions={len(order)}"]
        parts += [f"{part}_p50_s={pct(self.split[part], .5):.3f}" for part in SPLIT[1:]]
        parts += [f"slowest_tenth_{part}_s={statistics.fmean(self.split[part][i] for i in slowest):.3f}"
                  if slowest else f"slowest_tenth_{part}_s=nan" for part in SPLIT]
        return "operator-bench-split: " + " ".join(parts)

    def burst_line(self) -> str:
        """The ReplicaSet controller answering a burst of as many Deployment scales as there are pools."""
        return (f"operator-bench-burst: deployments={self.pools} rs_burst_react_p50_s={pct(self.rs_burst, .5):.3f} "
                f"rs_burst_react_p99_s={pct(self.rs_burst, .99):.3f}")


COLUMNS: list[tuple[str, Callable[[Figures], object]]] = [
    ("mode", lambda f: f.mode), ("PxR", lambda f: f"{f.pools}x{f.per_pool}"), ("R", lambda f: f.replicas),
    ("prov_s", lambda f: f"{f.provision_s:.1f}"),
    ("react50", lambda f: f"{pct(f.react, .5):.3f}"), ("react99", lambda f: f"{pct(f.react, .99):.3f}"),
    ("out50", lambda f: f"{pct(f.react_out, .5):.3f}"), ("in50", lambda f: f"{pct(f.react_in, .5):.3f}"),
    ("rs50", lambda f: f"{pct(f.rs_react, .5):.3f}"), ("rs99", lambda f: f"{pct(f.rs_react, .99):.3f}"),
    ("burst50", lambda f: f"{pct(f.rs_burst, .5):.3f}"), ("burst99", lambda f: f"{pct(f.rs_burst, .99):.3f}"),
    ("pub50", lambda f: f"{pct(f.publish, .5):.3f}"), ("pub99", lambda f: f"{pct(f.publish, .99):.3f}"),
    ("del50", lambda f: f"{pct(f.drain_delete, .5):.3f}"), ("del99", lambda f: f"{pct(f.drain_delete, .99):.3f}"),
    ("cpu_idle", lambda f: f"{f.cpu_idle:.3f}"), ("cpu_storm", lambda f: f"{f.cpu_storm:.3f}"),
    ("api_cpu_storm", lambda f: f"{f.api_cpu_storm:.2f}"),
    ("rss_mb", lambda f: f"{f.rss:.0f}"), ("wr/min_idle", lambda f: f"{f.writes_idle:.1f}"),
    ("wr/min_storm", lambda f: f"{f.writes_storm:.0f}"), ("st/op", lambda f: f"{f.status_per_op:.1f}"),
    ("rd/min_idle", lambda f: f"{f.reads_idle:.1f}"),
    ("sc/s_idle", lambda f: f"{f.sidecar_idle:.1f}"), ("sc/s_storm", lambda f: f"{f.sidecar_storm:.1f}"),
]


def table(rows: Sequence[Figures]) -> str:
    cells = [[name for name, _ in COLUMNS]] + [[str(get(f)) for _, get in COLUMNS] for f in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def growth(rows: Sequence[Figures]) -> Iterator[str]:
    """How each figure grows from the smallest to the largest size of one mode."""
    for mode in dict.fromkeys(f.mode for f in rows):
        sized = [f for f in rows if f.mode == mode]
        if len(sized) < 2:
            continue
        a, b = sized[0], sized[-1]
        parts = []
        for name, get in (("react_p99", lambda f: pct(f.react, .99)), ("publish_p50", lambda f: pct(f.publish, .5)),
                          ("cpu_idle", lambda f: f.cpu_idle), ("cpu_storm", lambda f: f.cpu_storm),
                          ("rss", lambda f: f.rss), ("writes_idle", lambda f: f.writes_idle),
                          ("reads_idle", lambda f: f.reads_idle), ("sidecar_idle", lambda f: f.sidecar_idle)):
            x, y = get(a), get(b)
            ok = x and not math.isnan(x) and not math.isnan(y)
            parts.append(f"{name} x{y / x:.2f}" if ok else f"{name} {x:g}->{y:g}")
        yield (f"growth {mode} {a.pools}x{a.per_pool} -> {b.pools}x{b.per_pool} "
               f"(pools x{b.pools / a.pools:g}, replicas x{b.replicas / a.replicas:g}): " + ", ".join(parts))


class Bench:
    def __init__(self, local: LocalCluster, audit: Audit, work: Path, hollow: bool, idle_s: float, rounds: int,
                 profile: Path | None = None) -> None:
        self.local, self.audit, self.hollow, self.profile = local, audit, hollow, profile
        self.cluster = Cluster(local)
        self.idle_s, self.rounds = idle_s, rounds
        cp = local.control_plane
        self.api = KubeAPI(cp.server, cp.pki.ca.cert, *self._admin_pair(work))
        self.pod_watch = PodWatch(KubeAPI(cp.server, cp.pki.ca.cert, *self._admin_pair(work)))
        self.pool_watch = PoolWatch(KubeAPI(cp.server, cp.pki.ca.cert, *self._admin_pair(work)))
        self.deployments: dict[str, JSON] = {}
        """Each Deployment (by namespace) as a watch last showed it: the burst's convergence, judged like
        the pools' (`wait_converged`), without listing them."""
        self.deployment_watch = Watch(KubeAPI(cp.server, cp.pki.ca.cert, *self._admin_pair(work)),
                                      "/apis/apps/v1/deployments", {},
                                      lambda d, _: self.deployments.__setitem__(d["metadata"]["namespace"], d))
        self.operator = OperatorProcess(self.cluster.kubeconfig, work)
        self.pools: dict[str, int] = {}  # namespace -> replicas
        self.pool = ThreadPoolExecutor(16)

    def _admin_pair(self, work: Path) -> tuple[Path, Path]:
        pair = self.local.control_plane.pki.client_cert("bench", "admin", ("system:masters",))
        return pair.cert, pair.key

    def start(self) -> None:
        self.cluster.kubectl("create", "namespace", RS_NAMESPACE)
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment()))
        self.pod_watch.watch.start()
        self.pool_watch.watch.start()
        self.deployment_watch.start()
        self.operator.start()

    def stop(self) -> None:
        self.pod_watch.watch.stop.set()
        self.pool_watch.watch.stop.set()
        self.deployment_watch.stop.set()
        self.operator.stop()
        self.pool.shutdown()

    @property
    def pid(self) -> int:
        assert self.operator.proc is not None and self.operator.proc.poll() is None, self.operator.log_tail()
        return self.operator.proc.pid

    def start_profiler(self, name: str) -> subprocess.Popen[bytes] | None:
        """``--profile DIR``: sample the operator's stacks through the storm with py-spy (collapsed
        stacks, one file per size) without pausing it; None without the option."""
        if self.profile is None:
            return None
        spy = shutil.which("py-spy")
        assert spy is not None, "--profile needs py-spy on PATH"
        self.profile.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([spy, "record", "--pid", str(self.pid), "--rate", "200", "--nonblocking",
                                 "--format", "raw", "--output", str(self.profile / f"{name}.txt")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def sidecar_calls(self) -> float:
        """Requests the operator has made to sidecars so far (its counter, every call and code)."""
        url = f"http://127.0.0.1:{self.operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text) if family.name == SIDECAR_CALLS
                   for sample in family.samples if sample.name == f"{SIDECAR_CALLS}_total")

    def resize(self, pools: int, per_pool: int) -> float:
        """Bring the pools to ``pools`` of ``per_pool`` replicas; seconds until all serve."""
        start = time.monotonic()
        wanted = {f"bench-{i}" for i in range(pools)}
        for ns in sorted(set(self.pools) - wanted):
            self.cluster.kubectl("delete", "namespace", ns, "--wait=false")
            del self.pools[ns]
        for ns in sorted(wanted, key=lambda n: int(n.split("-")[1])):
            if ns not in self.pools:
                self.cluster.kubectl("create", "namespace", ns)
                self.cluster.kubectl("apply", "-f", "-", input=pool_manifest("judge", ns, replicas=per_pool))
            elif self.pools[ns] != per_pool:
                self.scale_pool(ns, per_pool)
            self.pools[ns] = per_pool
        self.wait_converged(timeout=max(300.0, 1.0 * pools * per_pool))
        return time.monotonic() - start

    def scale_pool(self, ns: str, replicas: int) -> None:
        self.api.patch(f"/apis/genrm.io/v1alpha1/namespaces/{ns}/genrmpools/judge/scale",
                       {"spec": {"replicas": replicas}}, kind="merge-patch")

    def scale_rs(self, replicas: int, namespace: str = RS_NAMESPACE) -> None:
        self.api.patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/rs/scale",
                       {"spec": {"replicas": replicas}}, kind="merge-patch")

    def deployment_burst(self) -> list[Change]:
        """As many Deployments as pools scaled out by one at once, ``rounds`` times, then to zero."""
        namespaces = [f"{RS_NAMESPACE}-{i}" for i in range(len(self.pools))]
        for ns in namespaces:
            self.create_if_absent("/api/v1/namespaces",
                                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            self.create_if_absent(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns))
        changes: list[Change] = []
        for replicas in range(1, self.rounds + 1):
            def change(ns: str, n: int = replicas) -> Change:
                sent = time.time()
                self.scale_rs(n, ns)
                return Change(ns, "burst", sent)
            changes += list(self.pool.map(change, namespaces))
            self.wait_deployments(set(namespaces), replicas)
        list(self.pool.map(lambda ns: self.scale_rs(0, ns), namespaces))
        return changes

    def create_if_absent(self, path: str, body: JSON) -> None:
        """Create, or keep what a smaller size of the same run created."""
        try:
            self.api.post(path, body)
        except ApiError as err:
            if err.status != 409:
                raise

    def wait_deployments(self, namespaces: set[str], replicas: int) -> None:
        """Until every burst Deployment has its pods (created, not running: they pin to no node)."""
        deadline = time.monotonic() + 120.0
        while True:
            done = {d["metadata"]["namespace"] for d in list(self.deployments.values())
                    if (d.get("status") or {}).get("replicas") == replicas and d["spec"]["replicas"] == replicas}
            if namespaces <= done:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Deployments not scaled to {replicas}: {sorted(namespaces - done)[:5]}")
            time.sleep(0.5)

    def wait_converged(self, timeout: float) -> None:
        """Until every pool serves its replicas with no operation, as the benchmark's pool watch shows
        them. Not by listing the pools: a list of every pool twice a second was the API server's
        largest single request in a storm (a few hundred kilobytes of JSON, up to seconds under
        load), work on the operator's side of the comparison that the Deployment burst never had."""
        deadline = time.monotonic() + timeout
        while True:
            items = list(self.pool_watch.latest.values())
            pending = []
            for pool in items:
                ns, status = pool["metadata"]["namespace"], pool.get("status") or {}
                if ns not in self.pools:
                    continue
                if not (status.get("servingReplicas") == self.pools[ns] and not status.get("operation")
                        and status.get("observedGeneration") == pool["metadata"]["generation"]):
                    pending.append(ns)
            if len(items) >= len(self.pools) and not pending:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"pools not converged after {timeout:.0f}s: {pending[:5]}\n"
                                     f"{self.operator.log_tail(30)}")
            time.sleep(0.5)

    def measure(self, pools: int, per_pool: int) -> Figures:
        figures = Figures("hollow" if self.hollow else "real", pools, per_pool)
        figures.provision_s = self.resize(pools, per_pool)
        time.sleep(3.0)
        # idle
        pid = self.pid
        calls0, cpu0, t0 = self.sidecar_calls(), cpu_seconds(pid), time.time()
        time.sleep(self.idle_s)
        calls1, cpu1, t1 = self.sidecar_calls(), cpu_seconds(pid), time.time()
        figures.cpu_idle = (cpu1 - cpu0) / (t1 - t0)
        figures.sidecar_idle = (calls1 - calls0) / (t1 - t0)
        time.sleep(1.0)  # the audit log is written after the response
        writes, reads = self.audit.operator_calls(t0, t1)
        figures.writes_idle, figures.reads_idle = writes * 60 / (t1 - t0), reads * 60 / (t1 - t0)
        # storm
        changes: list[Change] = []
        rs_replicas = 0
        api_pid = self.local.control_plane.pid("kube-apiserver")
        cpu0, api0, t0 = cpu_seconds(pid), cpu_seconds(api_pid), time.time()
        profiler = self.start_profiler(f"{figures.mode}-{pools}x{per_pool}")
        for _ in range(self.rounds):
            for direction, delta in (("out", 1), ("in", -1)):
                def change(ns: str, kind: str = direction, d: int = delta) -> Change:
                    sent = time.time()
                    self.scale_pool(ns, self.pools[ns] + d)
                    return Change(ns, kind, sent, self.pools[ns] + d)
                futures = [self.pool.submit(change, ns) for ns in self.pools]
                for _ in range(3):
                    rs_replicas += 1
                    changes.append(Change(RS_NAMESPACE, "rs", time.time()))
                    self.scale_rs(rs_replicas)
                    time.sleep(0.3)
                changes += [f.result() for f in futures]
                for ns in self.pools:
                    self.pools[ns] += delta
                self.wait_converged(timeout=max(120.0, 0.5 * pools * per_pool))
        cpu1, api1, t1 = cpu_seconds(pid), cpu_seconds(api_pid), time.time()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            profiler.wait(60)
        calls1b = self.sidecar_calls()
        figures.cpu_storm = (cpu1 - cpu0) / (t1 - t0)
        figures.api_cpu_storm = (api1 - api0) / (t1 - t0)
        figures.sidecar_storm = (calls1b - calls1) / (t1 - t0)
        figures.rss = rss_mb(pid)
        self.scale_rs(0)
        changes += self.deployment_burst()
        time.sleep(1.5)
        writes, _ = self.audit.operator_calls(t0, t1)
        figures.writes_storm = writes * 60 / (t1 - t0)
        pool_changes = sum(1 for c in changes if c.kind in ("out", "in"))
        figures.status_per_op = self.audit.status_writes(t0, t1 + 1.0) / max(1, pool_changes)
        self.reactions(figures, changes)
        figures.publish = self.pod_watch.publish_overheads(t0)
        figures.drain_delete = self.drain_deletes(t0, t1)
        return figures

    def reactions(self, figures: Figures, changes: list[Change]) -> None:
        events = self.audit.read()
        scales: dict[str, list[tuple[float, float]]] = defaultdict(list)  # arrival, answer
        for e in events:
            ref = e.get("objectRef") or {}
            if e["verb"] == "patch" and ref.get("subresource") == "scale" and not Audit.by_operator(e):
                scales[ref.get("namespace", "")].append((e["t"], e["answered"]))
        answers: dict[tuple[str, str], list[float]] = defaultdict(list)
        for e in events:
            ref = e.get("objectRef") or {}
            if Audit.by_operator(e) and e["verb"] in WRITES:
                answers[(ref.get("namespace", ""), "any")].append(e["t"])
            if ref.get("resource") != "pods" or ref.get("subresource"):
                continue
            if Audit.by_operator(e) and e["verb"] in ("create", "patch"):
                answers[(ref.get("namespace", ""), e["verb"])].append(e["t"])
            elif e.get("user", {}).get("username") == RS_USER and e["verb"] == "create":
                answers[(ref.get("namespace", ""), "rs")].append(e["t"])
        for ns_changes in _by_namespace(changes).values():
            arrivals = sorted(a for a in scales[ns_changes[0].namespace] if a[0] >= ns_changes[0].sent - 1.0)
            for i, change in enumerate(ns_changes):
                arrival, answered = next((a for a in arrivals if a[0] >= change.sent - 0.05), (None, math.inf))
                if arrival is None:
                    figures.missed += 1
                    continue
                arrivals = [a for a in arrivals if a[0] > arrival]
                until = ns_changes[i + 1].sent if i + 1 < len(ns_changes) else math.inf
                verb = {"out": "create", "in": "patch", "rs": "rs", "burst": "rs"}[change.kind]
                first = next((t for t in sorted(answers[(change.namespace, verb)]) if arrival <= t < until), None)
                if first is None:
                    figures.missed += 1
                    continue
                seconds = first - arrival
                {"out": figures.react_out, "in": figures.react_in, "rs": figures.rs_react,
                 "burst": figures.rs_burst}[change.kind].append(seconds)
                if change.kind in ("out", "in"):
                    figures.react.append(seconds)
                    self.split(figures, change, arrival, answered, first, answers[(change.namespace, "any")])

    def split(self, figures: Figures, change: Change, arrival: float, answered: float, action: float,
              requests: list[float]) -> None:
        """One pool reaction cut at the scale's answer, its delivery to the pool watch and the operator's
        first request after that answer (`SPLIT`); left out when the watch did not show it."""
        delivered = self.pool_watch.delivered(change.namespace, change.replicas, answered - 0.005)
        first = next((t for t in sorted(requests) if answered <= t <= action), None)
        if delivered is None or first is None:
            return
        # Watchers get the commit while the API server is still finishing the answer, so the watch can
        # show it a few milliseconds before the audit's answer stamp: the cut is the earlier of the two.
        committed = min(answered, delivered)
        for part, seconds in zip(SPLIT, (action - arrival, committed - arrival, delivered - committed,
                                         first - delivered, action - first), strict=True):
            figures.split[part].append(seconds)

    def request_costs(self, writes: int, last: Figures) -> tuple[str, str]:
        """The API server's CPU per request on a pool reaction's path, and what a storm needs of it.

        ``writes`` requests of each kind per round, alternated for `WRITE_ROUNDS` rounds with the
        operator stopped, so that nothing else writes; each kind's median round, in milliseconds:

        * a pool status write the operator's way (a PUT of the status alone: `status_update`) beside
          a merge patch of only what changed, the way it wrote before; each changes one condition's
          message, as a step that only reports does (one pool of the last size);
        * a scale request, the user's side of a reaction (that pool, one replica up or down);
        * a pod create (pods the benchmark's own, left to no scheduler).

        The first line compares the two status writes. The second adds up, for the last size's
        pools (``last``), what a storm's scale-out needs of the API server before its last pool
        can act: every pool's scale, decision write and create (``critical_cpu_s``, seconds of one
        core). Divided by the cores the API server gets while those requests come in, it is a floor
        under the slowest reactions however fast the operator is; where the storm keeps the API
        server busy throughout (hollow 50x20), the table's ``api_cpu_storm`` is that share.
        Everything else the storm asks of it (later status writes, pod status, Events, watches)
        comes on top."""
        self.operator.stop()
        namespace = "bench-0"
        status_path = f"/apis/genrm.io/v1alpha1/namespaces/{namespace}/genrmpools/judge/status"
        pid = self.local.control_plane.pid("kube-apiserver")
        pool = self.api.get(status_path)
        replicas = pool["spec"]["replicas"]
        pod_spec = deployment()["spec"]["template"]["spec"]  # labels of their own: no ReplicaSet adopts them
        created = 0

        def status(pool: JSON, i: int) -> JSON:
            first, *rest = pool["status"]["conditions"]
            return {**pool["status"], "conditions": [{**first, "message": f"write {i}"}, *rest]}

        def put(i: int) -> None:
            nonlocal pool
            pool = self.api.request("PUT", status_path, status_update(pool, status(pool, i)))

        def merge_patch(i: int) -> None:
            nonlocal pool
            body = {"metadata": {"resourceVersion": pool["metadata"]["resourceVersion"]},
                    "status": {"conditions": status(pool, i)["conditions"]}}
            pool = self.api.patch(status_path, body, kind="merge-patch")

        def scale(i: int) -> None:
            self.scale_pool(namespace, replicas + i % 2)

        def create(_: int) -> None:
            nonlocal created
            self.api.post(f"/api/v1/namespaces/{RS_NAMESPACE}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"cost-{created}", "labels": {"app": "bench-cost"}},
                "spec": {**pod_spec, "schedulerName": "genrm-bench-none"}})
            created += 1

        kinds: dict[str, Callable[[int], None]] = {
            "put": put, "merge_patch": merge_patch, "scale": scale, "create": create}
        cost: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(WRITE_ROUNDS):
            for kind, send in kinds.items():
                pool = self.api.get(status_path)  # after the scale requests' new versions
                cpu0 = cpu_seconds(pid)
                for i in range(writes):
                    send(i)
                cost[kind].append((cpu_seconds(pid) - cpu0) * 1000 / writes)
        ms = {kind: statistics.median(rounds) for kind, rounds in cost.items()}
        critical = last.pools * (ms["scale"] + ms["put"] + ms["create"]) / 1000
        return (f"operator-bench-write: writes={2 * writes * WRITE_ROUNDS} put_cpu_ms={ms['put']:.2f} "
                f"merge_patch_cpu_ms={ms['merge_patch']:.2f} put_to_merge_patch={ms['put'] / ms['merge_patch']:.2f}",
                f"operator-bench-floor: pools={last.pools} scale_cpu_ms={ms['scale']:.2f} "
                f"status_write_cpu_ms={ms['put']:.2f} pod_create_cpu_ms={ms['create']:.2f} "
                f"critical_cpu_s={critical:.3f}")

    def drain_deletes(self, start: float, end: float) -> list[float]:
        agent = self.local.agent
        if agent.hollow is None:
            return []
        drained = agent.hollow.stats()["drainedAt"]
        out = []
        for e in self.audit.read():
            ref = e.get("objectRef") or {}
            if (Audit.by_operator(e) and e["verb"] == "delete" and ref.get("resource") == "pods"
                    and start <= e["t"] < end + 5):
                address = self.pod_watch.ip_of.get(f"{ref.get('namespace')}/{ref.get('name')}")
                if address and drained.get(address):
                    out.append(e["t"] - drained[address])
        return out


def _by_namespace(changes: list[Change]) -> dict[str, list[Change]]:
    grouped: dict[str, list[Change]] = defaultdict(list)
    for c in sorted(changes, key=lambda c: c.sent):
        grouped[c.namespace].append(c)
    return grouped


def deployment(namespace: str = RS_NAMESPACE) -> JSON:
    """Pods pinned to no node: only the ReplicaSet controller acts on a scale."""
    labels = {"app": "bench-rs"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "rs", "namespace": namespace},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"genrm.io/bench": "nowhere"},
                         "containers": [{"name": "c", "image": "none", "command": ["sleep", "1"]}]}}}}


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        pools, _, per_pool = part.strip().partition("x")
        sizes.append((int(pools), int(per_pool)))
    return sizes


def run(hollow: bool, sizes: list[tuple[int, int]], idle_s: float, rounds: int, keep: Path | None,
        writes: int, profile: Path | None = None) -> list[Figures]:
    most = max(p * (r + 1) for p, r in sizes)
    nodes, gpus = (1, most + 16) if hollow else (max(1, math.ceil((most + 2) / 8)), 8)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as work_dir:
        work = Path(work_dir)
        (work / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        audit = Audit(work / "audit.log")
        args = [f"--audit-policy-file={work / 'audit-policy.json'}", f"--audit-log-path={audit.path}",
                "--audit-log-format=json", "--audit-log-maxbackup=1", "--audit-log-maxsize=2000"]
        with LocalCluster(nodes=nodes, gpus_per_node=gpus, hollow=hollow, apiserver_args=args,
                          crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"]) as local:
            bench = Bench(local, audit, work, hollow, idle_s, rounds, profile)
            bench.start()
            results = []
            try:
                for pools, per_pool in sizes:
                    figures = bench.measure(pools, per_pool)
                    results.append(figures)
                    print(table([figures]).splitlines()[1], flush=True)
                    print(figures.split_line(), flush=True)
                for line in bench.request_costs(writes, results[-1]):
                    print(line, flush=True)
            finally:
                bench.stop()
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    mode = "hollow" if hollow else "real"
                    for log in (audit.path, bench.operator.log_path, *local.control_plane.logs.values()):
                        if log.exists():
                            shutil.copy(log, keep / f"{mode}-{log.name}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.operator_storm", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=os.environ.get("SIZES") or "",
                        help="PxR,... (pools x replicas per pool); default 10x5,50x20 hollow, 5x3,20x3 real")
    parser.add_argument("--hollow", action="store_true", help="hollow replicas only")
    parser.add_argument("--real", action="store_true", help="real simulator pods only")
    parser.add_argument("--idle-seconds", type=float, default=float(os.environ.get("IDLE_SECONDS", 30)))
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", 2)))
    parser.add_argument("--writes", type=int, default=int(os.environ.get("WRITES", 200)),
                        help="requests of each kind per round when measuring the API server's cost per request")
    parser.add_argument("--keep", type=Path,
                        help="copy the API server's audit log, the operator's log and the control plane's logs here")
    parser.add_argument("--profile", type=Path,
                        help="sample the operator with py-spy through each storm into DIR/<mode>-<PxR>.txt")
    args = parser.parse_args(argv)
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    modes = [True] if args.hollow else [False] if args.real else [False, True]
    results: list[Figures] = []
    for hollow in modes:
        sizes = parse_sizes(args.sizes or ("10x5,50x20" if hollow else "5x3,20x3"))
        results += run(hollow, sorted(sizes, key=lambda s: s[0] * s[1]), args.idle_seconds, args.rounds, args.keep,
                       args.writes, args.profile)
    print()
    print(table(results))
    for line in growth(results):
        print(line)
    misses = sum(f.missed for f in results)
    if misses:
        print(f"note: {misses} scale changes without a matched answer in the audit log")
    largest = max(results, key=lambda f: (f.mode == "hollow", f.replicas))
    print(largest.split_line())
    print(largest.burst_line())
    print(largest.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

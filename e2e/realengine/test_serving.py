"""One pool of real SGLang replicas, through its life: load, disconnects, scaling under load, faults.

The tests run in order on one pool (each real replica costs ~40 s of a core to start, so the lane
shares them): what the gateway reports as the engine's load is what SGLang itself reports; a client
that disconnects aborts its own request in SGLang and no other; a scale 1 -> 2 -> 1 under unmodified
clients with long generations in flight loses nothing (the drain waits for SGLang to be idle); a
SIGKILLed engine comes back and serves; a deleted pod is drained, and SGLang stops within the shutdown
slack the operator gives it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from genrm_contract.sidecar import REVISION_HEADER
from genrm_operator.core.children import SHUTDOWN_SLACK_SECONDS
from genrm_operator.core.names import JUDGE_REVISION_LABEL, VERIFICATION_MESSAGE_ANNOTATION
from genrm_testing import realengine

from ..harness import Cluster, OperatorProcess, account_plain, plain_report, wait_for
from ..plainclients import PlainClients
from ..test_soak import CONTROL_PORT, TRAFFIC_PORT, engine_pid
from .lane import ENGINE, LANE, in_pod, real_pool_manifest, started_pods

pytestmark = pytest.mark.timeout(600)

NAMESPACE = "real-serving"
POOL = "judge"
LONG_TOKENS = 600
"""A generation of ~3-5 s on this machine: long enough to be in flight while something happens."""
HELD_TOKENS = 1800
"""A generation of ~10-15 s (the tiny model's context is 2,048): for a test that needs requests still
running until it ends them, on a CI machine where 600 tokens have finished before a 20 s wait saw them."""


@pytest.fixture(scope="module")
def pool(cluster: Cluster, operator: OperatorProcess, models: Path) -> Iterator[str]:
    """The module's pool of one real replica, with SGLang logging each finished request."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    manifest = real_pool_manifest(POOL, NAMESPACE, models, engine={"extraArgs": [
        *realengine.CPU_ARGS, "--log-requests", "--log-requests-level", "2"]})  # the prompts' texts, logged
    cluster.kubectl("apply", "-f", "-", input=manifest)
    cluster.wait_serving(NAMESPACE, POOL, 1, timeout=300)
    published_only_once_ready(cluster, f"{POOL}-0")
    yield NAMESPACE
    LANE.replicas += started_pods(cluster, NAMESPACE)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def published_only_once_ready(cluster: Cluster, pod: str) -> None:
    """The operator published ``pod`` no earlier than SGLang declared itself ready (its warm-up done),
    to the second both record."""
    events = json.loads(cluster.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                        "reason=ReplicaPublished", "-o", "json"))["items"]
    stamps = [e.get("eventTime") or e.get("lastTimestamp") or e["firstTimestamp"] for e in events
              if pod in (e.get("message") or e.get("note") or "")]
    assert stamps, events
    published = datetime.datetime.strptime(stamps[0][:19], "%Y-%m-%dT%H:%M:%S")
    engine_log = Path(cluster.local.logs_for(pod, NAMESPACE)["engine"]).read_text(errors="replace")
    assert published >= log_time(engine_log, "The server is fired up and ready to roll"), (published, stamps)


def live_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(NAMESPACE, POOL) if not p["metadata"].get("deletionTimestamp")]


def the_pod(cluster: Cluster) -> dict[str, Any]:
    pods = live_pods(cluster)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def engine_series(pid: int, name: str) -> float:
    """One of SGLang's own series, summed over its label sets, read inside the pod."""
    total = 0.0
    for line in in_pod(pid, f"{ENGINE}/metrics").splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def gateway_series(ip: str, name: str) -> float | None:
    text = httpx.get(f"http://{ip}:{CONTROL_PORT}/metrics", timeout=5).text
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


class LongStreams:
    """Streamed native generations of ``tokens``, each on its own connection to its own address
    (``targets``: request id -> base URL), with the id in the prompt (so SGLang's request log names it).
    Each is one of the lane's requests; one that ends in an error is a failed one (one the test cuts
    on purpose is not)."""

    def __init__(self, targets: dict[str, str], tokens: int = LONG_TOKENS) -> None:
        self.targets = targets
        self.length = tokens
        rids = list(targets)
        self.tokens: dict[str, int] = {}
        self.errors: dict[str, str] = {}
        self.started = threading.Barrier(len(rids) + 1)
        self.cut: dict[str, threading.Event] = {rid: threading.Event() for rid in rids}
        self.threads = [threading.Thread(target=self._run, args=(rid,), daemon=True) for rid in rids]

    def __enter__(self) -> LongStreams:
        for t in self.threads:
            t.start()
        self.started.wait(60)
        return self

    def __exit__(self, *exc: object) -> None:
        for event in self.cut.values():
            event.set()
        for t in self.threads:
            t.join(60)
        LANE.requests += len(self.targets)
        LANE.failed += len(self.errors)

    def join(self, timeout: float = 60.0) -> None:
        for t in self.threads:
            t.join(timeout)

    def _run(self, rid: str) -> None:
        body = {"text": f"Judge request {rid}.", "rid": rid, "stream": True,
                "sampling_params": {"max_new_tokens": self.length, "temperature": 0, "ignore_eos": True}}
        first = True
        try:
            with httpx.Client(timeout=60) as client, \
                    client.stream("POST", f"{self.targets[rid]}/generate", json=body) as answer:
                if answer.status_code != 200:
                    self.errors[rid] = f"HTTP {answer.status_code}: {answer.read()!r}"
                    return
                for line in answer.iter_lines():
                    if first:
                        first = False
                        self.started.wait(60)
                    if self.cut[rid].is_set():
                        return  # leaving the block closes the connection: a client gone mid-answer
                    if line.startswith("data: {"):
                        self.tokens[rid] = json.loads(line[6:])["meta_info"]["completion_tokens"]
        except Exception as exc:  # every failure is the test's to report
            self.errors[rid] = repr(exc)
        finally:
            if first:
                self.started.abort()


def test_every_answer_names_the_judge_revision_sglang_reports(cluster: Cluster, pool: str) -> None:
    """Provenance with the real engine: the operator starts SGLang with ``--weight-version`` set to the
    pod's judge revision, and SGLang reports that value where a trainer reads it, beside the gateway's
    header."""
    url = cluster.service_answering(pool, POOL)
    revision = the_pod(cluster)["metadata"]["labels"][JUDGE_REVISION_LABEL]
    body = {"text": "Judge: is 2+2=4?", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    with httpx.Client(base_url=url, timeout=60) as client:
        native = client.post("/generate", json=body)
        chat = client.post("/v1/chat/completions", json={
            "model": client.get("/v1/models").json()["data"][0]["id"], "max_tokens": 8,
            "messages": [{"role": "user", "content": "Judge: is 2+2=4?"}]})
        info = client.get("/model_info")
    LANE.requests += 2
    assert native.status_code == chat.status_code == info.status_code == 200, (native.text, chat.text, info.text)
    assert [a.headers.get_list(REVISION_HEADER) for a in (native, chat, info)] == [[revision]] * 3
    assert native.json()["meta_info"]["weight_version"] == revision
    assert chat.json()["metadata"]["weight_version"] == revision
    assert info.json()["weight_version"] == revision


def test_the_load_the_gateway_reports_is_the_engines_own(cluster: Cluster, pool: str) -> None:
    url = cluster.service_answering(pool, POOL)
    pod = the_pod(cluster)
    pid, ip = engine_pid(pod), pod["status"]["podIP"]
    assert pid is not None
    with LongStreams({f"load-{i}": url for i in range(3)}, tokens=HELD_TOKENS) as streams:
        def both() -> tuple[float, float | None]:
            return engine_series(pid, "sglang:num_running_reqs"), gateway_series(ip, "genrm_engine_running_requests")
        wait_for("engine and gateway to report 3 running (with each stream's tokens so far)",
                 lambda: (*both(), dict(streams.tokens)), timeout=20, interval=0.2,
                 done=lambda seen: seen[0] == 3 and seen[1] == 3)
        loads = json.loads(in_pod(pid, f"{ENGINE}/v1/loads"))
        assert sum(rank["num_running_reqs"] for rank in loads["loads"]) == 3, loads
    wait_for("both to report the engine idle once the clients left", both, timeout=20, interval=0.2,
             done=lambda pair: pair[0] == 0 and pair[1] == 0)


def test_a_client_disconnect_aborts_its_own_request_in_the_engine_and_no_other(cluster: Cluster, pool: str) -> None:
    url = cluster.service_answering(pool, POOL)
    pod = the_pod(cluster)
    pid = engine_pid(pod)
    assert pid is not None
    aborted_before = engine_series(pid, "sglang:num_aborted_requests_total")
    leaver, stayer = f"leaver-{os.getpid()}", f"stayer-{os.getpid()}"
    with LongStreams({leaver: url, stayer: url}) as streams:
        wait_for("both answers under way", lambda: min(streams.tokens.get(leaver, 0), streams.tokens.get(stayer, 0)),
                 timeout=20, interval=0.05, done=lambda n: n > 0)
        streams.cut[leaver].set()
        streams.threads[1].join(60)
    assert streams.errors == {}, streams.errors
    assert streams.tokens[stayer] == LONG_TOKENS, streams.tokens
    assert streams.tokens[leaver] < LONG_TOKENS, streams.tokens
    wait_for("SGLang to count one aborted request",
             lambda: engine_series(pid, "sglang:num_aborted_requests_total") - aborted_before,
             timeout=15, interval=0.2, done=lambda n: n == 1)
    # The gateway gives each engine request its own rid; SGLang's request log ties it to the prompt.
    engine_log = Path(cluster.local.logs_for(pod["metadata"]["name"], NAMESPACE)["engine"]).read_text(errors="replace")
    rids = {who: re.findall(rf"Receive: obj=GenerateReqInput\(rid='([^']+)'.*Judge request {who}\.", engine_log)
            for who in (leaver, stayer)}
    assert len(rids[leaver]) == 1 and len(rids[stayer]) == 1, rids
    finished = set(re.findall(r"Finish: obj=GenerateReqInput\(rid='([^']+)'", engine_log))
    assert rids[stayer][0] in finished and rids[leaver][0] not in finished, (rids, engine_log[-3000:])


@contextmanager
def plain_clients(cluster: Cluster, pool: str) -> Iterator[PlainClients]:
    """The unmodified clients through the Service, counted into the suite's and the lane's figures
    however the block ends."""
    plain = cluster.plain_clients(pool, POOL)
    try:
        with plain:
            yield plain
    finally:
        account_plain(plain)
        LANE.requests += plain.stats.total_sent
        LANE.failed += plain.stats.failed


def verified_against_a_reference(cluster: Cluster, pod: str) -> None:
    """``pod`` was published after its answers were compared with a serving replica's (its annotation)."""
    annotations = next(p for p in cluster.pods(NAMESPACE, POOL) if p["metadata"]["name"] == pod)["metadata"]
    message = (annotations.get("annotations") or {}).get(VERIFICATION_MESSAGE_ANNOTATION, "")
    assert "identical to the reference" in message, annotations
    LANE.verified += 1


def test_scale_one_two_one_under_plain_clients_and_long_generations_loses_nothing(cluster: Cluster, pool: str) -> None:
    with plain_clients(cluster, pool) as plain:
        wait_for("every plain client served", lambda: plain.ok_everywhere(2), timeout=60)
        cluster.scale(pool, POOL, 2)
        cluster.wait_serving(pool, POOL, 2, timeout=300)
        verified_against_a_reference(cluster, f"{POOL}-1")
        wait_for("every plain client served by two", lambda: plain.ok_everywhere(10), timeout=60)
        # Long generations in flight on each replica (sent to each pod's gateway, so the victim has its
        # share whichever it is) while one of them is chosen, drained and deleted.
        addresses = cluster.pod_addresses(pool, POOL)
        targets = {f"scale-in-{name}-{i}": f"http://{ip}:{TRAFFIC_PORT}" for name, ip in addresses.items()
                   for i in range(2)}
        with LongStreams(targets) as streams:
            cluster.scale(pool, POOL, 1)
            streams.join(120)
        cluster.wait_serving(pool, POOL, 1, timeout=300)
    assert plain.stats.failed == 0, plain_report(plain)
    assert streams.errors == {} and set(streams.tokens.values()) == {LONG_TOKENS}, (streams.errors, streams.tokens)
    victim = (set(addresses) - {the_pod(cluster)["metadata"]["name"]}).pop()
    victim_log = Path(cluster.local.logs_for(victim, NAMESPACE)["engine"]).read_text(errors="replace")
    assert f"Judge request scale-in-{victim}-" in victim_log, "the victim served its long generations"


def test_a_sigkilled_engine_restarts_and_serves_again(cluster: Cluster, pool: str) -> None:
    pod = the_pod(cluster)
    pid = engine_pid(pod)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the node agent restarts the container, as a kubelet does
    wait_for("the replica to leave the Service's ready endpoints", lambda: cluster.serving_replicas(pool, POOL),
             timeout=30, interval=0.2, done=lambda n: n == 0)
    cluster.wait_serving(pool, POOL, 1, timeout=300)
    assert engine_pid(the_pod(cluster)) not in (None, pid)
    with plain_clients(cluster, pool) as plain:
        wait_for("every plain client served by the restarted engine", lambda: plain.ok_everywhere(2), timeout=60)
    assert plain.stats.failed == 0, plain_report(plain)


def log_time(log: str, marker: str) -> datetime.datetime:
    """When SGLang logged the last line containing ``marker`` (its lines start ``[YYYY-mm-dd HH:MM:SS]``)."""
    stamps = re.findall(rf"^\[([0-9-]+ [0-9:]+)\] .*{re.escape(marker)}", log, re.M)
    assert stamps, f"SGLang never logged {marker!r}:\n{log[-3000:]}"
    return datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S")


def test_a_deleted_pod_drains_and_its_engine_stops_within_the_shutdown_slack(cluster: Cluster, pool: str) -> None:
    """SGLang drains itself on SIGTERM and exits (here 8-12 s after it): it must be gone by itself, with
    its own last line logged, well inside the slack the pod's grace period leaves after the drain."""
    name = the_pod(cluster)["metadata"]["name"]
    log = Path(cluster.local.logs_for(name, NAMESPACE)["engine"])
    cluster.kubectl("delete", "pod", name, "-n", pool, "--wait=true", timeout=400)
    # The container's log spans its restarts: only the last engine's lines count.
    engine_log = log.read_text(errors="replace").rpartition("The server is fired up and ready to roll")[2]
    took = log_time(engine_log, "Finished server process") - log_time(engine_log, "SIGTERM received")
    assert 0 <= took.total_seconds() < SHUTDOWN_SLACK_SECONDS / 2, (took, engine_log[-3000:])
    cluster.wait_serving(pool, POOL, 1, timeout=300)

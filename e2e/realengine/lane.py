"""The real-engine lane's pool manifest and its closing figures.

A real-engine pool is the example a user running SGLang on CPU would start from
(examples/genrmpool-sglang-cpu.yaml): the default engine image and launcher, SGLang's CPU switches
through `spec.engine.env` and `spec.engine.extraArgs`, the model from a hostPath volume, and greedy
verification (SGLang refuses deterministic inference on its CPU attention backend, and ignores a
request's sampling seed without it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrm_testing import realengine

from ..harness import Cluster


@dataclass
class LaneFigures:
    """Figures of the closing `real-engine-summary` line."""

    replicas: int = 0
    """Real engine replicas the lane's pools started."""
    requests: int = 0
    failed: int = 0
    verified: int = 0
    """Replicas the operator verified against a serving real one and published."""
    differences_listed: int = 0
    unlisted_differences: int = 0

    @contextmanager
    def request(self) -> Iterator[None]:
        """One request the lane sends: counted, and counted as failed unless its block completes."""
        self.requests += 1
        try:
            yield
        except BaseException:
            self.failed += 1
            raise

    def line(self) -> str:
        return (f"real-engine-summary: replicas={self.replicas} requests={self.requests} failed={self.failed} "
                f"verified={self.verified} differences_listed={self.differences_listed} "
                f"unlisted_differences={self.unlisted_differences}")


LANE = LaneFigures()

ENGINE = "http://127.0.0.1:30000"
"""spec.engine.port's default; the engine binds the pod's loopback."""


def real_pool_manifest(name: str, namespace: str, models: Path, replicas: int = 1, model: str = "tiny-judge",
                       **spec: Any) -> str:
    """The example pool of SGLang on CPU (`realengine.EXAMPLE`) with ``models`` as its node's model
    directory; ``spec`` replaces top-level spec fields, and ``engine`` is merged into the example's."""
    body = realengine.example()
    body["metadata"] = {"name": name, "namespace": namespace}
    pool = body["spec"]
    pool["replicas"] = replicas
    pool["model"]["path"] = f"{pool['template']['volumeMounts'][0]['mountPath']}/{model}"
    pool["template"]["volumes"][0]["hostPath"]["path"] = str(models)
    # SGLang stamps its log in local time; the lane reads those stamps beside the API server's UTC ones.
    pool["engine"]["env"].append({"name": "TZ", "value": "UTC"})
    pool["engine"].update(spec.pop("engine", {}))
    pool.update(spec)
    return json.dumps(body)


_FETCH = """
import json, sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1], headers=json.loads(sys.argv[3]))
try:
    answer = urllib.request.urlopen(request, timeout=float(sys.argv[2]))
except urllib.error.HTTPError as refused:
    answer = refused
print(answer.status)
print(answer.read().decode())
"""


def in_pod(pid: int, url: str, headers: dict[str, str] | None = None, status: int = 200,
           timeout: float = 10.0) -> str:
    """GET ``url`` from inside the network namespace of process ``pid`` (a container's) and return the
    body, asserting it answered ``status``: the engine binds the pod's loopback only, so its own view
    (``/metrics``, ``/v1/loads``, its own key check) is read there."""
    done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", _FETCH, url, str(timeout),
                           json.dumps(headers or {})], capture_output=True, text=True, timeout=timeout + 5)
    if done.returncode != 0:
        raise AssertionError(f"GET {url} in the namespace of {pid} failed: {done.stderr[-400:]}")
    code, _, body = done.stdout.partition("\n")
    assert int(code) == status, f"GET {url} in the namespace of {pid}: {code} (expected {status}): {body[:400]}"
    return body


def started_pods(cluster: Cluster, namespace: str) -> int:
    """Pods of ``namespace`` the node agent started (each ran a real engine): the lane's replica count."""
    return len(list((cluster.local.workdir / "pods").glob(f"{namespace}_*")))

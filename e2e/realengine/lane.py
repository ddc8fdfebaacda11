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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrm_testing import realengine


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

    def line(self) -> str:
        return (f"real-engine-summary: replicas={self.replicas} requests={self.requests} failed={self.failed} "
                f"verified={self.verified} differences_listed={self.differences_listed} "
                f"unlisted_differences={self.unlisted_differences}")


LANE = LaneFigures()


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
    pool["engine"].update(spec.pop("engine", {}))
    pool.update(spec)
    return json.dumps(body)


def in_pod(pid: int, url: str, timeout: float = 10.0) -> str:
    """GET ``url`` from inside the network namespace of process ``pid`` (a container's): the engine
    binds the pod's loopback only, so its own view (``/metrics``, ``/v1/loads``) is read there."""
    fetch = ("import sys, urllib.request; "
             "print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())")
    done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", fetch, url, str(timeout)],
                          capture_output=True, text=True, timeout=timeout + 5)
    if done.returncode != 0:
        raise AssertionError(f"GET {url} in the namespace of {pid} failed: {done.stderr[-400:]}")
    return done.stdout

"""``make dev``: the operator on a local embedded cluster with a simulated pool.

Builds or reuses the control-plane binaries (``hack/control-plane.sh``, run by
the Makefile), starts the local cluster, installs the CRD, runs the operator,
applies ``examples/genrmpool-sim.yaml``, waits until the pool is Available and
prints what to try. Ctrl-C stops everything cleanly. ``--engine sglang``
(``make dev ENGINE=sglang``) runs real SGLang on CPU instead: it installs or
reuses the engine's environment and tiny models (``genrm_testing.realengine``),
maps SGLang's image to them and applies ``examples/genrmpool-sglang-cpu.yaml``.
``--cluster kind`` does the same on kind with images built from the Dockerfile,
where Docker exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from genrm_testing import realengine

from genrm_cluster.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "genrm.io_genrmpools.yaml"
EXAMPLE = REPO / "examples" / "genrmpool-sim.yaml"
VERSION = "0.1.0"
"""Image tag built by `make images` (the project version) and the chart's appVersion."""


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def wait_available(kubectl: list[str], stop: threading.Event, timeout: float = 180.0) -> dict[str, Any]:
    """Poll the demo pool until Available with its requested serving replicas (or Ctrl-C)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        done = subprocess.run([*kubectl, "get", "genrmpool", "demo", "-o", "json"], capture_output=True, text=True)
        if done.returncode == 0:
            pool: dict[str, Any] = json.loads(done.stdout)
            status = pool.get("status") or {}
            available = any(c.get("type") == "Available" and c.get("status") == "True"
                            for c in status.get("conditions") or [])
            if available and status.get("servingReplicas") == pool["spec"]["replicas"]:
                return pool
        time.sleep(1)
    raise SystemExit("interrupted" if stop.is_set() else
                     "the demo pool did not become Available in time; see the operator log")


def real_engine() -> tuple[dict[str, Path], str]:
    """The image map and the pool manifest of real SGLang on CPU, installing its environment if needed."""
    step("installing or reusing SGLang 0.5.23 for CPU and the tiny models (cold: ~4 min, 7 GB)")
    env = realengine.environment()
    pool = realengine.example()
    pool["spec"]["template"]["volumes"][0]["hostPath"]["path"] = str(realengine.models(env))
    return {realengine.IMAGE: env}, json.dumps(pool)


def run_local(engine: str) -> int:
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    images, manifest = real_engine() if engine == "sglang" else ({}, EXAMPLE.read_text())
    example = realengine.EXAMPLE if engine == "sglang" else EXAMPLE
    step("starting the local control plane with the GenRMPool CRD, kube-proxy and a node agent "
         "(2 nodes x 8 nvidia.com/gpu)")
    stop = threading.Event()
    # Explicit handlers: a shell that starts `make dev` in the background leaves SIGINT ignored,
    # and Ctrl-C must stop everything cleanly however it was started.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with LocalCluster(nodes=2, gpus_per_node=8, crds=[CRD], images=images) as cluster:
        kubectl = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        step("starting the operator (log: operator.log in the cluster work dir)")
        log_path = cluster.workdir / "operator.log"
        with open(log_path, "ab") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "genrm_operator", "--metrics-host", "127.0.0.1"],
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT)
        try:
            step(f"applying {example.relative_to(REPO)}")
            subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True)
            step("waiting for the pool to become Available")
            pool = wait_available(kubectl, stop, timeout=600 if engine == "sglang" else 180)
            url = cluster.service_url("default", "demo")
            model = pool["spec"]["model"].get("servedName") or pool["spec"]["model"]["path"]
            print(f"""
The pool is Available; its Service answers at {url} (kube-proxy; the address stays on this host).

  export KUBECONFIG={cluster.kubeconfig}
  export PATH={cluster.bin_dir}:$PATH
  kubectl get genrmpools
  kubectl scale genrmpool demo --replicas=3
  kubectl describe genrmpool demo
  curl -s {url}/generate -H 'Content-Type: application/json' -d '{{"text": "Is 2+2=4? Score 1-10."}}'
  {sys.executable} -c 'import openai; c = openai.OpenAI(base_url="{url}/v1", api_key="none"); \\
    print(c.chat.completions.create(model="{model}", max_tokens=16, \\
                                    messages=[{{"role": "user", "content": "Is 2+2=4?"}}]))'

Operator metrics: http://127.0.0.1:8080/metrics   Operator log: {log_path}
Press Ctrl-C to stop everything.
""", flush=True)
            while not stop.is_set() and operator.poll() is None:
                stop.wait(1)
            if operator.poll() is not None:
                print(f"the operator exited with {operator.returncode}; see {log_path}", file=sys.stderr)
                return 1
        finally:
            step("stopping the operator and the cluster")
            operator.terminate()
            try:
                operator.wait(15)
            except subprocess.TimeoutExpired:
                operator.kill()
    return 0


def run_kind() -> int:
    """kind with images from the Dockerfile and the Helm chart; needs a Docker engine and kind."""
    missing = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    if missing or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print(f"CLUSTER=kind needs a running Docker engine and kind on PATH (missing: {missing or ['docker engine']}); "
              "use the default local cluster instead: make dev", file=sys.stderr)
        return 2
    steps = [
        ["make", "-C", str(REPO), "images"],
        ["kind", "create", "cluster", "--name", "genrm"],
        *[["kind", "load", "docker-image", f"genrm/{t}:{VERSION}", "--name", "genrm"]
          for t in ("operator", "gateway", "sim")],
        ["helm", "upgrade", "--install", "genrm-operator", str(REPO / "charts" / "genrm-operator"), "--wait"],
        ["kubectl", "apply", "-f", str(EXAMPLE)],
        ["kubectl", "wait", "genrmpool/demo", "--for=condition=Available", "--timeout=300s"],
    ]
    for command in steps:
        step(" ".join(command))
        subprocess.run(command, check=True)
    step("pool Available on kind; try: kubectl get genrmpools; kubectl scale genrmpool demo --replicas=3")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make dev", description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--cluster", choices=("local", "kind"), default="local")
    parser.add_argument("--engine", choices=("sim", "sglang"), default="sim",
                        help="the simulator, or real SGLang on CPU with a tiny model (local cluster only)")
    args = parser.parse_args(argv)
    return run_local(args.engine) if args.cluster == "local" else run_kind()


if __name__ == "__main__":
    sys.exit(main())

"""`LocalCluster`: the control plane plus the node agent, as one context manager.

Why one object: tests, `genrm-cluster up` and `make dev` all want the same thing — a working
cluster, its kubeconfig, kubectl, pod logs — and the same clean teardown (pods, network
namespaces, control-plane processes, work dir), whatever goes wrong in between.

    with LocalCluster(nodes=1, gpus_per_node=8) as c:
        c.kubectl("apply", "-f", "pool.yaml")
        print(c.kubeconfig, c.logs_for("demo-0"))
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from genrm_cluster.controlplane import ControlPlane
from genrm_cluster.kubeapi import KubeAPI
from genrm_cluster.nodeagent import NodeAgent, NodeConfig

log = logging.getLogger("genrm_cluster")


class LocalCluster:
    """A local Kubernetes cluster: real control plane, pods as processes in network namespaces.

    `workdir` defaults to a fresh dir under /dev/shm and is removed on exit unless `keep_workdir`
    (or env GENRM_KEEP_WORKDIR=1) is set, so logs can be inspected after a failure.
    """

    def __init__(
        self,
        nodes: int = 1,
        gpus_per_node: int = 8,
        workdir: Path | None = None,
        bin_dir: Path | None = None,
        keep_workdir: bool | None = None,
    ) -> None:
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="genrm-cluster-", dir=base))
        self.keep_workdir = (os.environ.get("GENRM_KEEP_WORKDIR") == "1"
                             if keep_workdir is None else keep_workdir)
        self.control_plane = ControlPlane(self.workdir, bin_dir)
        self.node_configs = [NodeConfig(f"node-{i + 1}", gpus=gpus_per_node) for i in range(nodes)]
        self._agent: NodeAgent | None = None

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (system:masters)."""
        return self.control_plane.kubeconfig

    @property
    def bin_dir(self) -> Path:
        return self.control_plane.bin_dir

    @property
    def api(self) -> KubeAPI:
        return self.control_plane.api

    @property
    def agent(self) -> NodeAgent:
        if self._agent is None:
            raise RuntimeError("cluster not started")
        return self._agent

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; output captured as text."""
        return subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                              check=check, input=input, capture_output=True, text=True, timeout=timeout)

    def logs_for(self, pod: str, namespace: str = "default") -> dict[str, Path]:
        """Container name → log file of the newest pod with that name run by the agent."""
        return self.agent.log_paths(namespace, pod)

    def start(self) -> None:
        try:
            self.control_plane.start()
            log.info("control plane up; kubeconfig %s", self.kubeconfig)
            self._agent = NodeAgent(self.api, self.node_configs, self.workdir)
            self._agent.start()
            self._wait_schedulable()
        except BaseException:
            self.stop()
            raise

    def _wait_schedulable(self, timeout: float = 60.0) -> None:
        """Until the node lifecycle controller has lifted the not-ready taint from every node.

        A new Node is registered with ``node.kubernetes.io/not-ready:NoSchedule``; pods created
        before the controller removes it would sit Pending, which callers would misread.
        """
        names = {n.name for n in self.node_configs}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = [n for n in self.api.get("/api/v1/nodes").get("items", []) if n["metadata"]["name"] in names]
            tainted = [n for n in nodes if any(t.get("key") == "node.kubernetes.io/not-ready"
                                               for t in n.get("spec", {}).get("taints") or [])]
            if len(nodes) == len(names) and not tainted:
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes {sorted(names)} still not schedulable after {timeout:g}s")

    def stop(self) -> None:
        """Kill pods and remove their network, stop the control plane, remove the work dir."""
        if self._agent is not None:
            self._agent.stop()
            self._agent = None
        self.control_plane.stop()
        if self.keep_workdir:
            log.info("work dir kept: %s", self.workdir)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

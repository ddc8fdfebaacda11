"""`LocalCluster`: the pod network, the control plane, kube-proxy and the node agent, as one
context manager.

Why one object: tests, `genrm-cluster up` and `make dev` all want the same thing — a working
cluster, its kubeconfig, kubectl, pod logs, Service ClusterIPs that answer — and the same clean
teardown (pods, network namespaces, kube-proxy's rules, control-plane processes, work dir),
whatever goes wrong in between.

    with LocalCluster(nodes=1, gpus_per_node=8) as c:
        c.kubectl("apply", "-f", "pool.yaml")
        print(c.kubeconfig, c.logs_for("demo-0"), c.service_url("default", "demo"))
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from genrm_cluster.controlplane import ControlPlane
from genrm_cluster.imagestore import ImageStore
from genrm_cluster.kubeapi import KubeAPI
from genrm_cluster.netns import PodNetwork
from genrm_cluster.nodeagent import NodeAgent, NodeConfig
from genrm_cluster.serviceproxy import ServiceProxy

log = logging.getLogger("genrm_cluster")


class LocalCluster:
    """A local Kubernetes cluster: real control plane, pods as processes in network namespaces.

    `crds` (YAML files) are installed before the controller manager starts (controlplane.py says
    why). `workdir` defaults to a fresh dir under /dev/shm and is removed on exit unless `keep_workdir`
    (or env GENRM_KEEP_WORKDIR=1) is set, so logs can be inspected after a failure. `images` maps an
    image name to a directory whose `bin` its containers find first on PATH (podspec.py); with an
    `image_store`, a container whose image is in it runs from that image (imagestore.py, contain.py).
    """

    def __init__(
        self,
        nodes: int = 1,
        gpus_per_node: int = 8,
        workdir: Path | None = None,
        bin_dir: Path | None = None,
        keep_workdir: bool | None = None,
        crds: Sequence[Path] = (),
        hollow: bool = False,
        apiserver_args: Sequence[str] = (),
        images: Mapping[str, Path] | None = None,
        image_store: ImageStore | None = None,
    ) -> None:
        base = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="genrm-cluster-", dir=base))
        self.keep_workdir = (os.environ.get("GENRM_KEEP_WORKDIR") == "1"
                             if keep_workdir is None else keep_workdir)
        self.control_plane = ControlPlane(self.workdir, bin_dir, apiserver_args)
        self.node_configs = [NodeConfig(f"node-{i + 1}", gpus=gpus_per_node, pods=max(110, gpus_per_node + 10),
                                        hollow=hollow) for i in range(nodes)]
        self.network = PodNetwork()
        self.crds = tuple(crds)
        self.images = dict(images or {})
        self.image_store = image_store
        self._agent: NodeAgent | None = None
        self._proxy: ServiceProxy | None = None

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

    def service_url(self, namespace: str, name: str, port_name: str = "http") -> str:
        """`http://<ClusterIP>:<port>` of a Service, only if its address stays on this host.

        Refuses (RuntimeError) unless the host routes the ClusterIP into this cluster's service
        range via its router namespace (netns.py), so nothing ever dials an address that could
        leave the machine.
        """
        svc = self.api.get(f"/api/v1/namespaces/{namespace}/services/{name}")
        address = svc["spec"].get("clusterIP", "")
        port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name", "") == port_name)
        if not address or address == "None" or not self.network.service_route_in_place(address):
            raise RuntimeError(f"refusing to dial Service {namespace}/{name} at {address!r}: not routed "
                               f"into this cluster's service range {self.network.service_cidr} "
                               f"via {self.network.router_ip} on {self.network.bridge}")
        return f"http://{address}:{port}"

    def start(self) -> None:
        """Network slot first: it decides the service range the apiserver is started with."""
        try:
            self.network.setup()
            self.control_plane.start(self.network.service_cidr, self.crds)
            log.info("control plane up; kubeconfig %s", self.kubeconfig)
            self._agent = NodeAgent(self.api, self.node_configs, self.workdir, self.network, self.images,
                                    self.image_store)
            self._agent.start()
            assert self.network.router is not None
            self._proxy = ServiceProxy(
                self.bin_dir, self.workdir, self.network.router, self.control_plane.api_port,
                functools.partial(self.control_plane.client_kubeconfig, "kube-proxy", "system:kube-proxy"),
                node=self.node_configs[0].name, cluster_cidr=str(self.network.network))
            self._proxy.start()
            self.api.post("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                          self._proxy.api_endpoint_slice())
            log.info("kube-proxy up; services %s via %s", self.network.service_cidr, self.network.router_ip)
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
        """Kill pods, stop kube-proxy and the control plane, remove the network and the work dir."""
        if self._agent is not None:
            self._agent.stop()
            self._agent = None
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        self.control_plane.stop()
        self.network.teardown()
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

"""A node agent that plays the kubelet for one or more Nodes of the local cluster.

Why: there is no container runtime here, yet the operator must see real scheduling, pod phases,
readiness, EndpointSlices and graceful deletion. The agent:

* registers each Node with capacity/allocatable cpu, memory, pods and `nvidia.com/gpu`
  (the scheduler does the GPU accounting), a Ready condition, and the pod-network bridge address
  as InternalIP; renews each node's Lease in `kube-node-lease` every 10 s and the Ready heartbeat
  every 60 s, so the node lifecycle controller never taints it;
* lists and watches pods bound to its nodes (pods on other nodes are ignored) and runs each in a
  `PodRunner` (see podrunner.py for processes, probes, hooks; netns.py for the network);
* reports status through the pods/status subresource (with the pod's UID, so a status for an
  old pod can never land on a new pod of the same name);
* on `deletionTimestamp` stops the pod gracefully, then deletes the object with
  gracePeriodSeconds=0 and a UID precondition, as a kubelet does.
"""

from __future__ import annotations

import datetime
import logging
import platform
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from genrm_cluster.hollow import HollowNode, HollowPod
from genrm_cluster.imagestore import ImageStore
from genrm_cluster.kubeapi import JSON, ApiError, KubeAPI
from genrm_cluster.netns import PodNetwork
from genrm_cluster.podrunner import PodRunner, now_rfc3339

log = logging.getLogger("genrm_cluster.agent")

KUBELET_VERSION = "v1.36.3"
LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10.0
HEARTBEAT_SECONDS = 60.0


@dataclass(frozen=True)
class NodeConfig:
    """What one node advertises."""

    name: str
    gpus: int = 8
    cpu: str = "32"
    memory: str = "128Gi"
    pods: int = 110
    hollow: bool = False
    """Run no containers: one process answers for all its pods' sidecars and engines (hollow.py)."""


def _micro_now() -> str:
    """Now in the MicroTime format a Lease's renewTime requires (conditions use plain seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    """Registers `nodes` and runs the pods bound to them until `stop()`."""

    def __init__(self, api: KubeAPI, nodes: list[NodeConfig], workdir: Path, network: PodNetwork,
                 images: Mapping[str, Path] | None = None, image_store: ImageStore | None = None) -> None:
        self.api = api
        self.images = dict(images or {})
        self.image_store = image_store
        self.nodes = {n.name: n for n in nodes}
        self.workdir = workdir
        self.network = network
        self.runners: dict[str, PodRunner | HollowPod] = {}  # by pod UID
        self.hollow: HollowNode | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Register the nodes (on the caller's pod network) and start heartbeats and the pod watch."""
        for node in self.nodes.values():
            self._register(node)
        if any(n.hollow for n in self.nodes.values()):
            self.hollow = HollowNode(self.network, self.workdir)
            self.hollow.start()
        for target, name in ((self._heartbeat_loop, "node-heartbeat"), (self._watch_loop, "pod-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Kill every pod (no hooks: the whole cluster is going away); the caller owns the network."""
        self._stop.set()
        if self.hollow is not None:
            self.hollow.stopping = True
        with self._lock:
            runners = list(self.runners.values())
        for runner in runners:
            runner.kill()
        for runner in runners:
            runner.finished.wait(10.0)
        if self.hollow is not None:
            self.hollow.stop()

    def log_paths(self, namespace: str, name: str) -> dict[str, Path]:
        """Container name → log file of the newest pod with that name (also after it finished)."""
        with self._lock:
            matches = [r for r in self.runners.values()
                       if r.pod["metadata"]["namespace"] == namespace and r.pod["metadata"]["name"] == name]
        return matches[-1].log_paths() if matches else {}

    # --- nodes ----------------------------------------------------------------------------------

    def _register(self, node: NodeConfig) -> None:
        body: JSON = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": {
                "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true",
                "genrm.io/local-cluster": "true",
            }},
        }
        try:
            created = self.api.post("/api/v1/nodes", body)
        except ApiError as err:
            if err.status != 409:
                raise
            created = self.api.get(f"/api/v1/nodes/{node.name}")
        resources = {"cpu": node.cpu, "memory": node.memory, "pods": str(node.pods),
                     "nvidia.com/gpu": str(node.gpus), "ephemeral-storage": "100Gi"}
        self.api.patch(f"/api/v1/nodes/{node.name}/status", {"status": {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": self.network.host_ip},
                          {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": node.name, "systemUUID": node.name, "bootID": node.name,
                "kernelVersion": platform.release(), "osImage": "genrm local node agent",
                "containerRuntimeVersion": "genrm-process://0.1", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
            "conditions": self._conditions(),
        }})
        lease: JSON = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node.name, "namespace": "kube-node-lease", "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": node.name,
                "uid": created["metadata"]["uid"]}]},
            "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS,
                     "renewTime": _micro_now()},
        }
        try:
            self.api.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        except ApiError as err:
            if err.status != 409:
                raise
        log.info("node %s registered (%d GPUs, InternalIP %s)", node.name, node.gpus, self.network.host_ip)

    @staticmethod
    def _conditions() -> list[JSON]:
        """A healthy kubelet's node conditions: no pressure of any kind, and Ready."""
        now = now_rfc3339()
        states = [(t, "False", f"KubeletHasNo{t}", "") for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        states.append(("Ready", "True", "KubeletReady", "local node agent is ready"))
        return [{"type": t, "status": status, "reason": reason, "message": message,
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
                for t, status, reason, message in states]

    def _heartbeat_loop(self) -> None:
        since_status = 0.0
        while not self._stop.wait(LEASE_RENEW_SECONDS):
            since_status += LEASE_RENEW_SECONDS
            for name in self.nodes:
                try:
                    self.api.patch(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}",
                                   {"spec": {"renewTime": _micro_now()}}, kind="merge-patch")
                    if since_status >= HEARTBEAT_SECONDS:
                        self.api.patch(f"/api/v1/nodes/{name}/status",
                                       {"status": {"conditions": self._conditions()}})
                except Exception:
                    log.exception("node %s: heartbeat failed", name)
            if since_status >= HEARTBEAT_SECONDS:
                since_status = 0.0

    # --- pods -----------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        path = "/api/v1/pods"
        selector = {"fieldSelector": "spec.nodeName!="}
        while not self._stop.is_set():
            try:
                listing = self.api.get(path, params=selector)
                seen = {p["metadata"]["uid"] for p in listing["items"]}
                for pod in listing["items"]:
                    self._on_pod("ADDED", pod)
                with self._lock:
                    gone = [r for uid, r in self.runners.items() if uid not in seen]
                for runner in gone:
                    self._on_pod("DELETED", runner.pod)
                rv = listing["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    for event in self.api.watch(path, rv, selector, timeout_seconds=60):
                        if event["type"] == "ERROR":
                            raise ApiError(event["object"].get("code", 500), str(event["object"]))
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self._on_pod(event["type"], event["object"])
                        if self._stop.is_set():
                            return
            except Exception as err:
                if not self._stop.is_set():
                    log.info("pod watch restarting: %s", err)
                    self._stop.wait(1.0)

    def _on_pod(self, event: str, pod: JSON) -> None:
        """React to one pod event: start a runner, begin graceful deletion, or kill."""
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            runner = self.runners.get(uid)
            if runner is None and event != "DELETED":
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    if pod["metadata"].get("deletionTimestamp"):
                        self._delete_object(pod)
                    return
                runner = self._new_runner(pod)
        if runner is None:
            return
        if event == "DELETED":
            runner.kill()
        elif pod["metadata"].get("deletionTimestamp"):
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            if not runner.deleting:
                runner.deleting = True
                threading.Thread(target=self._finish_deletion, args=(runner, grace), daemon=True).start()

    def _new_runner(self, pod: JSON) -> PodRunner | HollowPod:
        meta = pod["metadata"]
        if self.hollow is not None and self.nodes[pod["spec"]["nodeName"]].hollow:
            hollow = self.runners[meta["uid"]] = self.hollow.runner(pod, self._report_status)
            hollow.start()
            return hollow
        pod_dir = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        runner = PodRunner(self.api, pod, self.network, pod_dir, self._report_status, self.images,
                           self.image_store)
        self.runners[meta["uid"]] = runner
        log.info("pod %s/%s: starting on %s, logs in %s", meta["namespace"], meta["name"],
                 pod["spec"]["nodeName"], pod_dir / "logs")
        runner.start()
        return runner

    def _finish_deletion(self, runner: PodRunner | HollowPod, grace: float) -> None:
        runner.terminate(grace)
        runner.finished.wait()
        if not self._stop.is_set():
            self._delete_object(runner.pod)

    def _delete_object(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("pod %s/%s: delete failed: %s", meta["namespace"], meta["name"], err)

    def _report_status(self, pod: JSON, status: JSON) -> bool:
        """Patch pods/status; False means "try again on the next tick"."""
        meta = pod["metadata"]
        try:
            self.api.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                           {"metadata": {"uid": meta["uid"]}, "status": status})
        except ApiError as err:
            if err.status in (404, 409, 422):
                return True  # the pod (or this incarnation of it) is gone: nothing left to report
            log.warning("pod %s/%s: status update failed: %s", meta["namespace"], meta["name"], err)
            return False
        except httpx.HTTPError as err:
            log.warning("pod %s/%s: status update failed: %s", meta["namespace"], meta["name"], err)
            return False
        return True

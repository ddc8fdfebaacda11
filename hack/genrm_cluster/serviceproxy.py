"""kube-proxy for the local cluster, so Service ClusterIPs work like on a real node.

Why a router namespace instead of the host's netfilter: kube-proxy owns one fixed nftables table
per network namespace, so two local clusters on one host (tests run a second one; engineers share
machines) would overwrite each other's rules, and rules left in the host by a crashed run would
outlive it. Each slot's kube-proxy therefore runs in that slot's router namespace
(`genrm<slot>-proxy`, see netns.py), which the host and the pods reach over the bridge for the
slot's service range: it DNATs a ClusterIP to a ready endpoint and masquerades (`masqueradeAll`),
so the pod answers through the router, which reverses the translation. Deleting the namespace
removes every rule kube-proxy made; the host's own nftables and iptables are never touched.

kube-proxy must reach the apiserver, which listens on the host's 127.0.0.1 only, so a relay
thread accepts on 127.0.0.1 inside the router namespace and connects to the apiserver on the
host's loopback (TLS passes through untouched; the serving certificate covers 127.0.0.1). Pods reach
it the way they do on a real node, through the `kubernetes` Service: a second relay accepts on the
router's own address, and the Service's EndpointSlice (`api_endpoint_slice`) names that address, so
kube-proxy sends the Service's ClusterIP there (the serving certificate covers the ClusterIP).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
from genrm_testing.waiting import WaitTimeout, wait_for

from genrm_cluster import procutil
from genrm_cluster.netns import PodNetns

CLONE_NEWNET = 0x40000000
START_TIMEOUT = 60.0

#: Writes a kubeconfig for kube-proxy's identity pointing at the given server URL; returns its path.
KubeconfigWriter = Callable[[str], Path]


class ServiceProxyError(RuntimeError):
    """kube-proxy did not come up; the message carries its log tail."""


def listen_in_netns(netns: str, address: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP listener on ``address`` (a free port by default) inside `netns`, usable from this process.

    A socket keeps the namespace it was created in, so a short-lived thread enters the namespace
    (setns affects the calling thread only), creates the socket and ends; the rest of the process
    never changes namespace.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def create() -> None:
        try:
            with open(f"/run/netns/{netns}", "rb") as target:
                if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            made.append(socket.create_server((address, port)))
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=create, name=f"setns-{netns}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class Relay:
    """Accepts on a listener and pipes each connection to `target` on the host's loopback."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self.listener, self.target = listener, target
        self.port: int = listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="apiserver-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return  # listener closed
            try:
                outbound = socket.create_connection(self.target, timeout=5.0)
            except OSError:
                inbound.close()
                continue
            outbound.settimeout(None)
            for src, dst in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy until EOF or error, then close both ends (the other pipe thread then ends too)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class ServiceProxy:
    """kube-proxy (nftables mode) in the router namespace `router`; see the module docstring."""

    def __init__(self, bin_dir: Path, workdir: Path, router: PodNetns, api_port: int,
                 kubeconfig_for: KubeconfigWriter, node: str, cluster_cidr: str) -> None:
        self.bin_dir, self.workdir, self.router = bin_dir, workdir, router
        self.api_port, self.kubeconfig_for = api_port, kubeconfig_for
        self.node, self.cluster_cidr = node, cluster_cidr
        self.log = workdir / "logs" / "kube-proxy.log"
        self.healthz = f"http://{router.ip}:10256/healthz"
        self._relay: Relay | None = None
        self._pods_relay: Relay | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the relay and kube-proxy; return once kube-proxy reports its rules synced."""
        self._relay = Relay(listen_in_netns(self.router.name), ("127.0.0.1", self.api_port))
        self._relay.start()
        self._pods_relay = Relay(listen_in_netns(self.router.name, self.router.ip, self.api_port),
                                 ("127.0.0.1", self.api_port))
        self._pods_relay.start()
        kubeconfig = self.kubeconfig_for(f"https://127.0.0.1:{self._relay.port}")
        config = self.workdir / "kube-proxy.json"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "nftables", "hostnameOverride": self.node,
            "clusterCIDR": self.cluster_cidr, "nftables": {"masqueradeAll": True},
            "healthzBindAddress": f"{self.router.ip}:10256", "metricsBindAddress": "127.0.0.1:10249",
            "nodePortAddresses": [f"{self.router.ip}/32"],
            # Inside a network namespace the global conntrack sysctls are read-only: set none.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "oomScoreAdj": 0,
        }))
        self._proc = procutil.spawn([*self.router.exec_prefix(), str(self.bin_dir / "kube-proxy"),
                                     f"--config={config}", "--v=1"], self.log)
        self._wait_synced()

    def _wait_synced(self) -> None:
        def healthz() -> int:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ServiceProxyError(f"kube-proxy exited with {self._proc.returncode}:\n{self._tail()}")
            return client.get(self.healthz).status_code

        with httpx.Client(timeout=2.0) as client:
            try:
                wait_for(f"kube-proxy healthy at {self.healthz}", healthz, START_TIMEOUT, interval=0.2,
                         done=lambda code: code == 200)
            except WaitTimeout as expired:
                raise ServiceProxyError(f"{expired}:\n{self._tail()}") from None

    def _tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """Stop kube-proxy and the relay; its rules go with the router namespace (netns.py)."""
        if self._proc is not None:
            procutil.stop_group(self._proc, grace_seconds=5.0)
            self._proc = None
        for relay in (self._relay, self._pods_relay):
            if relay is not None:
                relay.stop()
        self._relay = self._pods_relay = None

    def api_endpoint_slice(self) -> dict[str, object]:
        """The `kubernetes` Service's EndpointSlice: the pods' relay to the API server. The API server
        writes none itself here (``--endpoint-reconciler-type=none``: its address is loopback)."""
        return {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes",
                                    "endpointslice.kubernetes.io/managed-by": "genrm-cluster"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.router.ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.api_port, "protocol": "TCP"}],
        }

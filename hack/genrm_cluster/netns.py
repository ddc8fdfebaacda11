"""Pod networking: one Linux network namespace per pod, bridged to the host.

Why: EndpointSlices reject loopback addresses, so pods need real, non-loopback IPs; and the
containers of one pod must share a network (the engine binds 127.0.0.1 and only its sidecar
reaches it), exactly like a real pod. The design:

* A host bridge `genrm<slot>` holds the first address of the slot's private /16
  (slot 0: bridge `genrm0`, 10.244.0.1/16; slot 1: `genrm1`, 10.245.0.1/16; ...). That address is
  also the nodes' InternalIP and the pods' hostIP.
* Each pod gets a namespace `genrm<slot>-<n>` with `lo` up and a veth pair: `eth0` inside with the
  pod IP (10.244.x.y/16), `gv<slot>-<n>` on the bridge. Containers run under `ip netns exec`, so
  processes of one pod talk over 127.0.0.1 and the host (agent probes, operator, tests) reaches
  them at podIP:port through the bridge. Pods reach each other over the bridge.
* Pods get no default route: from inside a pod only the pod subnet and the slot's service range
  are reachable, so nothing can leave the host.
* Services: each slot has its own service range (`10.96.0.0/16` for slot 0, `10.97.0.0/16` for
  slot 1, ...), so concurrent clusters never share a ClusterIP. It is routed, on the host and in
  every pod, onto the bridge via a per-slot router namespace `genrm<slot>-proxy` (the last address
  of the /16, `gv<slot>-proxy` on the bridge) in which kube-proxy programs its rules (see
  serviceproxy.py). The range is confined to the host: the bridge has no uplink, the router has
  no other interface than its veth and a discarding device, and nothing forwards between the
  bridge and any other interface of the host. Deleting the router namespace deletes every rule
  kube-proxy made.
* Inside the router the service range is routed to that device (`svc0`: a dummy device, or an
  ifb device on kernels built without dummy; both discard whatever is routed to them and never
  resolve neighbours). Why: kube-proxy's "no endpoints" reject rules sit in the input, forward
  and output hooks, which a forwarded packet reaches only after a successful route lookup;
  without a route the kernel answers "network unreachable" (ENETUNREACH) where a real node, whose
  default route covers the service range, answers with kube-proxy's reject (ECONNREFUSED). A
  ClusterIP with ready endpoints is DNATed before the lookup and never meets this route; an
  address no Service holds is dropped by kube-proxy or swallowed by `svc0`, so it gets no answer
  from anywhere outside the host.
* A slot is owned through an flock on /run/genrm-cluster/slot-<slot>.lock held for the agent's
  lifetime, so concurrent clusters on one host do not collide. On acquiring a slot, leftovers of a
  crashed run with that slot's name prefix (namespaces and the processes in them, veths, bridge)
  are removed; on release everything is removed again (routes via the bridge go with it).
* Pods cannot reach the apiserver (it listens on the host's 127.0.0.1 only); the project's pods do
  not need it.

Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCK_DIR = Path("/run/genrm-cluster")
MAX_SLOTS = 8


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip <args>` and return stdout; raise `NetworkError` with stderr when `check` fails."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class PodNetns:
    """The network of one pod."""

    name: str
    ip: str
    host_veth: str

    def exec_prefix(self) -> list[str]:
        """Prefix for a command so it runs inside this pod's network namespace."""
        return ["ip", "netns", "exec", self.name]


ROUTER = "proxy"
"""Suffix of the router namespace and veth of a slot (pods are numbered, so no clash)."""
SERVICE_SINK = "svc0"
"""The device the router routes the service range to (see the module docstring)."""
SINK_KINDS = ("dummy", "ifb")
"""Link kinds that discard every packet routed to them (an ifb device drops what tc did not redirect
to it), in order of preference: dummy is the usual choice, ifb stands in on kernels without it."""


class PodNetwork:
    """Owns a slot (bridge + /16) and hands out per-pod namespaces; see the module docstring."""

    def __init__(self) -> None:
        self._lock_file: IO[bytes] | None = None
        self.slot = -1
        self._counter = 0
        self._mutex = threading.Lock()
        self.network = ipaddress.IPv4Network("10.244.0.0/16")
        self.router: PodNetns | None = None

    @property
    def bridge(self) -> str:
        return f"genrm{self.slot}"

    @property
    def host_ip(self) -> str:
        return str(self.network[1])

    @property
    def router_ip(self) -> str:
        """The router namespace's address: the last host address of the slot's /16."""
        return str(self.network[-2])

    @property
    def service_cidr(self) -> str:
        """The slot's service range, given to the apiserver as --service-cluster-ip-range."""
        return f"10.{96 + self.slot}.0.0/16"

    @property
    def api_service_ip(self) -> str:
        """The `kubernetes` Service's ClusterIP: the API server gives its own Service the range's first
        address (pods reach the API server through it, `serviceproxy.ApiRelay`)."""
        return str(ipaddress.ip_network(self.service_cidr)[1])

    def setup(self) -> None:
        """Take a free slot, clean its leftovers, create the bridge, the router and its route."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for slot in range(MAX_SLOTS):
            lock = (LOCK_DIR / f"slot-{slot}.lock").open("wb")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            self._lock_file, self.slot = lock, slot
            break
        else:
            raise NetworkError(f"all {MAX_SLOTS} pod-network slots are in use")
        self.network = ipaddress.IPv4Network(f"10.{244 + self.slot}.0.0/16")
        self._remove_slot_objects()
        # A bridge without an address of its own takes the lowest MAC of its ports and changes it
        # when ports come and go: pods whose ARP entry for the host still holds the address of a
        # deleted pod's veth then send their answers nowhere until the entry expires (clients saw
        # read timeouts whenever a pod was deleted). A fixed, locally administered one never changes.
        ip("link", "add", self.bridge, "address", f"02:67:65:6e:72:{self.slot:02x}", "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/{self.network.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        self.router = self._attach(f"genrm{self.slot}-{ROUTER}", self.router_ip, f"gv{self.slot}-{ROUTER}")
        # Per-namespace settings, so the host's stay untouched. The router forwards back out of the
        # interface a packet came in on; a redirect would tell the sender to bypass its NAT.
        subprocess.run([*self.router.exec_prefix(), "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                        "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0"],
                       check=True, capture_output=True)
        _add_sink(self.router.name)
        ip("-n", self.router.name, "route", "add", self.service_cidr, "dev", SERVICE_SINK)
        ip("route", "replace", self.service_cidr, "via", self.router_ip, "dev", self.bridge)

    def add_pod(self) -> PodNetns:
        """Create a namespace with `lo` up and a veth to the bridge carrying a fresh pod IP."""
        with self._mutex:
            self._counter += 1
            n = self._counter
        pod = self._attach(f"genrm{self.slot}-{n}", str(self.network[n + 1]), f"gv{self.slot}-{n}")
        ip("-n", pod.name, "route", "add", self.service_cidr, "via", self.router_ip)
        return pod

    def next_address(self) -> str:
        """A fresh pod address of the slot without a namespace of its own (hollow pods, hollow.py)."""
        with self._mutex:
            self._counter += 1
            return str(self.network[self._counter + 1])

    def service_route_in_place(self, address: str) -> bool:
        """Whether `address` is in this slot's service range, the host routes it via the router,
        and the router, where no DNAT applies, routes it into its dummy device.

        The harness asks this before dialling a ClusterIP, so a test can never send traffic to
        a service address that might leave the host.
        """
        if self._lock_file is None or self.router is None or ipaddress.IPv4Address(
                address) not in ipaddress.IPv4Network(self.service_cidr):
            return False
        host = ip("-o", "route", "get", address).split()
        inside = ip("-n", self.router.name, "-o", "route", "get", address, check=False).split()
        return (host[:5] == [address, "via", self.router_ip, "dev", self.bridge]
                and inside[:3] == [address, "dev", SERVICE_SINK] and sink_kind(self.router.name) in SINK_KINDS)

    def _attach(self, name: str, address: str, host_veth: str) -> PodNetns:
        """A namespace with `lo` up and `eth0` on the bridge carrying `address`."""
        pod = PodNetns(name, address, host_veth)
        ip("netns", "add", pod.name)
        ip("link", "add", pod.host_veth, "type", "veth", "peer", "name", "eth0", "netns", pod.name)
        ip("link", "set", pod.host_veth, "master", self.bridge, "up")
        ip("-n", pod.name, "addr", "add", f"{pod.ip}/{self.network.prefixlen}", "dev", "eth0")
        ip("-n", pod.name, "link", "set", "eth0", "up")
        ip("-n", pod.name, "link", "set", "lo", "up")
        return pod

    def remove_pod(self, pod: PodNetns) -> None:
        """Kill anything still inside the namespace, then delete it and its veth."""
        _remove_netns(pod.name)
        ip("link", "del", pod.host_veth, check=False)

    def teardown(self) -> None:
        """Remove every object of the slot (the router and its rules too), then release it."""
        if self._lock_file is None:
            return
        self._remove_slot_objects()
        self._lock_file.close()
        self._lock_file = None

    def _remove_slot_objects(self) -> None:
        prefix = f"genrm{self.slot}-"
        for line in ip("netns", "list").splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(prefix):
                _remove_netns(name)
        for line in ip("-o", "link", "show").splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link.startswith(f"gv{self.slot}-"):
                ip("link", "del", link, check=False)
        ip("link", "del", self.bridge, check=False)


def _add_sink(netns: str) -> None:
    """`SERVICE_SINK` in `netns`, up, of the first kind in `SINK_KINDS` the kernel offers."""
    refused: list[str] = []
    for kind in SINK_KINDS:
        try:
            ip("-n", netns, "link", "add", SERVICE_SINK, "type", kind)
        except NetworkError as err:
            refused.append(str(err))
            continue
        ip("-n", netns, "link", "set", SERVICE_SINK, "up")
        return
    raise NetworkError(f"no discarding device for the service range: {'; '.join(refused)}")


def sink_kind(netns: str) -> str | None:
    """The link kind of `SERVICE_SINK` in `netns`; None when it is missing."""
    shown = ip("-n", netns, "-j", "-d", "link", "show", SERVICE_SINK, check=False)
    links = json.loads(shown) if shown.strip() else []
    return str(links[0].get("linkinfo", {}).get("info_kind")) if links else None


def _remove_netns(name: str) -> None:
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)


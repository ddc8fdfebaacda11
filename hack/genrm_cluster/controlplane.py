"""Launcher for a local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Why: CI machines have no Docker, so tests run against real binaries built from Go modules
(hack/control-plane.sh). Everything listens on free 127.0.0.1 ports and lives in one work dir
given by the caller (`LocalCluster` puts it under /dev/shm, so etcd's writes stay in memory);
`stop()` kills every process group. The flags:

* `--advertise-address=127.0.0.1 --endpoint-reconciler-type=none`: no default-route lookup and no
  loopback address written into the `kubernetes` Endpoints (which validation rejects).
* The service range is the network slot's (netns.py), given to `start()`; kube-proxy
  (serviceproxy.py) makes it work.
* kube-controller-manager runs all default controllers (garbage collector, EndpointSlices,
  namespace, ServiceAccount, node lifecycle, ...) with per-controller ServiceAccount credentials.
* CRDs given to `start()` are established before kube-controller-manager starts, as in a cluster
  whose CRDs predate its pods. The controller manager caches API discovery and refreshes it only
  every 30 s; a CRD created after it started is unknown to its disruption controller until then,
  which marks a PodDisruptionBudget over pods owned by such a custom resource
  `CalculateExpectedPodCountFailed` (ALLOWED DISRUPTIONS 0) and does not look again until one of
  the pods or the budget changes.
* Leader election and API priority-and-fairness are off: one instance each, 2 shared cores.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import yaml
from genrm_testing import free_port
from genrm_testing.waiting import WaitTimeout, wait_for

from genrm_cluster import procutil
from genrm_cluster.kubeapi import JSON, ApiError, KubeAPI
from genrm_cluster.pki import PKI, CertPair

REPO_ROOT = Path(__file__).resolve().parents[2]
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT = float(os.environ.get("GENRM_CLUSTER_START_TIMEOUT", "120"))
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message names the component and its log."""


def find_bin_dir() -> Path:
    """Where the binaries are: `GENRM_BIN_DIR`, else whatever hack/control-plane.sh prints.

    The script honours `KUBEBUILDER_ASSETS` and reuses its cache, so this is fast when warm.
    """
    env_dir = os.environ.get("GENRM_BIN_DIR")
    if env_dir:
        return Path(env_dir)
    script = REPO_ROOT / "hack" / "control-plane.sh"
    out = subprocess.run([str(script)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def write_kubeconfig(path: Path, server: str, ca: Path, client: CertPair, user: str) -> Path:
    """Write a kubeconfig that refers to the PEM files (for kubectl and the operator)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: genrm\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {ca}\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate: {client.cert}\n"
        f"    client-key: {client.key}\n"
        f"contexts:\n- name: genrm\n  context:\n    cluster: genrm\n    user: {user}\n"
        "current-context: genrm\n"
    )
    path.chmod(0o600)
    return path


class ControlPlane:
    """Starts and stops one local control plane.

    After `start()`: `kubeconfig` (admin, system:masters), `server`, `api` (a `KubeAPI` as admin),
    `logs` (component name → log file).
    """

    def __init__(self, workdir: Path, bin_dir: Path | None = None, apiserver_args: Sequence[str] = ()) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.apiserver_args = tuple(apiserver_args)
        """Extra kube-apiserver flags (the operator benchmark's audit log), after the defaults."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.logs: dict[str, Path] = {c: self.workdir / "logs" / f"{c}.log" for c in COMPONENTS}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.pki = PKI(self.workdir / "pki")
        self._api: KubeAPI | None = None

    @property
    def api(self) -> KubeAPI:
        if self._api is None:
            raise ControlPlaneError("control plane not started")
        return self._api

    def client_kubeconfig(self, name: str, user: str, server: str) -> Path:
        """A kubeconfig with a fresh client certificate for `user`, talking to `server`."""
        return write_kubeconfig(self.workdir / f"{name}.kubeconfig", server, self.pki.ca.cert,
                                self.pki.client_cert(name, user), name)

    def start(self, service_cidr: str, crds: Sequence[Path] = ()) -> None:
        """Create the PKI, start the four components in order and wait until each is healthy;
        `crds` (YAML files) are established before the controller manager starts."""
        try:
            self._start(service_cidr, crds)
        except BaseException:
            self.stop()
            raise

    def _start(self, service_cidr: str, crds: Sequence[Path]) -> None:
        pki = self.pki
        # The API server gives its own Service the range's first address.
        serving = pki.serving_cert("apiserver", "kube-apiserver", str(ipaddress.ip_network(service_cidr)[1]))
        sa = pki.service_account_keys()
        admin = pki.client_cert("admin", "admin", ("system:masters",))
        write_kubeconfig(self.kubeconfig, self.server, pki.ca.cert, admin, "admin")
        kcm_kc = write_kubeconfig(
            self.workdir / "kcm.kubeconfig", self.server, pki.ca.cert,
            pki.client_cert("kcm", "system:kube-controller-manager"), "kcm",
        )
        sched_kc = write_kubeconfig(
            self.workdir / "scheduler.kubeconfig", self.server, pki.ca.cert,
            pki.client_cert("scheduler", "system:kube-scheduler"), "scheduler",
        )

        etcd_port, etcd_peer = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{etcd_peer}"
        self._launch("etcd", [
            "--name=genrm", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=genrm={peer_url}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=2147483648", "--auto-compaction-retention=1", "--log-level=warn",
        ])
        self._wait_http("etcd", f"{etcd_url}/health", verify=False)

        self._launch("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            f"--api-audiences={SA_ISSUER}",
            f"--service-cluster-ip-range={service_cidr}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            "--enable-aggregator-routing=true",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-priority-and-fairness=false",
            "--profiling=false", "--v=1", *self.apiserver_args,
        ])
        self._wait_http("kube-apiserver", f"{self.server}/readyz",
                        verify=ssl.create_default_context(cafile=str(pki.ca.cert)))
        self._api = KubeAPI(self.server, pki.ca.cert, admin.cert, admin.key)
        for crd in crds:
            self._establish(yaml.safe_load(crd.read_text()))

        for name, kubeconfig, extra in (
            ("kube-controller-manager", kcm_kc, [
                "--controllers=*", "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa.key}", f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                "--kube-api-qps=100", "--kube-api-burst=200",
            ]),
            ("kube-scheduler", sched_kc, []),
        ):
            port = free_port()
            self._launch(name, [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--cert-dir={self.workdir / (name + '-certs')}",
                "--leader-elect=false", "--profiling=false", "--v=1", *extra,
            ])
            self._wait_http(name, f"https://127.0.0.1:{port}/healthz", verify=False)
        self._wait_default_service_account()

    def _establish(self, crd: JSON) -> None:
        """Create a CRD and wait until the apiserver serves it (condition Established)."""
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        name = crd["metadata"]["name"]
        self.api.post(path, crd)
        deadline = time.monotonic() + START_TIMEOUT
        while not any(c["type"] == "Established" and c["status"] == "True"
                      for c in self.api.get(f"{path}/{name}").get("status", {}).get("conditions") or []):
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not established after {START_TIMEOUT}s")
            time.sleep(0.2)

    def pid(self, name: str) -> int:
        """A running component's process id (``kube-apiserver``, ``etcd``, ...): benchmarks read its CPU time."""
        return self._procs[name].pid

    def _launch(self, name: str, args: list[str]) -> None:
        self._procs[name] = procutil.spawn([str(self.bin_dir / name), *args], self.logs[name])

    def _check_alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"{name} exited with {proc.returncode}; log {self.logs[name]}:\n{self._tail(name)}"
            )

    def _tail(self, name: str, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _wait_http(self, name: str, url: str, verify: bool | ssl.SSLContext) -> None:
        """Poll a health URL on loopback until it answers 200 (or the component dies)."""
        def healthy() -> int:
            self._check_alive(name)
            return client.get(url).status_code

        with httpx.Client(verify=verify, timeout=3.0) as client:
            try:
                wait_for(f"{name} healthy at {url}", healthy, START_TIMEOUT, interval=0.2,
                         done=lambda code: code == 200)
            except WaitTimeout as expired:
                raise ControlPlaneError(f"{expired}; log {self.logs[name]}:\n{self._tail(name)}") from None

    def _wait_default_service_account(self) -> None:
        """Pods can only be created once the ServiceAccount controller made `default/default`."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self._check_alive("kube-controller-manager")
            with contextlib.suppress(ApiError):
                self.api.get("/api/v1/namespaces/default/serviceaccounts/default")
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError("ServiceAccount default/default never appeared; log "
                                        f"{self.logs['kube-controller-manager']}")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop components in reverse start order (SIGTERM, SIGKILL after 10 s).

        The work dir belongs to the caller (`LocalCluster` removes it), so logs survive until then.
        """
        if self._api is not None:
            self._api.close()
            self._api = None
        for name in reversed(list(self._procs)):
            procutil.stop_group(self._procs.pop(name), grace_seconds=10.0)

"""The launcher and the node agent against the real control plane.

Pods here run small Python/sh programs; they are reached only at their pod IPs (addresses inside
network namespaces the agent created) or over loopback inside the pod.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from genrm_cluster.cluster import LocalCluster
from genrm_cluster.kubeapi import ApiError
from genrm_cluster.netns import SERVICE_SINK, SINK_KINDS, ip, sink_kind
from genrm_testing import waiting

pytestmark = pytest.mark.cluster

JSON = dict[str, Any]


def pod_manifest(name: str, container: JSON, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 10, "containers": [{"image": "none", **container}],
                 **spec},
    }


def create(cluster: LocalCluster, manifest: JSON) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def get_pod(cluster: LocalCluster, name: str) -> JSON:
    return cluster.api.get(f"/api/v1/namespaces/default/pods/{name}")


def wait_for(cluster: LocalCluster, pod: str, what: str, check: Callable[[], bool],
             timeout: float = 30.0) -> None:
    """Poll `check` (a refused or failed connection is "not yet"); on timeout fail with the last
    answer or error, the pod object and its container logs."""
    try:
        waiting.wait_for(f"pod {pod} {what}", check, timeout, interval=0.3)
        return
    except waiting.WaitTimeout as expired:
        last = str(expired)
    try:
        state = json.dumps(get_pod(cluster, pod).get("status"), indent=1)
    except ApiError as err:
        state = str(err)
    logs = "\n".join(f"--- {c} ({p}):\n{p.read_text()[-2000:]}"
                     for c, p in cluster.logs_for(pod).items() if p.exists())
    pytest.fail(f"{last}\nstatus: {state}\n{logs}")


def volume_dir(cluster: LocalCluster, pod: str, volume: str) -> Path:
    """Where the agent materialised a pod's volume (next to its logs dir)."""
    log = next(iter(cluster.logs_for(pod).values()))
    return log.parent.parent / "volumes" / volume


def condition(pod: JSON, kind: str) -> JSON:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), {})


def test_api_healthy_and_kubectl_works(cluster: LocalCluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    assert "default" in cluster.kubectl("get", "serviceaccounts", "-o", "name").stdout


def test_node_registered_ready_with_gpus(cluster: LocalCluster) -> None:
    node = cluster.api.get("/api/v1/nodes/node-1")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert condition({"status": node["status"]}, "Ready")["status"] == "True"
    assert not node["spec"].get("taints")
    lease = cluster.api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1")
    assert lease["spec"]["holderIdentity"] == "node-1"


def test_readiness_drives_ready_and_endpoints(cluster: LocalCluster) -> None:
    """Ready follows the readiness probe both ways; the Service's EndpointSlice follows Ready."""
    create(cluster, pod_manifest("web", {
        "name": "web",
        "command": ["sh", "-c", "touch /data/ready && exec python3 -m http.server 8080 --directory /data"],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1,
                           "failureThreshold": 1},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }, volumes=[{"name": "data", "emptyDir": {}}]))
    create(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                     "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    wait_for(cluster, "web", "Ready", lambda: condition(get_pod(cluster, "web"), "Ready").get("status") == "True")

    pod = get_pod(cluster, "web")
    pod_ip = pod["status"]["podIP"]
    assert pod["status"]["phase"] == "Running"
    assert pod_ip.startswith("10.") and not pod_ip.startswith("127.")
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    with urllib.request.urlopen(f"http://{pod_ip}:8080/ready", timeout=5) as response:
        assert response.status == 200

    def endpoint_ready() -> bool | None:
        slices = cluster.api.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                                 {"labelSelector": "kubernetes.io/service-name=web"})["items"]
        for endpoint in (e for s in slices for e in s.get("endpoints") or []):
            if pod_ip in endpoint["addresses"]:
                return bool(endpoint["conditions"].get("ready"))
        return None

    wait_for(cluster, "web", "in the EndpointSlice", lambda: endpoint_ready() is True)
    (volume_dir(cluster, "web", "data") / "ready").unlink()
    wait_for(cluster, "web", "NotReady", lambda: condition(get_pod(cluster, "web"), "Ready")["status"] == "False")
    wait_for(cluster, "web", "unready in the EndpointSlice", lambda: endpoint_ready() is False)


def test_a_service_clusterip_answers_from_the_host_and_from_pods(cluster: LocalCluster) -> None:
    """kube-proxy (in the slot's router namespace) forwards a ClusterIP to a ready endpoint."""
    create(cluster, pod_manifest("echo", {
        "name": "echo", "command": ["python3", "-m", "http.server", "8080"],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }))
    create(cluster, pod_manifest("caller", {"name": "caller", "command": ["sleep", "3600"]}))
    create(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
                     "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80,
                                                                     "targetPort": 8080}]}})
    wait_for(cluster, "echo", "Ready", lambda: condition(get_pod(cluster, "echo"), "Ready").get("status") == "True")
    wait_for(cluster, "caller", "Running", lambda: get_pod(cluster, "caller")["status"].get("phase") == "Running")
    url = cluster.service_url("default", "echo")
    assert url.startswith("http://10.") and url.endswith(":80")

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False
    wait_for(cluster, "echo", "answering at its ClusterIP from the host", answers)
    caller = next(r.netns for r in cluster.agent.runners.values()
                  if r.pod["metadata"]["name"] == "caller" and r.netns is not None)
    inside = subprocess.run([*caller.exec_prefix(), "python3", "-c",
                             f"import urllib.request; print(urllib.request.urlopen('{url}/', timeout=5).status)"],
                            capture_output=True, text=True, timeout=30)
    assert inside.stdout.strip() == "200", inside.stderr


def test_service_url_refuses_an_address_outside_the_routed_service_range(cluster: LocalCluster) -> None:
    create(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "headless"},
                     "spec": {"clusterIP": "None", "selector": {"app": "none"},
                              "ports": [{"name": "http", "port": 80}]}})
    with pytest.raises(RuntimeError, match="refusing to dial"):
        cluster.service_url("default", "headless")
    assert not cluster.network.service_route_in_place("10.244.0.5")
    assert not cluster.network.service_route_in_place("192.0.2.7")


def test_a_service_without_endpoints_refuses_connections_like_a_real_node(cluster: LocalCluster) -> None:
    """kube-proxy's reject rule answers: ECONNREFUSED from the host and from a pod, as on a real node
    (not ENETUNREACH, which the router gave while it had no route for the service range)."""
    create(cluster, pod_manifest("asker", {"name": "asker", "command": ["sleep", "3600"]}))
    create(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "nobody"},
                     "spec": {"selector": {"app": "nobody"}, "ports": [{"name": "http", "port": 80}]}})
    address, port = cluster.service_url("default", "nobody").removeprefix("http://").split(":")
    outcomes: list[str] = []

    def refused() -> bool:
        outcomes.append(connect_outcome(address, int(port)))
        assert outcomes[-1] in ("ECONNREFUSED", "timeout"), outcomes
        return outcomes[-1] == "ECONNREFUSED"
    # Until kube-proxy has programmed the new Service its address is unknown, which gets no answer.
    wait_for(cluster, "asker", f"refusing connections at {address}:{port} from the host", refused)
    wait_for(cluster, "asker", "Running", lambda: get_pod(cluster, "asker")["status"].get("phase") == "Running")
    asker = next(r.netns for r in cluster.agent.runners.values()
                 if r.pod["metadata"]["name"] == "asker" and r.netns is not None)
    inside = subprocess.run([*asker.exec_prefix(), sys.executable, "-c", CONNECT_PROGRAM, address, port],
                            capture_output=True, text=True, timeout=30)
    assert inside.stdout.strip() == "ECONNREFUSED", inside


def test_an_unknown_service_address_gets_no_answer_from_outside_the_host(cluster: LocalCluster) -> None:
    """An address of the service range that no Service holds is refused by kube-proxy or swallowed
    inside the router namespace: its route ends in the router's discarding device, the router has
    no other way out, and the host's bridge has only this cluster's veths."""
    network = cluster.network
    assert network.router is not None
    taken = {s["spec"].get("clusterIP") for s in cluster.api.get("/api/v1/services")["items"]}
    address = str(ipaddress.ip_network(network.service_cidr)[-2])
    assert address not in taken
    assert network.service_route_in_place(address)
    assert sink_kind(network.router.name) in SINK_KINDS
    router_links = {link["ifname"] for link in json.loads(ip("-n", network.router.name, "-j", "link", "show"))}
    assert router_links == {"lo", "eth0", SERVICE_SINK}
    assert ip("-n", network.router.name, "route", "show", "default").strip() == ""
    routes = ip("-n", network.router.name, "-o", "route", "show").splitlines()
    assert sorted(r.split()[2] for r in routes) == sorted(["eth0", SERVICE_SINK]), routes
    bridge_ports = {link["ifname"] for link in json.loads(ip("-j", "link", "show", "master", network.bridge))}
    assert all(port.startswith(f"gv{network.slot}-") for port in bridge_ports), bridge_ports
    assert connect_outcome(address, 80) in ("ECONNREFUSED", "timeout")


def test_kube_proxy_follows_the_endpointslice_within_its_sync(cluster: LocalCluster) -> None:
    """How long after the EndpointSlice lists an endpoint ready (or not) a client's connect through
    the ClusterIP follows it: kube-proxy's own sync, after the operator's "serving" (which waits for
    the slice). Printed as `kube-proxy-sync:` for docs/state-machine.md; each change must arrive."""
    create(cluster, pod_manifest("synced", {
        "name": "synced",
        "command": ["sh", "-c", "touch /data/ready && exec python3 -m http.server 8080 --directory /data"],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1,
                           "failureThreshold": 1},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }, volumes=[{"name": "data", "emptyDir": {}}]))
    create(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "synced"},
                     "spec": {"selector": {"app": "synced"},
                              "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    address, port = cluster.service_url("default", "synced").removeprefix("http://").split(":")
    wait_for(cluster, "synced", "Ready", lambda: condition(get_pod(cluster, "synced"), "Ready").get("status") == "True")
    marker = volume_dir(cluster, "synced", "data") / "ready"
    marker.unlink()

    def listed() -> bool | None:
        slices = cluster.api.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
                                 {"labelSelector": "kubernetes.io/service-name=synced"})["items"]
        states = [bool(e["conditions"].get("ready")) for s in slices for e in s.get("endpoints") or []]
        return any(states) if states else None

    def follows(ready: bool) -> float:
        """Seconds from the slice's change to the connect's: polled, so within a poll's resolution."""
        waiting.wait_for(f"the slice listing the endpoint {'ready' if ready else 'unready'}",
                         lambda: listed() is ready or (not ready and listed() is None), 30, interval=0.02)
        changed = time.monotonic()
        want = "connected" if ready else "ECONNREFUSED"
        waiting.wait_for(f"a connect through the ClusterIP: {want}",
                         lambda: connect_here(address, int(port)) == want, 30, interval=0.01)
        return time.monotonic() - changed

    added: list[float] = []
    removed: list[float] = []
    for _ in range(4):
        marker.touch()
        added.append(follows(ready=True))
        marker.unlink()
        removed.append(follows(ready=False))
    print(f"\nkube-proxy-sync: rounds={len(added)} add_p50_s={sorted(added)[len(added) // 2]:.3f} "
          f"add_max_s={max(added):.3f} remove_p50_s={sorted(removed)[len(removed) // 2]:.3f} "
          f"remove_max_s={max(removed):.3f}")


CONNECT_PROGRAM = """
import errno, socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, str(exc)))
"""


def connect_here(address: str, port: int) -> str:
    """`connect_outcome` in this process, for timing (no interpreter start per try)."""
    with socket.socket() as sock:
        sock.settimeout(2)
        try:
            sock.connect((address, port))
            return "connected"
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))


def connect_outcome(address: str, port: int) -> str:
    """How a TCP connect from the host ends: "connected", "timeout" or the errno's name."""
    done = subprocess.run([sys.executable, "-c", CONNECT_PROGRAM, address, str(port)],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr


def test_env_secret_and_downward_api(cluster: LocalCluster) -> None:
    cluster.kubectl("create", "secret", "generic", "tok", "--from-literal=token=s3cret")
    create(cluster, pod_manifest("envs", {
        "name": "main",
        "command": ["sh", "-c", 'echo "$TOKEN $POD $NS $IP $(cat /etc/tok/token)"; sleep 3600'],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "volumeMounts": [{"name": "tok", "mountPath": "/etc/tok"}],
    }, volumes=[{"name": "tok", "secret": {"secretName": "tok"}}]))
    wait_for(cluster, "envs", "Running", lambda: get_pod(cluster, "envs")["status"].get("phase") == "Running")
    ip = get_pod(cluster, "envs")["status"]["podIP"]
    log = cluster.logs_for("envs")["main"]
    wait_for(cluster, "envs", "logging", lambda: log.exists() and log.read_text().strip() != "")
    assert log.read_text().split() == ["s3cret", "envs", "default", ip, "s3cret"]


def test_prestop_runs_before_sigterm_then_object_deleted(cluster: LocalCluster) -> None:
    program = (
        "import pathlib, signal, sys, time\n"
        "p = pathlib.Path(sys.argv[1])\n"
        "def term(*_):\n"
        "    with p.open('a') as f: f.write('TERM\\n')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "p.open('a').write('START\\n')\n"
        "while True: time.sleep(0.2)\n"
    )
    create(cluster, pod_manifest("hooks", {
        "name": "main", "command": ["python3", "-c", program], "args": ["/events/log"],
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo PRESTOP >> /events/log; sleep 1"]}}},
        "volumeMounts": [{"name": "events", "mountPath": "/events"}],
    }, volumes=[{"name": "events", "emptyDir": {}}]))
    wait_for(cluster, "hooks", "started", lambda: bool(cluster.logs_for("hooks")) and
             (volume_dir(cluster, "hooks", "events") / "log").exists())
    events = volume_dir(cluster, "hooks", "events") / "log"
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "hooks", "--wait=true", timeout=30)
    assert time.monotonic() - started < 9, "deletion should not wait for the whole grace period"
    assert events.read_text().split() == ["START", "PRESTOP", "TERM"]
    with pytest.raises(ApiError) as err:
        get_pod(cluster, "hooks")
    assert err.value.status == 404


def test_a_container_is_stopped_as_a_runtime_stops_it(cluster: LocalCluster) -> None:
    """SIGTERM reaches the container's first process only (a server that forked workers stops them
    itself); what is left of the container is killed once that process exits."""
    program = (
        "import os, pathlib, signal, sys, time\n"
        "events = pathlib.Path(sys.argv[1])\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGTERM, lambda *_: events.open('a').write('WORKER TERM\\n'))\n"
        "    (events.parent / 'worker.pid').write_text(str(os.getpid()))\n"
        "    while True: time.sleep(0.2)\n"
        "signal.signal(signal.SIGTERM, lambda *_: (events.open('a').write('LEADER TERM\\n'), sys.exit(0)))\n"
        "while True: time.sleep(0.2)\n"
    )
    create(cluster, pod_manifest("forked", {
        "name": "main", "command": ["python3", "-c", program], "args": ["/events/log"],
        "volumeMounts": [{"name": "events", "mountPath": "/events"}],
    }, volumes=[{"name": "events", "emptyDir": {}}]))
    wait_for(cluster, "forked", "forked its worker", lambda: bool(cluster.logs_for("forked")) and
             (volume_dir(cluster, "forked", "events") / "worker.pid").exists())
    events = volume_dir(cluster, "forked", "events")
    worker = int((events / "worker.pid").read_text())
    cluster.kubectl("delete", "pod", "forked", "--wait=true", timeout=30)
    assert (events / "log").read_text().split() == ["LEADER", "TERM"], "only the first process is signalled"
    assert not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text().lower()


def test_an_image_root_comes_first_on_path_and_a_host_path_is_the_host_directory(
        cluster: LocalCluster, tmp_path: Path) -> None:
    host = tmp_path / "node-dir"
    (image,) = cluster.images  # the session's tools image (conftest.py)
    pod = pod_manifest("tools", {
        "name": "main", "image": image, "command": ["copy-file"], "args": ["/host/in", "/host/out"],
        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
    }, volumes=[{"name": "host", "hostPath": {"path": str(host), "type": "Directory"}}])
    create(cluster, pod)
    time.sleep(2)  # a missing Directory is the kubelet's FailedMount: the pod waits, nothing runs
    assert get_pod(cluster, "tools")["status"].get("phase") == "Pending"
    assert not any(p.exists() and p.read_text() for p in cluster.logs_for("tools").values())
    host.mkdir()
    (host / "in").write_text("judged")
    wait_for(cluster, "tools", "copied through the image's tool", lambda: (host / "out").exists()
             and (host / "out").read_text() == "judged")


def test_crash_and_liveness_failure_restart(cluster: LocalCluster) -> None:
    create(cluster, pod_manifest("crash", {"name": "main", "command": ["sh", "-c", "sleep 0.5; exit 3"]}))
    create(cluster, pod_manifest("dead", {
        "name": "main", "command": ["python3", "-m", "http.server", "8080"],
        "livenessProbe": {"httpGet": {"path": "/missing", "port": 8080}, "periodSeconds": 1,
                          "failureThreshold": 2, "initialDelaySeconds": 1},
    }, terminationGracePeriodSeconds=1))

    def restarted(name: str) -> bool:
        statuses = get_pod(cluster, name)["status"].get("containerStatuses") or [{}]
        return int(statuses[0].get("restartCount", 0)) >= 1

    wait_for(cluster, "crash", "restarted", lambda: restarted("crash"))
    last = get_pod(cluster, "crash")["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 3
    wait_for(cluster, "dead", "restarted by liveness", lambda: restarted("dead"))


def test_completed_pod_succeeds(cluster: LocalCluster) -> None:
    create(cluster, pod_manifest("job", {"name": "main", "command": ["true"]}, restartPolicy="Never"))
    wait_for(cluster, "job", "Succeeded", lambda: get_pod(cluster, "job")["status"].get("phase") == "Succeeded")


def test_too_many_gpus_is_unschedulable(cluster: LocalCluster) -> None:
    create(cluster, pod_manifest("greedy", {
        "name": "main", "command": ["sleep", "3600"],
        "resources": {"limits": {"nvidia.com/gpu": "9"}},
    }))
    wait_for(cluster, "greedy", "Unschedulable",
             lambda: condition(get_pod(cluster, "greedy"), "PodScheduled").get("reason") == "Unschedulable")
    assert get_pod(cluster, "greedy")["status"]["phase"] == "Pending"
    assert not get_pod(cluster, "greedy")["spec"].get("nodeName")


def test_teardown_leaves_nothing(tmp_path: Path) -> None:
    """A second cluster (own network slot) with a running pod is removed without a trace.

    Checks the exact names this cluster used: another cluster on the host may take the freed
    slot right away and create objects with the same prefix.
    """
    workdir = tmp_path / "cluster"
    host_rules = _host_rules()
    with LocalCluster(workdir=workdir) as second:
        router = second.network.router
        first_service_ip = str(ipaddress.ip_network(second.network.service_cidr)[1])
        assert router is not None and second.network.service_route_in_place(first_service_ip)
        create(second, pod_manifest("sleeper", {"name": "main", "command": ["sleep", "3600"]}))
        wait_for(second, "sleeper", "Running",
                 lambda: get_pod(second, "sleeper")["status"].get("phase") == "Running")
        pid = int(get_pod(second, "sleeper")["status"]["containerStatuses"][0]["containerID"].split("//")[1])
        netns = [r.netns for r in second.agent.runners.values() if r.netns is not None]
        assert netns
    assert not Path(f"/proc/{pid}").exists()
    assert str(workdir) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not workdir.exists()
    for ns in [*netns, router]:
        assert not Path(f"/run/netns/{ns.name}").exists()
        assert not Path(f"/sys/class/net/{ns.host_veth}").exists()
    assert _host_rules() == host_rules, "kube-proxy's rules live and die in the router namespace"


def _host_rules() -> tuple[str, str]:
    """The host's nftables ruleset and iptables rules (kube-proxy must never add any)."""
    nft = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    ipt = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return nft, "\n".join(line for line in ipt.splitlines() if not line.startswith("#"))

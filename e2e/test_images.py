"""The chart as users run it: `helm install` with the images `make images` built, every pod from its image.

Why a cluster of its own: its node agent runs a container whose image is in the project's store from that
image for real (`genrm_cluster.contain`: the image's files as its root, its user, its environment, its
own mount, PID, UTS and IPC namespaces in the pod's network namespace), where the suite's cluster runs the
checkout's code as host processes. Here nothing comes from the checkout: the operator and the activators
run from the operator image and find the API server through the `kubernetes` Service with their
ServiceAccount's token, as in any cluster; a simulator pool's pods run from the gateway and simulator
images. What this proves is what a user's first `helm install` meets: entrypoints, the wheel's files,
the non-root user and the read-only root filesystem, the in-cluster configuration.

`make test` builds the images first (`make images`) and sets GENRM_IMAGES_REQUIRED=1, so a missing image
fails this module rather than skipping it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cluster.cluster import LocalCluster
from genrm_cluster.imagestore import ImageStore, missing

from .harness import REPO, Cluster, account_plain, helm, plain_report, pool_manifest, wait_for

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGES = {target: f"genrm/{target}:{VERSION}" for target in ("operator", "gateway", "sim")}
CHART = REPO / "charts" / "genrm-operator"
RELEASE, RELEASE_NAMESPACE, NAMESPACE = "images", "genrm-system", "judges"


if (_why := missing(IMAGES.values())) is not None:
    pytest.skip(_why, allow_module_level=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One node of 8 GPUs whose agent runs pods from the project's image store."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    store = ImageStore()
    try:
        with LocalCluster(nodes=1, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"],
                          image_store=store) as local:
            yield Cluster(local)
    finally:
        store.close()


def assert_runs_from_its_image(cluster: Cluster, namespace: str, pod: str, container: str) -> None:
    """The container's first process has the image's files as its root and runs as the image's user."""
    pod_dir = cluster.local.logs_for(pod, namespace)[container].parent.parent
    pid = (pod_dir / "containers" / container / "pid").read_text().strip()
    root = os.readlink(f"/proc/{pid}/root")
    uid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("Uid:"))
    assert root.endswith("/root") and str(pod_dir) in root and uid == "10001", (pod, container, root, uid)


def test_the_chart_runs_from_its_images_and_a_pool_scales_with_nothing_lost(cluster: Cluster) -> None:
    started = time.monotonic()
    try:
        helm(cluster, "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
             "--wait", "--timeout", "240s")
    except AssertionError:
        print(cluster.debug_dump(RELEASE_NAMESPACE))
        raise
    installed_s = time.monotonic() - started
    pods = json.loads(cluster.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json"))["items"]
    images = sorted({c["image"] for p in pods for c in p["spec"]["containers"]})
    assert images == [IMAGES["operator"]], images
    assert all(p["status"]["phase"] == "Running" for p in pods), [p["status"] for p in pods]
    for pod in pods:
        for container in pod["spec"]["containers"]:
            assert_runs_from_its_image(cluster, RELEASE_NAMESPACE, pod["metadata"]["name"], container["name"])
    operator = next(p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") != "activator")
    # The operator's own process runs as the image's user, from the image: its log says it reached the API
    # server in-cluster (a host process could not: it has no kubeconfig).
    log = cluster.local.logs_for(operator["metadata"]["name"], RELEASE_NAMESPACE)["operator"].read_text()
    assert "Traceback" not in log, log[-3000:]

    cluster.kubectl("create", "namespace", NAMESPACE)
    engine = {"image": IMAGES["sim"], "command": ["genrm-sim"]}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        "judge", NAMESPACE, replicas=1, engine=engine, gateway={"image": IMAGES["gateway"]}))
    try:
        cluster.wait_serving(NAMESPACE, "judge", 1, timeout=180)
        pod_images = sorted({c["image"] for p in cluster.pods(NAMESPACE, "judge")
                             for c in [*p["spec"]["containers"], *(p["spec"].get("initContainers") or [])]})
        assert pod_images == sorted([IMAGES["gateway"], IMAGES["sim"]]), pod_images
        for pod in cluster.pods(NAMESPACE, "judge"):
            for container in pod["spec"]["containers"]:
                assert_runs_from_its_image(cluster, NAMESPACE, pod["metadata"]["name"], container["name"])
        with cluster.plain_clients(NAMESPACE, "judge") as plain:
            wait_for("first answers from every client", lambda: plain.ok_everywhere(5), timeout=60)
            cluster.scale(NAMESPACE, "judge", 3)
            cluster.wait_serving(NAMESPACE, "judge", 3, timeout=180)
            cluster.scale(NAMESPACE, "judge", 1)
            cluster.wait_serving(NAMESPACE, "judge", 1, timeout=180)
            time.sleep(2)
    except BaseException:
        print(cluster.debug_dump(NAMESPACE))
        print(cluster.debug_dump(RELEASE_NAMESPACE))
        raise
    account_plain(plain)
    assert plain.stats.failed == 0, plain_report(plain)
    history = cluster.pool(NAMESPACE, "judge")["status"]["history"]
    assert [(h["type"], h["outcome"]) for h in history[-2:]] == [("ScaleOut", "Succeeded"), ("ScaleIn", "Succeeded")]

    cluster.kubectl("delete", "genrmpool", "judge", "-n", NAMESPACE, "--wait=true", timeout=180)
    wait_for("the pool's pods gone", lambda: not cluster.pods(NAMESPACE, "judge"), timeout=120)
    helm(cluster, "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", "180s")
    uninstalled = time.monotonic()

    def left() -> str:
        """What is left of the release: the Deployments' pods go by garbage collection, after their stop."""
        return cluster.kubectl("get", "all,secrets,configmaps,serviceaccounts,roles,rolebindings", "-n",
                               RELEASE_NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name") + \
            cluster.kubectl("get", "clusterroles,clusterrolebindings", "-l", f"app.kubernetes.io/instance={RELEASE}",
                            "-o", "name")
    # An idle activator holds nothing, so it stops at once (a held request would keep it up to its deadline).
    wait_for("nothing left of the release", lambda: not left().strip(), timeout=30)
    gone_s = time.monotonic() - uninstalled
    print(f"images-e2e: install_s={installed_s:.1f} requests={plain.stats.total_sent} "
          f"failed={plain.stats.failed} uninstall_gone_s={gone_s:.1f}")

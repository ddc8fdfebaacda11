"""GPU-generation-aware placement against the real scheduler, on nodes labelled with GPU products.

The local cluster's two nodes get GPU feature discovery's ``nvidia.com/gpu.product`` label, one
product each, while the operator runs (its node watch sees the labels arrive). A deterministic
pool grown from nothing ends on one product (a replica the scheduler put on the other one is
replaced before it is verified), and the replicas a scale-out adds land only on the serving
replicas' product, verified against a replica whose node and product their verification names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from .harness import Cluster, pool_manifest, wait_for

LABEL = "nvidia.com/gpu.product"
PRODUCTS = {"node-1": "NVIDIA-H100-80GB-HBM3", "node-2": "NVIDIA-B200"}


@pytest.fixture
def gpu_products(cluster: Cluster) -> Iterator[dict[str, str]]:
    """Each node labelled with a GPU product of its own; the labels go afterwards (other tests place
    pools on both nodes)."""
    for node, product in PRODUCTS.items():
        cluster.kubectl("label", "node", node, "--overwrite", f"{LABEL}={product}")
    yield PRODUCTS
    for node in PRODUCTS:
        cluster.kubectl("label", "node", node, f"{LABEL}-", check=False)


def nodes_of(cluster: Cluster, namespace: str, pool: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods(namespace, pool)
            if not p["metadata"].get("deletionTimestamp")}


def test_new_replicas_of_a_deterministic_pool_land_only_on_the_serving_replicas_gpu_product(
    cluster: Cluster, namespace: str, gpu_products: dict[str, str]
) -> None:
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("gen", namespace, replicas=3))
    pool = cluster.wait_serving(namespace, "gen", 3)
    placed = nodes_of(cluster, namespace, "gen")
    assert len({gpu_products[node] for node in placed.values()}) == 1, placed
    anchor = pool["status"]["placement"]
    product, node = anchor["gpuProduct"], anchor["node"]
    assert gpu_products[node] == product and set(placed.values()) == {node}
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json")
    misplaced = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "ReplicaMisplaced"]
    print(f"\nplacement: {anchor}; replaced before verification: {misplaced}")

    cluster.scale(namespace, "gen", 5)
    cluster.wait_serving(namespace, "gen", 5)
    grown = nodes_of(cluster, namespace, "gen")
    assert set(grown.values()) == {node}, grown
    for pod in cluster.pods(namespace, "gen"):
        name = pod["metadata"]["name"]
        if name in placed:
            continue
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": LABEL, "operator": "In", "values": [product]}]}], name
        verified = pod["metadata"]["annotations"]["genrm.io/verification-message"]
        assert verified.startswith(f"{name} on node {node} (GPU {product}) against {anchor['replica']} on node "
                                   f"{node} (GPU {product}): "), verified
    status = wait_for("the pool at rest", lambda: (s := cluster.pool(namespace, "gen")["status"])
                      and not s.get("operation") and s)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Degraded"]["status"] == "False", conditions["Degraded"]

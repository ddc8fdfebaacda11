"""The Helm chart against the local cluster: server-side dry-run, install, and least-privilege RBAC.

Why run the operator out of the cluster with the chart's ServiceAccount token: the suite's cluster
runs containers as host processes from the checkout, so the chart's Deployment is installed with
replicaCount=0 here (e2e/test_images.py runs the whole chart from its images). The identity is what matters: the
operator process authenticates exactly as the Deployment's pod would, through a token the API
server issues for the chart's ServiceAccount, and the chart's (Cluster)Role is all it may use.
Removing one needed permission from that role must then make the same reconcile fail.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .harness import REPO, Cluster, OperatorProcess, helm, pool_manifest, wait_for

CHART = REPO / "charts" / "genrm-operator"
KUBE_VERSION = "1.36.3"
RELEASE_NAMESPACE = "genrm-system"
_releases = itertools.count(1)


def ensure_namespace(cluster: Cluster, name: str) -> None:
    manifest = cluster.kubectl("create", "namespace", name, "--dry-run=client", "-o", "yaml")
    cluster.kubectl("apply", "-f", "-", input=manifest)


def can_i(cluster: Cluster, service_account: str, verb: str, resource: str, namespace: str) -> bool:
    """What RBAC grants the ServiceAccount (asked as the admin impersonating it)."""
    kind, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, kind, "-n", namespace,
            f"--as=system:serviceaccount:{RELEASE_NAMESPACE}:{service_account}"]
    if subresource:
        args.append(f"--subresource={subresource}")
    return cluster.kubectl(*args, check=False).strip().startswith("yes")


@pytest.mark.parametrize("values", [None, CHART / "ci" / "namespaced-values.yaml"],
                         ids=lambda v: v.name if v else "default")
def test_rendered_chart_passes_server_side_dry_run(cluster: Cluster, values: Path | None) -> None:
    ensure_namespace(cluster, RELEASE_NAMESPACE)
    ensure_namespace(cluster, "judges")
    args = ["template", "dry", str(CHART), "-n", RELEASE_NAMESPACE, "--kube-version", KUBE_VERSION,
            "--set", "grafanaDashboards.enabled=true"]
    if values:
        args += ["--values", str(values)]
    out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=helm(cluster, *args))
    assert "deployment.apps/dry-genrm-operator created (server dry run)" in out


@pytest.fixture
def release(cluster: Cluster) -> Iterator[str]:
    """A fresh install of the chart (CRD, RBAC, ServiceAccount; no operator pod); uninstalled afterwards."""
    name = f"chart{next(_releases)}"
    helm(cluster, "install", name, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
         "--set", "replicaCount=0", "--wait", "--timeout", "60s")
    yield name
    helm(cluster, "uninstall", name, "-n", RELEASE_NAMESPACE, "--wait")


def identity_kubeconfig(cluster: Cluster, service_account: str, path: Path) -> str:
    """A kubeconfig for the cluster that authenticates as the ServiceAccount (TokenRequest API)."""
    token = cluster.kubectl("create", "token", service_account, "-n", RELEASE_NAMESPACE, "--duration=1h").strip()
    config: dict[str, Any] = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    context["context"]["user"] = service_account
    config["users"] = [{"name": service_account, "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def chart_operator(cluster: Cluster, operator: OperatorProcess, namespace: str, release: str,
                   tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator authenticated as the chart's ServiceAccount, while the suite's admin operator is paused.

    The admin operator watches every namespace; left running it would reconcile the pool itself
    and hide a missing permission.
    """
    operator.stop()
    service_account = f"{release}-genrm-operator"
    assert can_i(cluster, service_account, "create", "pods", namespace)
    chart = OperatorProcess(identity_kubeconfig(cluster, service_account, tmp_path / "kubeconfig"), tmp_path)
    yield chart
    chart.stop()
    operator.start()


def reconcile_end_to_end(cluster: Cluster, chart: OperatorProcess, namespace: str, timeout: float) -> None:
    """Create a pool, let it serve, scale it up and back down (create, drain, delete all exercised)."""
    chart.start()
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("judge", namespace, replicas=1))
    try:
        cluster.wait_serving(namespace, "judge", 1, timeout=timeout)
        cluster.scale(namespace, "judge", 2)
        cluster.wait_serving(namespace, "judge", 2, timeout=timeout)
        cluster.scale(namespace, "judge", 1)
        cluster.wait_serving(namespace, "judge", 1, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator (chart identity) log ---\n{chart.log_tail()}") from exc


def test_chart_identity_reconciles_a_pool(cluster: Cluster, chart_operator: OperatorProcess,
                                          namespace: str) -> None:
    reconcile_end_to_end(cluster, chart_operator, namespace, timeout=120)
    # An RBAC denial names the identity; other 403s (e.g. "namespace is being terminated" for an
    # earlier test's pool) are not about the chart's role.
    assert not re.search(r'forbidden: User \\?"system:serviceaccount:', chart_operator.log_path.read_text())


def without(role: dict[str, Any], group: str, resource: str, verb: str) -> dict[str, Any]:
    """The role with one verb taken away from one resource."""
    rules = []
    for rule in role["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            assert rule["apiGroups"] == [group] and rule["resources"] == [resource], rule
            rule = {**rule, "verbs": [v for v in rule["verbs"] if v != verb]}
            if not rule["verbs"]:
                continue  # RBAC rejects an empty verb list: drop the rule instead
        rules.append(rule)
    assert rules != role["rules"], f"{group}/{resource} {verb} is not granted"
    return {**role, "rules": rules}


@pytest.mark.parametrize("group, resource, verb", [
    ("", "pods", "create"),
    ("genrm.io", "genrmpools/status", "update"),
    ("discovery.k8s.io", "endpointslices", "list"),
])
def test_a_removed_permission_breaks_the_reconcile(cluster: Cluster, chart_operator: OperatorProcess,
                                                    namespace: str, release: str, group: str, resource: str,
                                                    verb: str) -> None:
    """Proves the positive test above depends on the chart's role, not on broader credentials."""
    name = f"{release}-genrm-operator"
    role = json.loads(cluster.kubectl("get", "clusterrole", name, "-o", "json"))
    cluster.kubectl("replace", "-f", "-", input=json.dumps(without(role, group, resource, verb)))
    wait_for("the RBAC change to take effect",
             lambda: not can_i(cluster, name, verb, resource, namespace), timeout=30)
    with pytest.raises(AssertionError, match="timed out"):
        reconcile_end_to_end(cluster, chart_operator, namespace, timeout=30)
    log = chart_operator.log_path.read_text()
    denial = rf'forbidden: User \\?"system:serviceaccount:{RELEASE_NAMESPACE}:{name}\\?" cannot {verb} resource'
    assert re.search(denial, log), log[-4000:]

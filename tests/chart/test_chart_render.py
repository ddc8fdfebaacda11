"""The Helm chart, checked with the real helm: lint, rendering, values schema, RBAC and secure defaults.

Cluster-level checks (server-side dry-run, install, reconcile with the chart's identity) live in
e2e/test_chart.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from genrm_operator.api.pool import GROUP, PLURAL, GenRMPoolSpec
from genrm_operator.core.children import pod_manifest
from genrm_operator.core.names import JUDGE_REVISION_LABEL

from .conftest import CHART, KUBE_VERSION, REPO, Manifest, Render, find, run_helm

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACED = CHART / "ci" / "namespaced-values.yaml"
MONITORING = CHART / "ci" / "monitoring-values.yaml"

# Every API call the operator makes (shell/kube.py, kopf's watches, finalizer and event posting).
OPERATOR_RULES: dict[tuple[str, str], set[str]] = {
    (GROUP, PLURAL): {"get", "list", "watch", "patch"},
    (GROUP, f"{PLURAL}/status"): {"update"},
    (GROUP, f"{PLURAL}/scale"): {"patch"},
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},
    ("", "services"): {"get", "list", "watch", "create", "patch"},
    ("", "secrets"): {"get", "list", "watch", "create", "patch"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "events"): {"create"},
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch", "create", "patch", "delete"},
}
"""What the operator calls, the activator's EndpointSlices included (``activator.enabled``, the default)."""
NODE_RULES: dict[tuple[str, str], set[str]] = {("", "nodes"): {"list", "watch"}}
"""The node watch (GPU products for placement): cluster-scoped, so a ClusterRole in every install."""


def granted(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) → verbs, flattened over the role's rules."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def operator_container(manifests: list[Manifest]) -> Manifest:
    deployment = find(manifests, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_helm_lint_strict(helm: Path, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    if values:
        args += ["--values", str(values)]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_template_renders_labelled_objects(render: Render, values: Path | None) -> None:
    manifests = render(*([values] if values else []), monitoring=True)
    kinds = {m["kind"] for m in manifests}
    assert {"Deployment", "ServiceAccount", "Service"} <= kinds
    assert kinds & {"ClusterRole", "Role"}
    for manifest in manifests:
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "genrm", manifest["metadata"]["name"]
        assert labels["helm.sh/chart"] == "genrm-operator-0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("assignment, complaint", [
    ("replicaCount=2", "/replicaCount"),
    ("image.tagg=latest", "'tagg' not allowed"),
    ("operator.metricsPort=0", "/operator/metricsPort"),
    ("watchNamespace=Not_A_Namespace", "/watchNamespace"),
    ("metrics.serviceMonitor.interval=often", "/metrics/serviceMonitor/interval"),
    ("activator.stopMarginSeconds=-1", "/activator/stopMarginSeconds"),
])
def test_values_schema_rejects_mistakes(helm: Path, assignment: str, complaint: str) -> None:
    """helm validates values against values.schema.json on lint, template and install."""
    result = run_helm(helm, "template", str(CHART), "--kube-version", KUBE_VERSION, "--set", assignment)
    assert result.returncode != 0
    assert "schema" in result.stderr and complaint in result.stderr, result.stderr


def test_values_schema_documents_every_key() -> None:
    """values.yaml validates (lint above); here: no key is undeclared or undocumented in the schema."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        assert "description" in node or path == "", f"{path} has no description"
        if node.get("additionalProperties") is False:
            assert isinstance(value, dict)
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


def test_chart_crd_is_the_generated_crd() -> None:
    [chart_crd] = (CHART / "crds").iterdir()
    assert chart_crd.read_text() == (REPO / "crds" / chart_crd.name).read_text()
    check = subprocess.run([sys.executable, "-m", "genrm_operator.crdgen", "--check"], capture_output=True,
                           text=True, cwd=REPO)
    assert check.returncode == 0, check.stdout + check.stderr


def test_app_version_is_the_project_version_and_the_default_tag(render: Render) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart["kubeVersion"] == ">=1.29.0-0"
    assert operator_container(render())["image"] == f"genrm/operator:{project['version']}"
    digest = "sha256:" + "a" * 64
    assert operator_container(render(set=(f"image.digest={digest}",)))["image"] == f"genrm/operator@{digest}"


def test_operator_role_is_exactly_what_the_operator_calls(render: Render) -> None:
    manifests = render()
    role = find(manifests, "ClusterRole", "genrm-operator")
    assert granted(role) == OPERATOR_RULES
    binding = find(manifests, "ClusterRoleBinding", "genrm-operator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    account = find(manifests, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "genrm-system"}]
    assert "--namespace" not in " ".join(operator_container(manifests)["args"])


@pytest.mark.parametrize("values", [None, NAMESPACED], ids=lambda v: v.name if v else "default")
def test_the_operator_may_list_and_watch_nodes_and_nothing_more_about_them(render: Render,
                                                                           values: Path | None) -> None:
    manifests = render(*([values] if values else []))
    role = find(manifests, "ClusterRole", "genrm-operator-nodes")
    assert granted(role) == NODE_RULES
    binding = find(manifests, "ClusterRoleBinding", "-nodes")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = find(manifests, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "genrm-system"}]


def test_without_gpu_placement_the_operator_gets_no_role_on_nodes(render: Render) -> None:
    manifests = render(NAMESPACED, set=("operator.gpuPlacement=false",))
    assert not [m for m in manifests if m["kind"].startswith("Cluster")]
    assert "--no-gpu-placement" in operator_container(manifests)["args"]
    assert "--no-gpu-placement" not in operator_container(render())["args"]


def test_single_namespace_mode_uses_a_role(render: Render) -> None:
    manifests = render(NAMESPACED)
    cluster_wide = [m["metadata"]["name"] for m in manifests if m["kind"].startswith("Cluster")]
    assert all(name.endswith("-nodes") for name in cluster_wide), "only the node reader is cluster-wide"
    role, binding = find(manifests, "Role"), find(manifests, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "judges"
    assert granted(role) == OPERATOR_RULES
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "genrm-operator",
                                      "namespace": "genrm-system"}
    container = operator_container(manifests)
    assert "--namespace=judges" in container["args"]
    assert container["image"] == "registry.example.com/genrm/operator:0.1.0-rc1"


def test_user_roles_aggregate_and_grant_nothing_but_pools(render: Render) -> None:
    manifests = render()
    editor = find(manifests, "ClusterRole", "-genrmpool-editor")
    viewer = find(manifests, "ClusterRole", "-genrmpool-viewer")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    for role in (editor, viewer):
        assert {group for group, _ in granted(role)} == {GROUP}
    assert all(verbs <= {"get", "list", "watch"} for verbs in granted(viewer).values())


def test_deployment_defaults_are_secure_and_kopf_shaped(render: Render) -> None:
    deployment = find(render(), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["command"] == ["genrm-operator"]
    assert "--metrics-port=8080" in container["args"]
    assert "--liveness=http://0.0.0.0:8081/healthz" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    service = find(render(), "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_scheduling_knobs_reach_the_pod(render: Render) -> None:
    pod = find(render(NAMESPACED), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    assert "nodeAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]


def test_monitoring_objects_are_off_by_default(render: Render) -> None:
    kinds = {m["kind"] for m in render(monitoring=True)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "ConfigMap"}


@pytest.mark.parametrize("flag", ["metrics.serviceMonitor.enabled=true", "metrics.gatewayPodMonitor.enabled=true"])
def test_monitoring_objects_need_the_prometheus_operator(helm: Path, flag: str) -> None:
    result = run_helm(helm, "template", str(CHART), "--kube-version", KUBE_VERSION, "--set", flag)
    assert result.returncode != 0
    assert "install the Prometheus Operator CRDs first" in result.stderr


def test_service_monitor_scrapes_the_operator(render: Render) -> None:
    manifests = render(MONITORING, monitoring=True)
    monitor, service = find(manifests, "ServiceMonitor"), find(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["honorLabels"] is True  # the pool's namespace label must win over the operator pod's


def test_pod_monitor_selects_the_judge_pods_gateway_port(render: Render) -> None:
    """The PodMonitor must match what the operator actually builds (labels, port name)."""
    monitor = find(render(MONITORING, monitoring=True), "PodMonitor")
    spec = GenRMPoolSpec.model_validate({"replicas": 1, "model": {"path": "judge"}})
    pod = pod_manifest("pool", "uid", "judges", spec, "pool-0", 0)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    port_names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_genrm_io_pool"], "targetLabel": "pool"} \
        in endpoint["relabelings"]
    revision = {"sourceLabels": ["__meta_kubernetes_pod_label_genrm_io_judge_revision"], "targetLabel": "revision"}
    assert revision in endpoint["relabelings"] and JUDGE_REVISION_LABEL in pod["metadata"]["labels"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["judges", "judges-staging"]}
    default = find(render(set=("metrics.gatewayPodMonitor.enabled=true",), monitoring=True), "PodMonitor")
    assert default["spec"]["namespaceSelector"] == {"any": True}


def test_dashboards_ship_as_sidecar_configmaps(render: Render) -> None:
    maps = [m for m in render(MONITORING, monitoring=True) if m["kind"] == "ConfigMap"]
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(maps) == len(files) > 0
    shipped = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"]["grafana_folder"] == "GenRM"
        shipped.update(config_map["data"])
    assert shipped == {f.name: f.read_text().rstrip("\n") for f in files}
    size = sum(len(json.dumps(m)) for m in maps)
    assert size < 512 * 1024, "dashboards approach the 1 MiB object limit of the Helm release secret"


def test_the_activator_is_two_pods_the_operator_is_pointed_at_with_a_shared_token(render: Render) -> None:
    manifests = render()
    activator = find(manifests, "Deployment", "-activator")
    assert activator["spec"]["replicas"] == 2
    pod = activator["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["genrm-gateway", "activator"]
    assert container["image"] == operator_container(manifests)["image"], "the operator image ships the activator"
    secret = find(manifests, "Secret", "-activator")
    token_ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}}
    assert {"name": "GENRM_CONTROL_TOKEN", "valueFrom": token_ref} in container["env"]
    assert {"name": "GENRM_ACTIVATOR_TOKEN", "valueFrom": token_ref} in operator_container(manifests)["env"]
    service = find(manifests, "Service", "-activator")
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "control"}
    assert service["spec"]["selector"] == activator["spec"]["selector"]["matchLabels"]
    assert f"--activator-service=genrm-system/{service['metadata']['name']}" in operator_container(manifests)["args"]


def test_the_activators_stop_deadline_is_its_grace_period_less_the_margin(render: Render, helm: Path) -> None:
    """The kubelet kills a stopping activator at its grace period: the deadline for what it holds comes
    before, leaving the margin to the forwards already started."""
    for assignments, grace, deadline in (((), 120, 90),
                                         (("activator.terminationGracePeriodSeconds=300",
                                           "activator.stopMarginSeconds=60"), 300, 240)):
        pod = find(render(set=assignments), "Deployment", "-activator")["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        assert f"--stop-deadline-seconds={deadline}" in pod["containers"][0]["args"]
    result = run_helm(helm, "template", str(CHART), "--kube-version", KUBE_VERSION,
                      "--set", "activator.stopMarginSeconds=120")
    assert result.returncode != 0 and "stopMarginSeconds must be less than" in result.stderr, result.stderr


def test_without_the_activator_the_operator_only_watches_endpointslices(render: Render) -> None:
    manifests = render(set=("activator.enabled=false",))
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-activator")]
    role = find(manifests, "ClusterRole", "genrm-operator")
    assert granted(role)[("discovery.k8s.io", "endpointslices")] == {"list", "watch"}
    assert not [a for a in operator_container(manifests)["args"] if a.startswith("--activator-service")]

"""Fixtures for the chart tests: the real helm built by hack/control-plane.sh, and rendering.

Why the real helm and not a Python re-implementation of Go templates: the checks must fail
exactly when `helm install` would. The script returns at once when the binaries are cached
and builds them from their Go modules otherwise, so CI needs no pre-installed helm.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "genrm-operator"
# helm built from its Go module reports Kubernetes v1.20 as its default, below the chart's
# kubeVersion constraint: render for the version the local cluster runs.
KUBE_VERSION = "1.36.3"
PROMETHEUS_OPERATOR_APIS = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor")
Manifest = dict[str, Any]
Render = Callable[..., list[Manifest]]


@pytest.fixture(scope="session")
def helm() -> Path:
    """Path of the helm binary, building it if needed."""
    out = subprocess.run([str(REPO / "hack" / "control-plane.sh")], check=True, capture_output=True, text=True)
    binary = Path(out.stdout.strip().splitlines()[-1]) / "helm"
    assert binary.is_file(), f"hack/control-plane.sh did not provide {binary}"
    return binary


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm without raising, so tests can assert on failures and their messages."""
    return subprocess.run([str(helm), *args], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    """``render(*values_files, set=[...], monitoring=True)`` → the manifests `helm template` emits."""

    def _render(*values_files: Path, set: tuple[str, ...] = (), monitoring: bool = False,
                namespace: str = "genrm-system") -> list[Manifest]:
        args = ["template", "genrm", str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
        for path in values_files:
            args += ["--values", str(path)]
        for assignment in set:
            args += ["--set", assignment]
        if monitoring:
            for api in PROMETHEUS_OPERATOR_APIS:
                args += ["--api-versions", api]
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    return _render


def find(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    """The one object of this kind whose name ends with the suffix (the activator's, ``*-activator``,
    only when the suffix asks for them: the chart's other objects are the operator's)."""
    activator = name_suffix.endswith("-activator")
    matches = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
               and m["metadata"]["name"].endswith("-activator") == activator]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, got {[m['metadata']['name'] for m in matches]}"
    return matches[0]

"""Fixtures of the end-to-end suite: one local cluster and one operator process per run.

Each test gets its own namespace. On failure the operator log, the pool, its
pods, events and the pods' container logs are printed.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cluster.cluster import LocalCluster

from .harness import REPO, SOAK, TALLY, Cluster, OperatorProcess, deploy_activator

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real kube-apiserver + etcd + controller-manager + scheduler and a node agent with 2 x 8 GPUs."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    with LocalCluster(nodes=2, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"]) as local:
        yield Cluster(local)


@pytest.fixture(scope="session")
def activator(cluster: Cluster) -> tuple[str, str]:
    """The chart's activator, as `helm install` makes it: its Service and control token, for the operator."""
    return deploy_activator(cluster)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, activator: tuple[str, str],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator, running for the whole suite with the chart's default activator; tests may kill
    and restart it."""
    proc = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator"), activator)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(cluster: Cluster, operator: OperatorProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; deleted afterwards (its pods drain and go in the background)."""
    name = f"e2e-{next(_namespaces)}"
    cluster.kubectl("create", "namespace", name)
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"\n===== operator log (tail) =====\n{operator.log_tail()}")
        print(f"\n===== namespace {name} =====\n{cluster.debug_dump(name)}")
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Expose each phase's report to fixtures, so teardown can print logs on failure."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The closing figures lines: the suite's (scale_ops and operator_kills include the soak's;
    requests and plain_requests do not: the soak reports its own) and the soak's, if it ran."""
    if SOAK.figures is not None:
        terminalreporter.write_line(SOAK.figures.line())
    if TALLY.speed_guard:
        terminalreporter.write_line(TALLY.speed_guard)
    if TALLY.trainer_client:
        terminalreporter.write_line(TALLY.trainer_client)
    terminalreporter.write_line(
        f"e2e-summary: requests={TALLY.requests} failed={TALLY.failed} "
        f"scale_ops={TALLY.scale_ops} operator_kills={TALLY.operator_kills} "
        f"plain_requests={TALLY.plain_requests} plain_failed={TALLY.plain_failed} "
        f"spread_old_share={TALLY.spread_old_share:.3f} spread_min_new_share={TALLY.spread_min_new_share:.3f}")

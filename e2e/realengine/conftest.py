"""Fixtures of the real-engine lane: the e2e suite's cluster and operator, with SGLang's image real.

The local cluster maps the engine image the operator's pods name by default (SGLang 0.5.23's) to the
installed engine environment (`genrm_testing.realengine`), and the tiny models reach the pods through
a hostPath volume, as a model directory on a GPU node would. Everything else is the e2e suite's:
the operator process, the chart's activator, a namespace per test. The environment is installed on
first use; if it cannot be, the lane fails with pip's words (it is never skipped).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cluster.cluster import LocalCluster
from genrm_testing import realengine

from ..harness import REPO, Cluster
from .lane import LANE, started_pods


@pytest.fixture(scope="session")
def engine_env() -> Path:
    return realengine.environment()


@pytest.fixture(scope="session")
def models(engine_env: Path) -> Path:
    return realengine.models(engine_env)


@pytest.fixture(scope="session")
def cluster(engine_env: Path, models: Path) -> Iterator[Cluster]:
    """One node is enough: at most three real replicas fit this machine (3.3 GB and a core's share each)."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    with LocalCluster(nodes=1, gpus_per_node=8, crds=[REPO / "crds" / "genrm.io_genrmpools.yaml"],
                      images={realengine.IMAGE: engine_env}) as local:
        yield Cluster(local)


@pytest.fixture(autouse=True)
def count_replicas(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test with its own namespace, the pods the node agent started in it go into the lane's
    replica count (each ran a real engine), however the test ended. The namespace is asked for here,
    before the test, so that it is torn down after this count."""
    if "namespace" not in request.fixturenames:
        yield
        return
    cluster, namespace = request.getfixturevalue("cluster"), request.getfixturevalue("namespace")
    yield
    LANE.replicas += started_pods(cluster, namespace)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The lane's line, here and (for `make test-real-engine` to end with it) in GENRM_REAL_ENGINE_SUMMARY."""
    terminalreporter.write_line(LANE.line())
    target = os.environ.get("GENRM_REAL_ENGINE_SUMMARY")
    if target:
        Path(target).write_text(LANE.line() + "\n")

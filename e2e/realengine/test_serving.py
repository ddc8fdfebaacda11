"""Real SGLang replicas publish, serve unmodified clients through the ClusterIP, and scale."""

from __future__ import annotations

from pathlib import Path

from ..harness import Cluster, OperatorProcess
from .lane import real_pool_manifest


def test_a_real_replica_publishes_and_answers(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                              models: Path) -> None:
    cluster.kubectl("apply", "-f", "-", input=real_pool_manifest("judge", namespace, models))
    cluster.wait_serving(namespace, "judge", 1, timeout=240)
    plain = cluster.plain_clients(namespace, "judge")
    print(plain)

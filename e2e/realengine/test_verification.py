"""Verification on the real engine: identical replicas agree, a replica with other weights is refused.

SGLang refuses deterministic inference on its CPU attention backend and ignores a request's sampling
seed without it, so the lane's pools verify with greedy probes (`spec.verification.sampling: Greedy`).
The model directory is a link on the node that is turned to a model with other weights between two
replicas, as a model directory overwritten under a running pool would be: the replica that loads it
must never be published, and once the link is back its replacement verifies and serves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..harness import Cluster, wait_for
from .lane import LANE, real_pool_manifest

pytestmark = pytest.mark.timeout(600)

POOL = "verify"


def point(link: Path, target: Path) -> None:
    """Turn ``link`` to ``target`` at once (a new link renamed over the old one)."""
    fresh = link.with_name(link.name + ".new")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(target)
    os.replace(fresh, link)


def test_greedy_verification_publishes_an_identical_real_replica_and_refuses_other_weights(
        cluster: Cluster, namespace: str, models: Path, tmp_path: Path) -> None:
    node_models = tmp_path / "models"
    node_models.mkdir()
    point(node_models / "judge", models / "tiny-judge")
    cluster.kubectl("apply", "-f", "-", input=real_pool_manifest(POOL, namespace, node_models, model="judge"))
    cluster.wait_serving(namespace, POOL, 1, timeout=300)
    LANE.replicas += 1

    point(node_models / "judge", models / "tiny-judge-other")
    cluster.scale(namespace, POOL, 2)

    def refused() -> dict[str, Any] | None:
        assert cluster.published(namespace, POOL) == [f"{POOL}-0"], "only the replica of the pool's model serves"
        history = (cluster.pool(namespace, POOL).get("status") or {}).get("history") or []
        return next((h for h in history if h.get("reason") == "ReplicaInconsistent"), None)
    entry = wait_for("the replica with other weights to fail verification", refused, timeout=300, interval=1)
    assert "differs" in entry["message"], entry
    LANE.replicas += 1

    point(node_models / "judge", models / "tiny-judge")
    status = cluster.wait_serving(namespace, POOL, 2, timeout=400)["status"]
    LANE.replicas += 1
    LANE.verified += 1
    assert status["history"][-1]["outcome"] == "Succeeded", status["history"]

"""Verification on the real engine: identical replicas agree; other weights or other settings are refused.

SGLang refuses deterministic inference on its CPU attention backend and ignores a request's sampling
seed without it, so the lane's pools verify with greedy probes (`spec.verification.sampling: Greedy`).
The model directory is a link on the node, turned between two replicas to a model with other weights
and then to the same weights with another setting in their config, as a model directory overwritten
under a running pool would be: the replicas that load them must never be published, and once the
link is back their replacement verifies and serves.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from typing import Any

import pytest
from genrm_operator.core.names import VERIFICATION_MESSAGE_ANNOTATION
from genrm_testing import realengine

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

    point(node_models / "judge", models / "tiny-judge-other")
    cluster.scale(namespace, POOL, 2)

    def refused(count: int) -> list[dict[str, Any]] | None:
        assert cluster.published(namespace, POOL) == [f"{POOL}-0"], "only the replica of the pool's model serves"
        history = (cluster.pool(namespace, POOL).get("status") or {}).get("history") or []
        failures = [h for h in history if h.get("reason") == "ReplicaInconsistent"]
        return failures if len(failures) >= count else None
    failures = wait_for("the replica with other weights to fail verification", lambda: refused(1), timeout=300,
                        interval=0.5)
    # Its replacement is created at once, and its engine reads the model ~10 s later (after its imports).
    point(node_models / "judge", models / realengine.SETTINGS_VARIANT[0])
    switched = datetime.datetime.now(datetime.UTC).replace(tzinfo=None, microsecond=0)
    failures = wait_for("the replica with another setting to fail verification", lambda: refused(2), timeout=300,
                        interval=0.5)
    assert all("differs" in entry["message"] for entry in failures), failures
    second = refused_replica(failures[1])
    engine_log = Path(cluster.local.logs_for(second, namespace)["engine"]).read_text(errors="replace")
    first = re.search(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", engine_log, re.M)
    assert first, engine_log[:2000]
    started = datetime.datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S")
    assert started > switched, f"{second}'s engine started logging at {started}, the link turned at {switched}"

    point(node_models / "judge", models / "tiny-judge")
    pool = cluster.wait_serving(namespace, POOL, 2, timeout=400)
    assert pool["status"]["history"][-1]["outcome"] == "Succeeded", pool["status"]["history"]
    newest = max(cluster.pods(namespace, POOL), key=lambda p: p["metadata"]["creationTimestamp"])
    message = newest["metadata"].get("annotations", {}).get(VERIFICATION_MESSAGE_ANNOTATION, "")
    assert "identical to the reference" in message, newest["metadata"]
    LANE.verified += 1


def refused_replica(entry: dict[str, Any]) -> str:
    """The replica a ``ReplicaInconsistent`` history entry refused (its message names the reference too)."""
    found = re.search(rf"ReplicaInconsistent: ({POOL}-\d+) on node", entry["message"])
    assert found, entry
    return found.group(1)

"""What a ``PoolReconciler`` step keeps from the last one: pod views and the parsed pool, by resourceVersion.

Aspects under test: a pod whose resourceVersion did not change is not turned into a view again, and
one whose resourceVersion changed is (its new labels are what the step sees); the pool's spec and
status are parsed again only when its resourceVersion changed, and an edit under a new one is seen.
"""

from __future__ import annotations

import copy
from typing import Any

from genrm_operator.shell import observer as shell

from .test_autoscaler_shell import pool, serving_pod
from .test_step_order import RecordingKube, frozen_reconciler


def versioned(ordinal: int, version: str) -> dict[str, Any]:
    pod = serving_pod(ordinal)
    pod["metadata"]["resourceVersion"] = version
    return pod


async def test_pod_views_are_made_again_only_for_pods_that_changed(monkeypatch: Any) -> None:
    kube = RecordingKube(pool(2, mode="Off"), [versioned(0, "10"), versioned(1, "11")])
    reconciler = frozen_reconciler(kube)
    made: list[str] = []
    pod_view = shell.pod_view

    def counting(pod: dict[str, Any]) -> Any:
        made.append(pod["metadata"]["name"])
        return pod_view(pod)

    monkeypatch.setattr(shell, "pod_view", counting)
    first = reconciler.observer.pod_views(copy.deepcopy(kube.pods))
    again = reconciler.observer.pod_views(copy.deepcopy(kube.pods))
    assert made == ["judge-0", "judge-1"] and again == first

    kube.pods[1]["metadata"]["labels"]["genrm.io/published"] = "false"
    kube.pods[1]["metadata"]["resourceVersion"] = "12"
    changed = reconciler.observer.pod_views(copy.deepcopy(kube.pods))
    assert made == ["judge-0", "judge-1", "judge-1"]
    assert [v.published for v in changed] == [True, False]


async def test_the_pool_is_parsed_again_only_under_a_new_resource_version() -> None:
    kube = RecordingKube(pool(2, mode="Off"), [])
    reconciler = frozen_reconciler(kube)
    spec, status = reconciler.observer.parse(copy.deepcopy(kube.pool))
    same = reconciler.observer.parse(copy.deepcopy(kube.pool))
    assert same[0] is spec and same[1] is status

    kube.pool["spec"]["replicas"] = 3
    kube.bump()
    edited, _ = reconciler.observer.parse(copy.deepcopy(kube.pool))
    assert edited.replicas == 3

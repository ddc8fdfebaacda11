"""Tests of ``genrm_operator.shell.observe``: Kubernetes pod JSON into the core's ``PodView``.

Aspects under test: name, UID and creation time; phase; readiness from the Ready condition;
the published label and the ever-published / verification annotations (unknown verdicts are
ignored); deletionTimestamp; the scheduler's Unschedulable message from PodScheduled; a container
the kubelet cannot create as specified (not one on its way to starting); the startup clock from
scheduling or the first container start; restarts
summed over containers; the pod IP; sparse pods (no status yet) get safe defaults.
"""

from __future__ import annotations

from typing import Any

from genrm_operator.api.base import parse_time
from genrm_operator.shell.observe import MESSAGE_CHARS, pod_ip, pod_view

UNSCHEDULABLE = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."


def running_pod(**meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "judge-3", "namespace": "ml", "uid": "0f6f1d9e-3c1b-4f5e-9a77-2b1c3d4e5f60",
            "creationTimestamp": "2026-03-01T12:00:05Z",
            "labels": {"genrm.io/pool": "judge", "genrm.io/ordinal": "3", "genrm.io/published": "true"},
            "annotations": {"genrm.io/ever-published": "true", "genrm.io/verification": "passed",
                            "genrm.io/verification-message": "3 probes identical to the reference"},
            **meta,
        },
        "spec": {"containers": [{"name": "engine"}, {"name": "gateway"}]},
        "status": {
            "phase": "Running", "podIP": "10.244.1.17",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T12:03:00Z"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "engine", "ready": True, "restartCount": 0, "state": {"running": {}}},
                {"name": "gateway", "ready": True, "restartCount": 0, "state": {"running": {}}},
            ],
        },
    }


def test_a_running_published_verified_pod_is_seen_as_such() -> None:
    view = pod_view(running_pod())
    assert (view.name, view.uid) == ("judge-3", "0f6f1d9e-3c1b-4f5e-9a77-2b1c3d4e5f60")
    assert view.created_at == parse_time("2026-03-01T12:00:05Z").timestamp()
    assert view.phase == "Running" and view.ready and view.published and view.ever_published
    assert view.verification == "passed" and view.verification_message.startswith("3 probes")
    assert not view.deleting and view.unschedulable == "" and view.restarts == 0
    assert pod_ip(running_pod()) == "10.244.1.17"


def test_a_pending_pod_that_cannot_get_gpus_carries_the_schedulers_message() -> None:
    pod = running_pod(labels={"genrm.io/pool": "judge", "genrm.io/published": "false"}, annotations={})
    pod["status"] = {
        "phase": "Pending", "qosClass": "Burstable",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": UNSCHEDULABLE, "lastTransitionTime": "2026-03-01T12:00:05Z"}],
    }
    view = pod_view(pod)
    assert view.phase == "Pending" and not view.ready and not view.published and not view.ever_published
    assert view.unschedulable == UNSCHEDULABLE
    assert view.verification == ""
    assert pod_ip(pod) is None


def test_a_container_that_cannot_be_created_is_reported_and_a_slow_start_is_not() -> None:
    pod = running_pod(labels={"genrm.io/pool": "judge"}, annotations={})
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-03-01T12:00:06Z"}],
        "initContainerStatuses": [{"name": "engine-key", "restartCount": 0, "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "judge-key" not found'}}}],
        "containerStatuses": [{"name": "engine", "restartCount": 0,
                               "state": {"waiting": {"reason": "PodInitializing"}}}],
    }
    view = pod_view(pod)
    assert view.cannot_start == 'container engine-key: CreateContainerConfigError: secret "judge-key" not found'
    assert view.blocked == view.cannot_start and view.unschedulable == ""
    assert view.startup_from == parse_time("2026-03-01T12:00:06Z").timestamp(), "scheduled, nothing started"
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "InvalidImageName", "message": "x" * 5000}}
    pod["status"]["initContainerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
    assert pod_view(pod).cannot_start.startswith("container engine: InvalidImageName: xxx")
    assert len(pod_view(pod).cannot_start) == MESSAGE_CHARS, "a registry's long answer is cut"
    for passing in ("PodInitializing", "ContainerCreating", "CreateContainerError", "ImagePullBackOff"):
        pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": passing, "message": "m"}}
        assert pod_view(pod).cannot_start == "", f"{passing}: on its way, or a replacement may escape it"


def test_the_startup_time_counts_from_the_last_container_start_when_that_came_later() -> None:
    pod = running_pod()
    pod["status"]["conditions"][-1]["lastTransitionTime"] = "2026-03-01T12:00:06Z"
    # The gateway ran from the start; the engine waited (for a Secret in its env) and started late.
    pod["status"]["containerStatuses"][1]["state"] = {"running": {"startedAt": "2026-03-01T12:00:10Z"}}
    pod["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-03-01T14:00:00Z"}}
    assert pod_view(pod).startup_from == parse_time("2026-03-01T14:00:00Z").timestamp()


def test_a_scheduling_gate_is_not_mistaken_for_unschedulable() -> None:
    pod = running_pod()
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    assert pod_view(pod).unschedulable == ""


def test_restarts_are_summed_over_all_containers() -> None:
    pod = running_pod()
    pod["status"]["containerStatuses"][0]["restartCount"] = 2
    pod["status"]["containerStatuses"][1]["restartCount"] = 1
    pod["status"]["conditions"][1]["status"] = "False"
    view = pod_view(pod)
    assert view.restarts == 3 and not view.ready


def test_a_terminating_pod_is_deleting() -> None:
    pod = running_pod(deletionTimestamp="2026-03-01T12:10:00Z", deletionGracePeriodSeconds=335)
    assert pod_view(pod).deleting


def test_unknown_verification_verdicts_and_labels_are_ignored() -> None:
    pod = running_pod(labels={"genrm.io/published": "yes"},
                      annotations={"genrm.io/verification": "maybe", "genrm.io/ever-published": "1"})
    view = pod_view(pod)
    assert view.verification == "" and not view.published and not view.ever_published


def test_a_failed_verification_keeps_its_message() -> None:
    pod = running_pod(annotations={"genrm.io/verification": "failed",
                                   "genrm.io/verification-message": "probe 0 differs: new='A' reference='B'"})
    view = pod_view(pod)
    assert view.verification == "failed" and "probe 0 differs" in view.verification_message


def test_a_freshly_created_pod_without_status_gets_safe_defaults() -> None:
    view = pod_view({"metadata": {"name": "judge-9"}})
    assert (view.name, view.uid, view.created_at, view.phase) == ("judge-9", "", 0.0, "Pending")
    assert not view.ready and not view.published and not view.deleting and view.restarts == 0


def test_a_failed_pod_reports_its_phase() -> None:
    pod = running_pod()
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"] = None
    view = pod_view(pod)
    assert view.phase == "Failed" and view.restarts == 0

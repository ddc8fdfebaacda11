"""Turning Kubernetes pod objects into the core's :class:`PodView`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.base import parse_time
from ..core.model import PodView, Verification
from ..core.names import (
    EVER_PUBLISHED_ANNOTATION,
    JUDGE_REVISION_LABEL,
    PUBLISHED_LABEL,
    REVISION_LABEL,
    VERIFICATION_ANNOTATION,
    VERIFICATION_MESSAGE_ANNOTATION,
)

# A registry's pull error can run to kilobytes; the status history and Events carry this much of it.
MESSAGE_CHARS = 400
# The kubelet's waiting reasons that stay until the pod's spec or what it references changes (the
# kubelet keeps retrying, so fixing the Secret or the image name lets the same pod start): a
# replacement would wait the same way. Not among them: what a replacement elsewhere may escape (a
# runtime's CreateContainerError, a pull failing for a node's disk or network), which the startup
# timeout still replaces, and what is on its way (ContainerCreating, PodInitializing).
CANNOT_START_REASONS = frozenset({"CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"})


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def _cannot_start(status: Mapping[str, Any]) -> str:
    """The first container (init containers first) waiting for a reason no retry can clear, as
    ``container NAME: REASON: message``; '' when none is."""
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START_REASONS:
            message = f": {waiting['message']}" if waiting.get("message") else ""
            said = f"container {container.get('name', '?')}: {waiting['reason']}{message}"
            return said if len(said) <= MESSAGE_CHARS else said[:MESSAGE_CHARS - 1] + "…"
    return ""


def _startup_from(status: Mapping[str, Any], scheduled: Mapping[str, Any]) -> float:
    """The latest of the pod's scheduling and its running main containers' starts (0 when none of
    these happened): a pod that waited for a node, or one of whose containers waited for its
    configuration while the others ran, has its startup time from when the last of them could start."""
    stamps = [scheduled.get("lastTransitionTime")] if scheduled.get("status") == "True" else []
    stamps += [c["state"]["running"].get("startedAt") for c in status.get("containerStatuses") or []
               if "running" in (c.get("state") or {})]
    return max((parse_time(s).timestamp() for s in stamps if s), default=0.0)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """The facts of one pod the reconcile step needs."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    scheduled = _condition(status, "PodScheduled")
    unschedulable = ""
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = str(scheduled.get("message") or "Unschedulable")
    verification = annotations.get(VERIFICATION_ANNOTATION, "")
    checked: Verification = verification if verification in ("passed", "failed") else ""
    return PodView(
        name=meta["name"],
        uid=meta.get("uid", ""),
        created_at=parse_time(stamp).timestamp() if (stamp := meta.get("creationTimestamp")) else 0.0,
        phase=status.get("phase", "Pending"),
        ready=_condition(status, "Ready").get("status") == "True",
        published=labels.get(PUBLISHED_LABEL) == "true",
        ever_published=annotations.get(EVER_PUBLISHED_ANNOTATION) == "true",
        verification=checked,
        verification_message=annotations.get(VERIFICATION_MESSAGE_ANNOTATION, ""),
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable,
        cannot_start=_cannot_start(status),
        startup_from=_startup_from(status, scheduled),
        restarts=sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or []),
        resource_version=meta.get("resourceVersion", ""),
        revision=labels.get(REVISION_LABEL, ""),
        judge=labels.get(JUDGE_REVISION_LABEL, ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
    )


def pod_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod IP the sidecar listens on, once assigned."""
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None

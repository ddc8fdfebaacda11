"""Turning Kubernetes pod objects into the core's :class:`PodView`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.base import parse_time
from ..core.model import PodView, Verification
from ..core.names import (
    EVER_PUBLISHED_ANNOTATION,
    PUBLISHED_LABEL,
    REVISION_LABEL,
    VERIFICATION_ANNOTATION,
    VERIFICATION_MESSAGE_ANNOTATION,
)


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


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
        restarts=sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or []),
        resource_version=meta.get("resourceVersion", ""),
        revision=labels.get(REVISION_LABEL, ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
    )


def pod_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod IP the sidecar listens on, once assigned."""
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None

"""Sorting a pool's pods into the roles the state machine reasons about.

Roles are derived from observations only (pod labels and phase, sidecar
reports), so an operator that restarts mid-operation recovers them exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from genrm_contract.sidecar import DrainState

from ..api.status import FailureReason
from .model import PodView, SidecarView


class Role(Enum):
    """Where a replica stands."""

    SERVING = "Serving"
    """Published for routing."""
    STARTING = "Starting"
    """Not published, not draining: loading, verifying, awaiting publication, or unschedulable."""
    DRAINING = "Draining"
    """Unpublished and soft-drained or fenced, not yet drained: can still be rescued."""
    DRAINED = "Drained"
    """Proved drained by its sidecar: may only be deleted."""
    FAILED = "Failed"
    """Crashed, failed, never ready in time or answering differently: to be replaced."""
    TERMINATING = "Terminating"
    """Has a deletion timestamp."""


@dataclass(frozen=True)
class Replica:
    """A pod with its role and sidecar report."""

    pod: PodView
    role: Role
    sidecar: SidecarView | None
    failure: str = ""
    """CamelCase reason when role is FAILED."""

    @property
    def inflight(self) -> int:
        """Requests in flight as the sidecar reports them (0 when unknown)."""
        return self.sidecar.inflight if self.sidecar is not None else 0


def failure_reason(pod: PodView, now: float, startup_timeout: float) -> FailureReason | Literal[""]:
    """Why a pod must be replaced, or '' when it is healthy or still has time.

    A pod being deleted is judged only by what it did before: its restarts (the containers of a
    terminating pod are never restarted). Its phase is the kubelet's answer to the deletion
    (kubelets 1.27 and later, and the local node agent, end every deleted pod Succeeded or
    Failed), and it no longer has to become ready. Read as failures, both would blame a replica
    for its own removal; a failure seen before the deletion is what an operation remembers
    (`AddedPod.failure`). A failed verification is such a failure too: its answers differed
    before anyone deleted it. Such a replica is replaced like a crashed one, its replacements
    backing off (`reconcile.create_backoff`), rather than kept unpublished on its GPU forever.
    """
    if pod.phase in ("Failed", "Succeeded") and not pod.deleting:
        return FailureReason.REPLICA_FAILED
    if pod.restarts > 0:
        return FailureReason.REPLICA_CRASHED
    if pod.verification == "failed":
        return FailureReason.REPLICA_INCONSISTENT
    if pod.deleting or pod.ever_published or pod.blocked:
        return ""
    if not pod.ready and now - max(pod.created_at, pod.startup_from) > startup_timeout:
        return FailureReason.STARTUP_TIMEOUT
    return ""


def classify(
    pods: tuple[PodView, ...],
    sidecars: Mapping[str, SidecarView | None],
    now: float,
    startup_timeout: float,
) -> list[Replica]:
    """Assign every pod a role."""
    replicas: list[Replica] = []
    for pod in pods:
        sidecar = sidecars.get(pod.name)
        reason = failure_reason(pod, now, startup_timeout)
        if pod.deleting:
            role = Role.TERMINATING
        elif reason:
            role = Role.FAILED
        elif sidecar is not None and sidecar.state == DrainState.DRAINED:
            role = Role.DRAINED
        elif pod.published:
            role = Role.SERVING
        elif sidecar is not None and sidecar.state in (DrainState.SOFT_DRAIN, DrainState.FENCED):
            role = Role.DRAINING
        else:
            role = Role.STARTING
        replicas.append(Replica(pod=pod, role=role, sidecar=sidecar, failure=reason))
    return replicas

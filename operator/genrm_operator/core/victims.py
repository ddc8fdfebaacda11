"""Which replicas a scale-in (or a rollout) removes.

Order: undo the least progressed work first (draining, then not yet published
or not ready), then replicas of an outdated pod template (a rollout would
replace them anyway), then the replicas with the fewest requests in flight
(shortest drain), then the newest (the oldest have proven themselves).
"""

from __future__ import annotations

from .classify import Replica, Role


def victim_order_key(replica: Replica, revision: str) -> tuple[int, int, bool, int, float]:
    """Sort key: smaller means removed first (``revision``: the current pod template's)."""
    pod = replica.pod
    stage = {Role.DRAINING: 0, Role.STARTING: 1, Role.SERVING: 2}.get(replica.role, 3)
    not_ready_first = 0 if not pod.ready else 1
    return (stage, not_ready_first, pod.revision == revision, replica.inflight, -pod.created_at)


def choose_victims(candidates: list[Replica], count: int, revision: str) -> list[Replica]:
    """The ``count`` replicas to remove, in removal order."""
    return sorted(candidates, key=lambda r: victim_order_key(r, revision))[: max(count, 0)]

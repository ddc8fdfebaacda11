"""Which replicas a scale-in removes.

Order: undo the least progressed work first (draining, then not yet published
or not ready), then the replicas with the fewest requests in flight (shortest
drain), then the newest (the oldest have proven themselves).
"""

from __future__ import annotations

from .classify import Replica, Role


def victim_order_key(replica: Replica) -> tuple[int, int, int, float]:
    """Sort key: smaller means removed first."""
    pod = replica.pod
    stage = {Role.DRAINING: 0, Role.STARTING: 1, Role.SERVING: 2}.get(replica.role, 3)
    not_ready_first = 0 if not pod.ready else 1
    return (stage, not_ready_first, replica.inflight, -pod.created_at)


def choose_victims(candidates: list[Replica], count: int) -> list[Replica]:
    """The ``count`` replicas to remove, in removal order."""
    return sorted(candidates, key=victim_order_key)[: max(count, 0)]

"""Which replicas each gateway may hand a request to while its engine is down (`genrm_contract.peers`).

Why the operator decides: a gateway sees only its own replica; the operator sees every replica's
publication, readiness and sidecar report. A peer is a replica that would serve the request at
once: verified (published now or before), Ready, not being deleted, its gateway admitting (Serving
or soft-draining: a scale-in's victim answers until its fence, and while the survivor's engine is
down it may be the only replica that can) and its engine healthy. Every replica
whose gateway answers is told the others (a victim still draining may meet a crash too), in the
order of their addresses starting after its own, so that when a pool has more serving replicas
than a gateway is told (`MAX_PEERS`), the gateways are told different ones and the forwards of a
crash spread. The serving replicas are sorted once per step and each list is read off them from
its starting point, so a step costs the same per replica in a pool of any size. Replicas of
different judge revisions are never each other's peers (a forwarded request must get the same
judge's verdict), except that a gateway fenced for a judge switch is told the new revision's
replicas: it answers what still reaches it through them (`judgeswitch`). Pure: the shell passes
the pod IPs in and delivers the lists (`shell.peers`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Mapping

from genrm_contract.peers import MAX_PEERS, peer_address
from genrm_contract.sidecar import ADMITTING_STATES, DrainReason

from .model import Observed

canonical = functools.lru_cache(maxsize=16384)(peer_address)
"""`peer_address`, remembered: a step writes every replica's address, and parsing the same pod IPs
again at every step was most of the peers' share of a scale storm's CPU (figures:
docs/performance.md#measurements-behind-the-code). Pod IPs are few and a pod keeps its IP."""


def forwards_to(obs: Observed, name: str, judge: str) -> str:
    """The judge revision whose replicas a gateway may hand requests to: its own, or, for a gateway
    of the revision a judge switch promoted away from (recorded, or fenced for it), the revision that
    serves the pool now. Told before its fence, it answers what still reaches it through them
    instead of refusing it (`judgeswitch.fence_previous`)."""
    status = obs.status
    if status.judge is None or judge == status.judge.active:
        return judge
    view, op = obs.sidecars.get(name), status.operation
    promoted_from = op.judge_from if op is not None and op.promoted_at is not None else None
    if (view is not None and view.reason is DrainReason.JUDGE_SWITCHED) or judge == promoted_from:
        return status.judge.active
    return judge


def peer_lists(obs: Observed, ips: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each reporting replica's peers (traffic addresses), by pod name; ``ips`` are the pod IPs (one
    that is no valid peer address, which Kubernetes never gives a pod, is left out)."""
    port = obs.spec.gateway.port
    addresses: dict[str, str] = {}
    for name, ip in ips.items():
        try:
            addresses[name] = canonical(ip, port)
        except ValueError:
            continue
    # One replica per address: two pods reporting one IP (one of them stale) would name it twice.
    # Peers answer as their own judge: a gateway is told only replicas of its own judge revision.
    serving_by_judge: dict[str, dict[str, str]] = {}
    for pod in obs.pods:
        if (pod.published or pod.ever_published) and pod.ready and not pod.deleting and pod.name in addresses \
                and (view := obs.sidecars.get(pod.name)) is not None \
                and view.state in ADMITTING_STATES and view.engine_healthy:
            serving_by_judge.setdefault(pod.judge, {})[addresses[pod.name]] = pod.name
    sorted_by_judge = {judge: sorted(by_address) for judge, by_address in serving_by_judge.items()}
    lists: dict[str, tuple[str, ...]] = {}
    for pod in obs.pods:
        if pod.deleting or pod.name not in addresses or obs.sidecars.get(pod.name) is None:
            continue
        serving = sorted_by_judge.get(forwards_to(obs, pod.name, pod.judge), [])
        own = addresses[pod.name]
        start = bisect.bisect_right(serving, own)
        rotated = (serving[(start + i) % len(serving)] for i in range(len(serving)))
        lists[pod.name] = tuple(itertools.islice((address for address in rotated if address != own), MAX_PEERS))
    return lists

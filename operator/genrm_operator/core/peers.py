"""Which replicas each gateway may hand a request to while its engine is down (`genrm_contract.peers`).

Why the operator decides: a gateway sees only its own replica; the operator sees every replica's
publication, readiness and sidecar report. A peer is a replica that would serve the request at
once: published, Ready, not being deleted, its gateway Serving and its engine healthy. Every replica
whose gateway answers is told the others (a victim still draining may meet a crash too), in the
order of their addresses starting after its own, so that when a pool has more serving replicas
than a gateway is told (`MAX_PEERS`), the gateways are told different ones and the forwards of a
crash spread. Pure: the shell passes the pod IPs in and delivers the lists (`shell.peers`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from genrm_contract.peers import MAX_PEERS, peer_address
from genrm_contract.sidecar import DrainState

from .model import Observed


def peer_lists(obs: Observed, ips: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each reporting replica's peers (traffic addresses), by pod name; ``ips`` are the pod IPs."""
    port = obs.spec.gateway.port
    serving = sorted(
        (peer_address(ips[pod.name], port), pod.name) for pod in obs.pods
        if pod.published and pod.ready and not pod.deleting and pod.name in ips
        and (view := obs.sidecars.get(pod.name)) is not None
        and view.state == DrainState.SERVING and view.engine_healthy)
    lists: dict[str, tuple[str, ...]] = {}
    for pod in obs.pods:
        if pod.deleting or pod.name not in ips or obs.sidecars.get(pod.name) is None:
            continue
        others = [address for address, name in serving if name != pod.name]
        start = bisect.bisect_right(others, peer_address(ips[pod.name], port))
        lists[pod.name] = tuple((others[start:] + others[:start])[:MAX_PEERS])
    return lists

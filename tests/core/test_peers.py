"""The peers each gateway is told (``genrm_operator.core.peers``): the pool's other replicas that would
serve a request at once, for a replica whose engine is down.

Aspects: a peer is published, Ready, not being deleted, Serving with a healthy engine, and has an IP;
no replica is its own peer; every replica whose gateway reports is told, a draining victim too, and
none that is being deleted, has no IP or never answered; addresses are the traffic port's, IPv6 in
brackets; each list starts after the receiver's own address and holds at most ``MAX_PEERS``, so the
receivers of a large pool are told different peers; every list is valid as a ``PeersDocument``; a pod
IP that is no valid peer address is left out, one spelled otherwise is canonical; a step's cost grows
with the pool's size, not with its square.
"""

from __future__ import annotations

import time

from genrm_contract.peers import MAX_PEERS, PeersDocument
from genrm_contract.sidecar import DrainReason, DrainState
from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.core.peers import peer_lists
from hypothesis import given
from hypothesis import strategies as st

from .test_reconcile import make_spec, observe, serving_pod, serving_sidecar

SPEC = make_spec(3)
IPS = {"p-0": "10.0.0.10", "p-1": "10.0.0.11", "p-2": "10.0.0.12"}


def test_each_serving_replica_is_told_the_others() -> None:
    pods = [serving_pod(name) for name in IPS]
    lists = peer_lists(observe(SPEC, pods), IPS)
    assert lists == {"p-0": ("10.0.0.11:8000", "10.0.0.12:8000"), "p-1": ("10.0.0.12:8000", "10.0.0.10:8000"),
                     "p-2": ("10.0.0.10:8000", "10.0.0.11:8000")}


def test_only_replicas_that_would_serve_at_once_are_peers() -> None:
    pods = [serving_pod("ok"), serving_pod("unverified", published=False, ever_published=False),
            serving_pod("unready", ready=False), serving_pod("deleting", deleting=True),
            serving_pod("victim", published=False), serving_pod("fenced"), serving_pod("engine-down"),
            serving_pod("silent"), serving_pod("no-ip")]
    sidecars = {p.name: serving_sidecar() for p in pods}
    sidecars["victim"] = serving_sidecar(state=DrainState.SOFT_DRAIN)  # unpublished, still admitting
    sidecars["fenced"] = serving_sidecar(state=DrainState.FENCED)
    sidecars["engine-down"] = serving_sidecar(engine_healthy=False)
    sidecars["silent"] = None
    ips = {p.name: f"10.0.1.{i}" for i, p in enumerate(pods) if p.name != "no-ip"}
    lists = peer_lists(observe(SPEC, pods, sidecars), ips)
    # Told: every replica with an IP whose gateway answers, unless it is being deleted.
    assert set(lists) == {"ok", "unverified", "unready", "victim", "fenced", "engine-down"}
    # Peers: verified (published now or before), Ready, admitting (Serving or soft-draining), engine up.
    for name in ("engine-down", "fenced", "unready"):
        assert sorted(lists[name]) == ["10.0.1.0:8000", "10.0.1.4:8000"]
    assert lists["ok"] == ("10.0.1.4:8000",) and lists["victim"] == ("10.0.1.0:8000",)


def test_the_traffic_port_and_ipv6_brackets() -> None:
    spec = make_spec(2, gateway={"port": 9000})
    pods = [serving_pod("a"), serving_pod("b")]
    lists = peer_lists(observe(spec, pods), {"a": "fd00::a", "b": "10.0.0.2"})
    assert lists == {"a": ("10.0.0.2:9000",), "b": ("[fd00::a]:9000",)}
    for peers in lists.values():
        PeersDocument(version=1, peers=peers)


@given(st.integers(min_value=1, max_value=3 * MAX_PEERS))
def test_large_pools_tell_each_replica_a_bounded_valid_list_that_starts_after_itself(size: int) -> None:
    pods = [serving_pod(f"p-{i}") for i in range(size)]
    ips = {f"p-{i}": f"10.1.{i // 200}.{i % 200 + 1}" for i in range(size)}
    lists = peer_lists(observe(make_spec(size), pods), ips)
    firsts = set()
    for name, peers in lists.items():
        PeersDocument(version=1, peers=peers)  # valid: distinct, bounded, IP literals
        assert len(peers) == min(size - 1, MAX_PEERS)
        assert f"{ips[name]}:8000" not in peers
        if peers:
            firsts.add(peers[0])
            assert peers[0] == min((a for a in (f"{ip}:8000" for ip in ips.values()) if a > f"{ips[name]}:8000"),
                                   default=min(f"{ip}:8000" for ip in ips.values()))
    assert len(firsts) == (size if size > 1 else 0)  # every replica is some other's first choice


def test_pod_ips_are_canonical_and_invalid_ones_left_out() -> None:
    pods = [serving_pod(name) for name in ("a", "b", "c")]
    lists = peer_lists(observe(SPEC, pods), {"a": "FD00:0::a", "b": "127.0.0.1", "c": "10.0.0.3"})
    assert lists == {"a": ("10.0.0.3:8000",), "c": ("[fd00::a]:8000",)}


def test_a_step_costs_linear_time_in_the_pools_size() -> None:
    def seconds(size: int) -> float:
        pods = [serving_pod(f"p-{i}") for i in range(size)]
        ips = {f"p-{i}": f"10.2.{i // 200}.{i % 200 + 1}" for i in range(size)}
        observed = observe(make_spec(size), pods)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            peer_lists(observed, ips)
            best = min(best, time.perf_counter() - started)
        return best

    # Four times the replicas: about four times the work, where one list per replica built from all
    # the others (quadratic) would be sixteen.
    assert seconds(4000) < 8 * seconds(1000)


def test_replicas_of_another_judge_revision_are_never_peers() -> None:
    pods = [serving_pod("a-0", judge="aaa"), serving_pod("a-1", judge="aaa"), serving_pod("b-0", judge="bbb"),
            serving_pod("b-1", judge="bbb")]
    ips = {p.name: f"10.0.2.{i}" for i, p in enumerate(pods)}
    lists = peer_lists(observe(SPEC, pods), ips)
    assert lists == {"a-0": ("10.0.2.1:8000",), "a-1": ("10.0.2.0:8000",), "b-0": ("10.0.2.3:8000",),
                     "b-1": ("10.0.2.2:8000",)}


def test_a_gateway_fenced_for_a_judge_switch_is_told_the_active_revisions_replicas() -> None:
    pods = [serving_pod("old-0", judge="aaa"), serving_pod("new-0", judge="bbb"), serving_pod("new-1", judge="bbb")]
    sidecars = {p.name: serving_sidecar() for p in pods}
    sidecars["old-0"] = serving_sidecar(state=DrainState.FENCED, reason=DrainReason.JUDGE_SWITCHED)
    ips = {p.name: f"10.0.3.{i}" for i, p in enumerate(pods)}
    status = GenRMPoolStatus.model_validate({"judge": {"active": "bbb"}})
    lists = peer_lists(observe(SPEC, pods, sidecars, status=status), ips)
    assert sorted(lists["old-0"]) == ["10.0.3.1:8000", "10.0.3.2:8000"]
    assert lists["new-0"] == ("10.0.3.2:8000",) and lists["new-1"] == ("10.0.3.1:8000",)

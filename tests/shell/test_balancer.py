"""``PoolBalancer``: the load-spread loop around the pure rules.

Aspects under test: idle (no sidecar call) with one published replica or no client anywhere; a round
asks the replica above the fair ceiling for its excess, once, with a fresh shed id; a round in which
one published replica does not answer decides nothing; replicas that are not serving or whose engine
is unhealthy take no part; connections being handed back count in the pool's total;
closing stops the loop.
"""

from __future__ import annotations

import asyncio

from genrm_contract.sidecar import DrainState, EngineReport, HandBack, ShedAnswer, ShedRequest, StateDocument
from genrm_operator.shell.balancer import PoolBalancer
from genrm_operator.shell.sidecar import Endpoint


def doc(connections: int, state: DrainState = DrainState.SERVING, admitted: int = 0, handing_back: int = 0,
        healthy: bool = True) -> StateDocument:
    return StateDocument(
        state=state, drain_id=None, inflight=0, admitted_total=admitted, completed_total=admitted, refused_total=0,
        engine=EngineReport(up=True, healthy=healthy, running_requests=0, queued_requests=0, token_usage=0.0),
        idle_since_seconds=None, client_connections=connections, handing_back=handing_back, boot_id="b", version=1)


class Sidecars:
    """Reports by address, set by the test (None: no answer); shed calls recorded."""

    def __init__(self, reports: dict[str, StateDocument | None]) -> None:
        self.reports = reports
        self.asked: list[str] = []
        self.sheds: list[tuple[str, ShedRequest]] = []

    async def state(self, ep: Endpoint, version: int | None = None, wait_seconds: float = 0.0) -> StateDocument | None:
        self.asked.append(ep.ip)
        return self.reports[ep.ip]

    async def shed(self, ep: Endpoint, request: ShedRequest) -> ShedAnswer | None:
        self.sheds.append((ep.ip, request))
        return ShedAnswer(shed_id=request.shed_id, marked=request.connections)


def endpoints(*ips: str) -> dict[str, Endpoint]:
    return {f"p-{i}": Endpoint(ip, 8001, "t") for i, ip in enumerate(ips)}


def run(scenario: object) -> None:
    asyncio.run(scenario)  # type: ignore[arg-type]


def test_idle_without_two_published_replicas_or_without_clients() -> None:
    async def scenario() -> None:
        sidecars = Sidecars({"a": doc(9), "b": doc(0)})
        balancer = PoolBalancer(sidecars, "ns", "pool")  # type: ignore[arg-type]
        balancer.follow(endpoints("a"), {"p-0": doc(9)})
        await asyncio.sleep(0.05)
        balancer.follow(endpoints("a", "b"), {"p-0": doc(0), "p-1": doc(0)})
        await asyncio.sleep(0.05)
        assert sidecars.asked == [] and not balancer.active
        await balancer.close()
    run(scenario())


def test_a_round_asks_the_crowded_replica_for_its_excess_once() -> None:
    async def scenario() -> None:
        sidecars = Sidecars({"a": doc(22), "b": doc(0), "c": doc(0), "d": doc(0)})
        balancer = PoolBalancer(sidecars, "ns", "pool")  # type: ignore[arg-type]
        balancer.follow(endpoints("a", "b", "c", "d"), {"p-0": doc(22)})
        await asyncio.sleep(0.2)
        assert sorted(set(sidecars.asked)) == ["a", "b", "c", "d"]
        assert [(ip, r.connections, r.reason) for ip, r in sidecars.sheds] == [("a", 17, HandBack.BALANCE)]
        # The next round comes while the marked connections still finish their requests: they count
        # in the pool's total, so nothing more is shed for connections on their way.
        sidecars.reports.update(a=doc(5, handing_back=17), b=doc(0), c=doc(0), d=doc(0))
        await balancer.round()
        assert len(sidecars.sheds) == 1
        # The clients reconnected and kube-proxy spread them: even within one, nothing more to do.
        sidecars.reports.update(a=doc(6), b=doc(6), c=doc(5), d=doc(5))
        await balancer.round()
        assert len(sidecars.sheds) == 1
        sidecars.reports.update(a=doc(22), b=doc(0), c=doc(0), d=doc(0))  # crowded again: a new shed id
        await balancer.round()
        assert len({r.shed_id for _, r in sidecars.sheds}) == len(sidecars.sheds) == 2
        await balancer.close()
    run(scenario())


def test_a_round_with_a_silent_replica_decides_nothing_and_draining_ones_take_no_part() -> None:
    async def scenario() -> None:
        sidecars = Sidecars({"a": doc(22), "b": None})
        balancer = PoolBalancer(sidecars, "ns", "pool")  # type: ignore[arg-type]
        balancer.follow(endpoints("a", "b"), {"p-0": doc(22)})
        for _ in range(2):
            await balancer.round()
        assert sidecars.sheds == []
        sidecars.reports["b"] = doc(0, state=DrainState.SOFT_DRAIN)
        for _ in range(2):
            await balancer.round()
        assert sidecars.sheds == [], "one serving replica: nothing to balance against"
        # An unhealthy engine makes its replica unready: kube-proxy places nothing there, so it must
        # not count in the fair share (the others would shed for ever).
        sidecars.reports.update(a=doc(11), b=doc(0, healthy=False))
        await balancer.round()
        assert sidecars.sheds == []
        await balancer.close()
    run(scenario())

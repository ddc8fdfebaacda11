"""``PeerPusher``: every gateway of a pool is told its peers, again when they change or it restarts.

Aspects under test: each replica gets its list once (no push while what it holds is what it should
hold); a changed list and a new boot id are pushed again; versions grow with every push; a gateway
that does not answer is retried; one that holds a newer push (from an operator whose clock ran
ahead) is outranked by the next push; one older than peers (404) is asked again only when its list
changes or it restarts; a replica no longer followed is not pushed to; closing stops
the pushes.
"""

from __future__ import annotations

import asyncio

import pytest
from genrm_contract.peers import PeersDocument
from genrm_contract.sidecar import DrainState, EngineReport, StateDocument
from genrm_operator.shell import peers as peers_module
from genrm_operator.shell.peers import PeerPusher
from genrm_operator.shell.sidecar import Endpoint, PeersUnknown


def report(boot_id: str) -> StateDocument:
    return StateDocument(
        state=DrainState.SERVING, drain_id=None, inflight=0, admitted_total=0, completed_total=0, refused_total=0,
        engine=EngineReport(up=True, healthy=True, running_requests=0, queued_requests=0, token_usage=0.0),
        idle_since_seconds=None, boot_id=boot_id, version=1)


class Gateways:
    """Fake sidecars keeping the newest document each was pushed; ``down`` ones do not answer."""

    def __init__(self) -> None:
        self.held: dict[str, PeersDocument] = {}
        self.pushes: list[tuple[str, PeersDocument]] = []
        self.down: set[str] = set()
        self.old: set[str] = set()
        """Gateways older than peers (404)."""

    async def peers(self, ep: Endpoint, document: PeersDocument) -> PeersDocument | None:
        self.pushes.append((ep.ip, document))
        if ep.ip in self.old:
            raise PeersUnknown(ep.ip)
        if ep.ip in self.down:
            return None
        held = self.held.get(ep.ip)
        if held is None or document.version >= held.version:
            self.held[ep.ip] = held = document
        return held


ENDPOINTS = {"a": Endpoint("10.0.0.1", 8001, "t"), "b": Endpoint("10.0.0.2", 8001, "t")}
LISTS = {"a": ("10.0.0.2:8000",), "b": ("10.0.0.1:8000",)}


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_each_gateway_is_told_once_then_again_on_a_change_or_a_restart() -> None:
    async def scenario() -> None:
        gateways = Gateways()
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        reports = {"a": report("boot-a"), "b": report("boot-b")}
        pusher.follow(LISTS, ENDPOINTS, reports)
        await settle()
        assert {ip: d.peers for ip, d in gateways.held.items()} == {"10.0.0.1": LISTS["a"], "10.0.0.2": LISTS["b"]}
        pusher.follow(LISTS, ENDPOINTS, reports)
        await settle()
        assert len(gateways.pushes) == 2  # nothing new to tell
        pusher.follow({**LISTS, "a": ()}, ENDPOINTS, reports)
        await settle()
        assert gateways.held["10.0.0.1"].peers == () and len(gateways.pushes) == 3
        del gateways.held["10.0.0.2"]  # b restarted: it holds nothing, and reports a new boot id
        pusher.follow({**LISTS, "a": ()}, ENDPOINTS, {**reports, "b": report("boot-b2")})
        await settle()
        assert gateways.held["10.0.0.2"].peers == LISTS["b"] and len(gateways.pushes) == 4
        versions = [d.version for _, d in gateways.pushes]
        assert versions == sorted(set(versions))
        await pusher.close()

    asyncio.run(scenario())


def test_a_silent_gateway_is_retried_and_a_newer_push_is_outranked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "RETRY_SECONDS", 0.01)

    async def scenario() -> None:
        gateways = Gateways()
        gateways.down.add("10.0.0.1")
        ahead = PeersDocument(version=2**62, peers=("10.9.9.9:8000",))
        gateways.held["10.0.0.2"] = ahead  # told by an operator whose clock ran far ahead
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        pusher.follow(LISTS, ENDPOINTS, {})
        await asyncio.sleep(0.05)
        assert gateways.held["10.0.0.2"].peers == LISTS["b"] and gateways.held["10.0.0.2"].version > ahead.version
        tries = sum(1 for ip, _ in gateways.pushes if ip == "10.0.0.1")
        assert tries >= 2 and "10.0.0.1" not in gateways.held
        gateways.down.clear()
        await asyncio.sleep(0.05)
        assert gateways.held["10.0.0.1"].peers == LISTS["a"]
        pusher.follow({}, {}, {})  # the pods are gone: nothing more is pushed
        count = len(gateways.pushes)
        await asyncio.sleep(0.05)
        assert len(gateways.pushes) == count
        await pusher.close()

    asyncio.run(scenario())


def test_a_gateway_older_than_peers_is_asked_once_per_list_or_restart() -> None:
    async def scenario() -> None:
        gateways = Gateways()
        gateways.old.add("10.0.0.1")
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        reports = {"a": report("boot-a")}
        for _ in range(3):
            pusher.follow({"a": LISTS["a"]}, ENDPOINTS, reports)
            await asyncio.sleep(0.02)
        assert len(gateways.pushes) == 1
        pusher.follow({"a": LISTS["a"]}, ENDPOINTS, {"a": report("boot-a2")})
        await asyncio.sleep(0.02)
        assert len(gateways.pushes) == 2
        await pusher.close()

    asyncio.run(scenario())


def test_closing_stops_a_retrying_push() -> None:
    async def scenario() -> None:
        gateways = Gateways()
        gateways.down.add("10.0.0.1")
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        pusher.follow({"a": LISTS["a"]}, ENDPOINTS, {})
        await settle()
        await pusher.close()
        count = len(gateways.pushes)
        await asyncio.sleep(0.05)
        assert len(gateways.pushes) == count

    asyncio.run(scenario())

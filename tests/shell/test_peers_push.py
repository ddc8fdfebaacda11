"""``PeerPusher``: every gateway of a pool is told its peers, again when they change or it restarts.

Aspects under test: each replica gets its list once (no push while what it holds is what it should
hold); a changed list and a new boot id are pushed again; versions grow with every push; a gateway
that does not answer is retried, less and less often, and logged once; one that holds a newer push
(from an operator whose clock ran ahead) is outranked by the next push, one holding the highest
version too, and two operators outbidding each other slow down; one older than peers (404) is
asked again only when its list changes or it restarts; a replica no longer followed is not pushed
to; closing stops the pushes; the client does not log each failed push.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from genrm_contract.peers import MAX_VERSION, PeersDocument
from genrm_contract.sidecar import DrainState, EngineReport, StateDocument
from genrm_operator.shell import peers as peers_module
from genrm_operator.shell.peers import PeerPusher
from genrm_operator.shell.sidecar import Endpoint, PeersUnknown, SidecarClient
from genrm_testing import free_port


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


@pytest.fixture(autouse=True)
def no_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changed lists go at once here; `test_a_changed_list_waits_and_goes_once` tests the wait."""
    monkeypatch.setattr(peers_module, "SETTLE_SECONDS", 0.0)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def told_their_first_lists() -> tuple[Gateways, PeerPusher, dict[str, StateDocument]]:
    """Both gateways followed and told their first lists (`LISTS`)."""
    gateways = Gateways()
    pusher = PeerPusher(gateways)  # type: ignore[arg-type]
    reports = {"a": report("boot-a"), "b": report("boot-b")}
    pusher.follow(LISTS, ENDPOINTS, reports)
    await settle()
    return gateways, pusher, reports


def test_each_gateway_is_told_once_then_again_on_a_change_or_a_restart() -> None:
    async def scenario() -> None:
        gateways, pusher, reports = await told_their_first_lists()
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


def test_a_changed_list_waits_and_goes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first list goes at once; changes within ``SETTLE_SECONDS`` of each other are one push of the
    last; a restarted gateway is told at once, and so is a list replaced whole (a judge switch hands
    the previous revision's gateways the new revision's replicas)."""
    monkeypatch.setattr(peers_module, "SETTLE_SECONDS", 0.05)

    async def scenario() -> None:
        gateways, pusher, reports = await told_their_first_lists()
        assert len(gateways.pushes) == 2, "first lists go at once"
        for peers in (("10.0.0.2:8000", "10.0.0.3:8000"), ("10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"),
                      ("10.0.0.2:8000", "10.0.0.4:8000")):
            pusher.follow({**LISTS, "a": peers}, ENDPOINTS, reports)
            await settle()
        assert len(gateways.pushes) == 2, "a changed list waits"
        await asyncio.sleep(0.1)
        assert gateways.pushes[2:] == [("10.0.0.1", gateways.held["10.0.0.1"])]
        assert gateways.held["10.0.0.1"].peers == ("10.0.0.2:8000", "10.0.0.4:8000"), "one push, of the last list"
        del gateways.held["10.0.0.2"]
        pusher.follow({**LISTS, "a": ("10.0.0.2:8000", "10.0.0.4:8000")}, ENDPOINTS,
                      {**reports, "b": report("boot-b2")})
        await settle()
        assert gateways.held["10.0.0.2"].peers == LISTS["b"], "a restarted gateway is told at once"
        pusher.follow({**LISTS, "a": ("10.0.0.5:8000",)}, ENDPOINTS, {**reports, "b": report("boot-b2")})
        await settle()
        assert gateways.held["10.0.0.1"].peers == ("10.0.0.5:8000",), "a list replaced whole is told at once"
        await pusher.close()

    asyncio.run(scenario())


def test_a_silent_gateway_is_retried_and_a_newer_push_is_outranked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "RETRY_SECONDS", (0.01, 0.01))

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


class Yielding(Gateways):
    """Fake sidecars that, like a real call, let the event loop run while a push is answered."""

    async def peers(self, ep: Endpoint, document: PeersDocument) -> PeersDocument | None:
        await asyncio.sleep(0)
        return await super().peers(ep, document)


def test_a_silent_gateway_is_asked_less_and_less_often_and_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(peers_module, "RETRY_SECONDS", (0.01, 0.16))

    async def scenario() -> None:
        gateways = Yielding()
        gateways.down.add("10.0.0.1")
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        pusher.follow({"a": LISTS["a"]}, ENDPOINTS, {})
        await asyncio.sleep(0.6)
        tries = len(gateways.pushes)
        assert 3 <= tries <= 10  # 0, 0.01, 0.03, 0.07, 0.15, then every 0.16 s; not every 0.01 s
        gateways.down.clear()
        await asyncio.sleep(0.3)
        assert gateways.held["10.0.0.1"].peers == LISTS["a"]
        await pusher.close()

    with caplog.at_level(logging.INFO, logger="genrm_operator"):
        asyncio.run(scenario())
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == 1


def test_a_gateway_holding_the_highest_version_is_still_told() -> None:
    async def scenario() -> None:
        gateways = Yielding()
        gateways.held["10.0.0.2"] = PeersDocument(version=MAX_VERSION, peers=("10.9.9.9:8000",))
        pusher = PeerPusher(gateways)  # type: ignore[arg-type]
        pusher.follow(LISTS, ENDPOINTS, {})
        await asyncio.sleep(0.6)  # the first push finds the newer one, the next outranks it after a pause
        assert gateways.held["10.0.0.2"].peers == LISTS["b"] and gateways.held["10.0.0.1"].peers == LISTS["a"]
        pusher.follow({**LISTS, "a": ()}, ENDPOINTS, {})  # later pushes still go out, and are taken
        await asyncio.sleep(0.05)
        assert gateways.held["10.0.0.1"].peers == ()
        await pusher.close()

    asyncio.run(scenario())


class Crossing(Gateways):
    """A fake sidecar whose answer takes a round trip, during which another push may land: the
    answer is the document held when it leaves."""

    async def peers(self, ep: Endpoint, document: PeersDocument) -> PeersDocument | None:
        await super().peers(ep, document)
        await asyncio.sleep(0.005)
        return self.held[ep.ip]


def test_two_operators_outbidding_each_other_slow_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "RETRY_SECONDS", (0.01, 0.16))

    async def scenario() -> None:
        gateways = Crossing()
        mine, theirs = PeerPusher(gateways), PeerPusher(gateways)  # type: ignore[arg-type]
        mine.follow({"a": LISTS["a"]}, ENDPOINTS, {})
        theirs.follow({"a": ("10.0.0.3:8000",)}, ENDPOINTS, {})
        await asyncio.sleep(0.6)
        assert len(gateways.pushes) <= 20
        await mine.close()
        await theirs.close()

    asyncio.run(scenario())


def test_the_client_does_not_log_each_failed_push(caplog: pytest.LogCaptureFixture) -> None:
    async def pushes() -> list[PeersDocument | None]:
        client = SidecarClient()
        try:
            closed = Endpoint("127.0.0.1", free_port(), "t")
            return [await client.peers(closed, PeersDocument(version=1)) for _ in range(3)]
        finally:
            await client.close()

    with caplog.at_level(logging.INFO, logger="genrm_operator"):
        assert asyncio.run(pushes()) == [None, None, None]
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []

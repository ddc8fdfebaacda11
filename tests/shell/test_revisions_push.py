"""``RevisionTeller``: every gateway of a pool is told the pool's judge revisions (its revision
document), once, and again when they change or the gateway restarts.

Aspects under test: nothing is told before the pool has a recorded judge; each gateway gets the
revisions once; a change of the preview or the active revision and a new boot id are told again; a
gateway that could not be reached is told again at the next step; a replica no longer followed is
forgotten, and told again when it is followed again.
"""

from __future__ import annotations

import asyncio
from typing import cast

from genrm_contract.revisions import RevisionsDocument
from genrm_operator.shell.revisions import RevisionTeller
from genrm_operator.shell.sidecar import Endpoint, SidecarClient

from .test_peers_push import report


class Gateways:
    """Fake sidecars recording every push; ``down`` ones cannot be reached."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, RevisionsDocument]] = []
        self.down: set[str] = set()

    async def revisions(self, ep: Endpoint, document: RevisionsDocument) -> bool:
        self.pushes.append((ep.ip, document))
        return ep.ip not in self.down


ENDPOINTS = {"a": Endpoint("10.0.0.1", 8001, "t"), "b": Endpoint("10.0.0.2", 8001, "t")}


def test_each_gateway_is_told_once_and_again_when_the_revisions_change_or_it_restarts() -> None:
    async def scenario() -> list[list[tuple[str, RevisionsDocument]]]:
        gateways = Gateways()
        teller = RevisionTeller(cast(SidecarClient, gateways))
        reports = {"a": report("boot-a"), "b": report("boot-b")}
        rounds = []

        async def step(revisions: tuple[str, str | None] | None, endpoints: dict[str, Endpoint] = ENDPOINTS) -> None:
            gateways.pushes.clear()
            teller.follow(revisions, endpoints, reports)
            await asyncio.sleep(0.01)
            rounds.append(sorted(gateways.pushes))

        await step(None)
        await step(("aaa", None))
        await step(("aaa", None))
        await step(("aaa", "bbb"))
        reports["b"] = report("boot-b2")
        await step(("aaa", "bbb"))
        gateways.down.add("10.0.0.1")
        await step(("bbb", None))
        await step(("bbb", None))
        gateways.down.clear()
        await step(("bbb", None))
        await step(("bbb", None), {"b": ENDPOINTS["b"]})
        await step(("bbb", None))
        await teller.close()
        return rounds

    rounds = asyncio.run(scenario())
    first, both = RevisionsDocument(active="aaa"), RevisionsDocument(active="aaa", preview="bbb")
    after = RevisionsDocument(active="bbb")
    assert rounds[0] == [], "no recorded judge: nothing told"
    assert rounds[1] == [("10.0.0.1", first), ("10.0.0.2", first)] and rounds[2] == []
    assert rounds[3] == [("10.0.0.1", both), ("10.0.0.2", both)]
    assert rounds[4] == [("10.0.0.2", both)], "a restarted gateway knows nothing"
    assert rounds[5] == [("10.0.0.1", after), ("10.0.0.2", after)]
    assert rounds[6] == [("10.0.0.1", after)], "not reached: told again at the next step"
    assert rounds[7] == [("10.0.0.1", after)] and rounds[8] == []
    assert rounds[9] == [("10.0.0.1", after)], "a replica followed again is told again"

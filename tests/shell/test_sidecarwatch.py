"""``SidecarWatch``: the per-replica long polls a step reads instead of asking every sidecar.

Aspects under test: a replica's first report is awaited by the step that first sees it; a change of
what the core decides on wakes the reconciler and shows in the next step, a change of load alone
does not wake it; a failed poll makes the replica unknown (never drained) and is retried; a drain
call's answer counts as a report and an older answer arriving later never replaces it; a replica
that is gone (or moved to another address) stops being followed; a gateway without versions (older
than the long poll) is polled once a second instead of in a tight loop.
"""

from __future__ import annotations

import asyncio

import pytest
from genrm_contract.sidecar import DrainState, EngineReport, StateDocument
from genrm_operator.core.model import SidecarView
from genrm_operator.shell import sidecarwatch
from genrm_operator.shell.sidecar import Endpoint
from genrm_operator.shell.sidecarwatch import SidecarWatch


def doc(state: DrainState = DrainState.SERVING, version: int = 1, inflight: int = 0, boot: str = "b1") -> StateDocument:
    return StateDocument(
        state=state, drain_id=None if state is DrainState.SERVING else "d", inflight=inflight, admitted_total=0,
        completed_total=0, refused_total=0,
        engine=EngineReport(up=True, healthy=True, running_requests=0, queued_requests=0, token_usage=0.0),
        idle_since_seconds=None, boot_id=boot, version=version)


class ScriptedSidecars:
    """Each replica's reports come from a queue the test fills; a poll waits for the next one."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[StateDocument | None]] = {}
        self.asked: list[tuple[str, int | None]] = []

    def queue(self, ip: str) -> asyncio.Queue[StateDocument | None]:
        return self.queues.setdefault(ip, asyncio.Queue())

    async def state(self, ep: Endpoint, version: int | None = None, wait_seconds: float = 0.0) -> StateDocument | None:
        self.asked.append((ep.ip, version))
        return await self.queue(ep.ip).get()


def endpoint(ip: str) -> Endpoint:
    return Endpoint(ip, 8001, "token")


def test_reports_changes_and_failures_as_the_core_needs_them() -> None:
    async def scenario() -> None:
        sidecars = ScriptedSidecars()
        wakes: list[int] = []
        watch = SidecarWatch(sidecars, lambda: wakes.append(1))  # type: ignore[arg-type]
        eps = {"p-0": endpoint("10.0.0.1")}
        sidecars.queue("10.0.0.1").put_nowait(doc(version=1))
        assert await watch.views(eps) == {"p-0": SidecarView(DrainState.SERVING, 0, True)}, "first report awaited"
        await asyncio.sleep(0.01)
        assert sidecars.asked == [("10.0.0.1", None), ("10.0.0.1", 1)], "then a long poll on the version it knows"
        wakes.clear()

        sidecars.queue("10.0.0.1").put_nowait(doc(version=1, inflight=5))  # a timed-out poll with new load
        await asyncio.sleep(0.01)
        assert wakes == [] and (await watch.views(eps))["p-0"] == SidecarView(DrainState.SERVING, 5, True)

        sidecars.queue("10.0.0.1").put_nowait(doc(DrainState.SOFT_DRAIN, version=2))
        await asyncio.sleep(0.01)
        assert wakes == [1] and (await watch.views(eps))["p-0"].state is DrainState.SOFT_DRAIN  # type: ignore[union-attr]

        # The drain call's answer (version 4) arrives before the poll's older one (version 3).
        watch.offer("p-0", doc(DrainState.FENCED, version=4))
        sidecars.queue("10.0.0.1").put_nowait(doc(DrainState.SOFT_DRAIN, version=3))
        await asyncio.sleep(0.01)
        assert (await watch.views(eps))["p-0"].state is DrainState.FENCED  # type: ignore[union-attr]

        wakes.clear()
        sidecars.queue("10.0.0.1").put_nowait(None)  # the poll failed
        await asyncio.sleep(0.01)
        assert wakes == [1] and (await watch.views(eps))["p-0"] is None, "unknown, never drained"
        sidecars.queue("10.0.0.1").put_nowait(doc(DrainState.SERVING, version=1, boot="b2"))  # restarted gateway
        await asyncio.sleep(0.4)  # past the first retry delay
        assert (await watch.views(eps))["p-0"] == SidecarView(DrainState.SERVING, 0, True)
        assert sidecars.asked[-1] == ("10.0.0.1", 1) and ("10.0.0.1", None) in sidecars.asked[-3:]
        await watch.close()

    asyncio.run(scenario())


def test_gone_and_moved_replicas_stop_being_followed() -> None:
    async def scenario() -> None:
        sidecars = ScriptedSidecars()
        watch = SidecarWatch(sidecars, lambda: None)  # type: ignore[arg-type]
        for ip in ("10.0.0.1", "10.0.0.2"):
            sidecars.queue(ip).put_nowait(doc(version=1))
        views = await watch.views({"p-0": endpoint("10.0.0.1"), "p-1": endpoint("10.0.0.2")})
        assert set(views) == {"p-0", "p-1"}
        # p-1 is gone; p-0 was recreated at another address: its old report must not stand for the new pod.
        moved = asyncio.ensure_future(watch.views({"p-0": endpoint("10.0.0.3")}))
        await asyncio.sleep(0.05)
        assert not moved.done(), "the moved replica's first report is awaited"
        sidecars.queue("10.0.0.3").put_nowait(doc(DrainState.FENCED, version=1))
        assert (await moved) == {"p-0": SidecarView(DrainState.FENCED, 0, True)}
        tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("sidecar-watch")]
        assert [t.get_name() for t in tasks] == ["sidecar-watch p-0"]
        await watch.close()
        await asyncio.sleep(0)
        assert all(t.done() for t in tasks)

    asyncio.run(scenario())


def test_a_gateway_without_versions_is_polled_not_hammered(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older gateway answers a long poll at once and without a version: asked again after a pause."""
    monkeypatch.setattr(sidecarwatch, "POLL_SECONDS", 0.1)

    async def scenario() -> None:
        sidecars = ScriptedSidecars()
        watch = SidecarWatch(sidecars, lambda: None)  # type: ignore[arg-type]
        old = doc().model_copy(update={"boot_id": None, "version": None})
        for _ in range(50):
            sidecars.queue("10.0.0.1").put_nowait(old)
        await watch.views({"p-0": endpoint("10.0.0.1")})
        await asyncio.sleep(0.35)
        assert 2 <= len(sidecars.asked) <= 5 and all(version is None for _, version in sidecars.asked)
        await watch.close()

    asyncio.run(scenario())

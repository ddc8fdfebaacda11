"""``PoolObserver.read_pool``: which copy of the pool a step decides on.

Aspects under test: the first step reads from the API server; later steps take the watch's copy
without a request, or the answer to the reconciler's own last status write while the watch has not
shown it yet; after a Conflict the next step reads again; resourceVersions that are not integers
are never ordered, so each step reads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from genrm_operator.shell.observer import PoolObserver
from genrm_operator.shell.reconciler import PoolReconciler


def pool(version: str, replicas: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "judge", "namespace": "ml", "resourceVersion": version},
            "spec": {"replicas": replicas}}


class CountingKube:
    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored, self.gets = stored, 0

    async def get_pool(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        return self.stored


def reconciler(kube: CountingKube, watched: list[dict[str, Any] | None]) -> PoolObserver:
    async def post(*_: Any) -> None: ...
    return PoolReconciler(kube, None, post, "ml", "judge", list, list,  # type: ignore[arg-type]
                          lambda: watched[0]).observer


def test_the_watch_copy_is_used_after_the_first_read_and_an_own_newer_write_wins() -> None:
    async def scenario() -> None:
        kube = CountingKube(pool("10"))
        watched: list[dict[str, Any] | None] = [pool("9")]
        r = reconciler(kube, watched)
        assert (await r.read_pool()) == pool("10") and kube.gets == 1, "the first step reads"
        watched[0] = pool("10")
        assert (await r.read_pool()) == pool("10") and kube.gets == 1, "then the watch's copy"
        r.written = pool("12")  # this process wrote the status; the watch is still at 11
        watched[0] = pool("11", replicas=3)
        assert (await r.read_pool()) == pool("12") and kube.gets == 1
        watched[0] = pool("13", replicas=3)  # the watch caught up, with a later change of another writer
        assert (await r.read_pool()) == pool("13", replicas=3) and kube.gets == 1
        r.refresh = True  # as after a Conflict
        assert (await r.read_pool()) == pool("10") and kube.gets == 2

    asyncio.run(scenario())


def test_versions_that_are_not_integers_are_never_ordered() -> None:
    async def scenario() -> None:
        kube = CountingKube(pool("b"))
        r = reconciler(kube, [pool("a")])
        await r.read_pool()
        r.written = pool("c")
        assert (await r.read_pool()) == pool("b") and (await r.read_pool()) == pool("b") and kube.gets == 3

    asyncio.run(scenario())

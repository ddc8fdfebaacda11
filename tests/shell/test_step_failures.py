"""A failing reconcile step in a real ``PoolReconciler`` (fake API server).

Aspects under test: each failure logs one line with the pool, the stage, the error's class and
message, its traceback only the first time in a row; the retry waits a doubling back-off (events
still wake it); from the third failure in a row the status shows ``ReconcileFailed=True``, and the
first step that succeeds writes the status without it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from genrm_operator.core import retry
from genrm_operator.shell import reconciler as shell

from .test_autoscaler_shell import Harness, pool


class Flaky:
    """The pod source of a harness, failing while ``broken``."""

    def __init__(self, h: Harness) -> None:
        self.h, self.broken, self.calls = h, True, 0

    def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.broken:
            raise RuntimeError("pod index\nunavailable")
        return list(self.h.kube.pods)


def harness() -> tuple[Harness, Flaky]:
    h = Harness(pool(1, mode="Off"), replicas=1, inflight=0)
    flaky = Flaky(h)
    h.reconciler.observer.pods = flaky
    return h, flaky


def failed_condition(h: Harness) -> dict[str, Any] | None:
    conditions = (h.kube.pool.get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "ReconcileFailed"), None)


async def test_failures_log_one_line_each_show_when_repeated_and_clear_on_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    h, flaky = harness()
    caplog.set_level(logging.WARNING, logger=shell.__name__)
    for _ in range(retry.REPEATED_FAILURES - 1):
        assert await h.reconciler.guarded_step()
    assert failed_condition(h) is None, "one or two failures are not shown"
    lines = [r for r in caplog.records if r.name == shell.__name__]
    assert len(lines) == 2
    assert lines[0].getMessage() == ("reconcile of ml/judge failed in stage observe (1 in a row, retry in 1s): "
                                     "RuntimeError: pod index unavailable")
    assert lines[0].exc_info is not None and lines[1].exc_info is None, "one traceback for the row"
    assert "(2 in a row, retry in 2s)" in lines[1].getMessage()

    assert await h.reconciler.guarded_step()
    c = failed_condition(h)
    assert c is not None and c["status"] == "True" and c["reason"] == "ReconcileError"
    assert c["observedGeneration"] == 1 and "observe: RuntimeError: pod index unavailable" in c["message"]
    writes = h.kube.status_writes
    await h.reconciler.guarded_step()
    assert h.kube.status_writes == writes, "the same failure again writes nothing"

    flaky.broken = False
    await h.reconciler.guarded_step()
    assert failed_condition(h) is None and h.reconciler.failures.count == 0
    assert [c["type"] for c in h.kube.pool["status"]["conditions"]] == ["Available", "Progressing", "Degraded"]


async def test_a_failing_step_is_retried_after_a_doubling_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "RETRY_BASE_SECONDS", 0.1)
    h, flaky = harness()
    task = asyncio.create_task(h.reconciler.run(lambda: False))
    await asyncio.sleep(1.0)   # steps at 0, 0.1, 0.3, 0.7 (then 1.5): not once per 1 s resync nor at once
    assert flaky.calls == 4
    h.reconciler.wake.set()    # an event does not wait for the back-off
    await asyncio.sleep(0.3)
    assert flaky.calls == 5
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

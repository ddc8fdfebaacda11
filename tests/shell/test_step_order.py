"""When a ``PoolReconciler`` writes and when it acts, on a fake API server whose watch never catches up.

Aspects under test: a step that only wrote the status (a scale-in's victims) is followed at once by
the step that unpublishes, without waiting for the watch's echo of the write or the resync; that
immediate step happens once per wake, so a status that changed at every step cannot loop; the
watch showing the reconciler's own status write wakes nothing unless no step followed that write;
publishes and verification probes run beside the status write, not after it; other actions wait
for a write that records decisions and run beside one that only updates counts, except creates: a
due create writes even an unchanged status first, for its Conflict; counts alone wait for the
operation's next write, at most the report delay; an action the watch has not shown yet is not sent
again.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

import pytest
from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.core import model
from genrm_operator.core import reconcile as core
from genrm_operator.core.model import Action, CreatePod, Event, Plan, SetPublished, Verify
from genrm_operator.core.names import PUBLISHED_LABEL
from genrm_operator.shell import reconciler as shell
from genrm_operator.shell.expectations import Expectations
from genrm_operator.shell.kube import Conflict
from genrm_operator.shell.reconciler import PoolReconciler
from genrm_operator.shell.sidecarwatch import SidecarWatch

from .test_autoscaler_shell import NS, POOL, FakeKube, FakeSidecars, pool, service_slices, serving_pod


class RecordingKube(FakeKube):
    """Records the order of status writes, pod creates and pod label patches."""

    def __init__(self, manifest: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        super().__init__(manifest, pods)
        self.calls: list[tuple[str, float]] = []
        self.gating: list[bool] = []
        """Whether each status write was one that actions wait for (`writeorder`)."""

    async def write_status(self, pool: dict[str, Any], status: dict[str, Any], gating: bool = False) -> dict[str, Any]:
        self.calls.append(("status", time.monotonic()))
        self.gating.append(gating)
        return await super().write_status(pool, status)

    async def patch_pod_meta(self, namespace: str, name: str, uid: str, labels: dict[str, str],
                             annotations: dict[str, str]) -> None:
        self.calls.append((f"patch {name} {labels}", time.monotonic()))

    async def create(self, manifest: dict[str, Any]) -> bool:
        if manifest["kind"] == "Pod":  # the pool's Secret, Service and PDB are made before the step decides
            self.calls.append((f"create {manifest['metadata']['name']}", time.monotonic()))
        return True


def frozen_reconciler(kube: FakeKube) -> PoolReconciler:
    """The watch shows the pool as it was at the start, for good, and the sidecars' reports wake no
    step: only the reconciler itself and its resync can start one."""
    first = copy.deepcopy(kube.pool)

    async def post(_: Any, __: Event) -> None: ...
    reconciler = PoolReconciler(kube, FakeSidecars(), post, NS, POOL,  # type: ignore[arg-type]
                                lambda: copy.deepcopy(kube.pods), lambda: service_slices(kube.pods),
                                lambda: copy.deepcopy(first))
    reconciler.watch = SidecarWatch(FakeSidecars(), lambda: None)  # type: ignore[arg-type]
    return reconciler


async def run_for(reconciler: PoolReconciler, seconds: float) -> None:
    """Let the reconciler run for ``seconds``, then stop it."""
    task = asyncio.create_task(reconciler.run(lambda: False))
    await asyncio.wait({task}, timeout=seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_scale_in_unpublishes_right_after_writing_its_victims() -> None:
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0), serving_pod(1)])
    reconciler = frozen_reconciler(kube)

    # Well within the active resync (the only other wake-up without a watch event).
    await run_for(reconciler, shell.ACTIVE_RESYNC_SECONDS / 2)
    unpublishes = [call for call, _ in kube.calls if call.startswith("patch") and "'false'" in call]
    assert unpublishes, kube.calls
    victims = kube.pool["status"]["operation"]["victims"]
    assert len(victims) == 1 and kube.calls[0][0] == "status", "the victims are written before anything is done"
    assert kube.status_writes == 1, "unpublishing writes nothing more: it is recorded once the watch shows it"
    assert kube.gating == [True], "the unpublish waits for that write: it goes before other pools' records"


def plan_with(monkeypatch: Any, change: Callable[[Any, GenRMPoolStatus], GenRMPoolStatus],
              actions: tuple[Action, ...] = ()) -> None:
    """Every step plans the core's status changed by ``change(observed, status)``, and ``actions``."""
    real = core.reconcile

    def planned(observed: Any) -> Plan:
        plan = real(observed)
        return Plan(status=change(observed, plan.status), actions=actions, events=(), decision=plan.decision)

    monkeypatch.setattr(shell, "reconcile", planned)


def write_after(monkeypatch: Any, kube: FakeKube, first: asyncio.Event) -> None:
    """The status write waits for ``first``: a step that waits for the write before ``first`` times out."""
    write_status = kube.write_status

    async def write(pool_: dict[str, Any], status: dict[str, Any], gating: bool = False) -> dict[str, Any]:
        await asyncio.wait_for(first.wait(), 2.0)
        return await write_status(pool_, status, gating)

    monkeypatch.setattr(kube, "write_status", write)


def new_ordinal(_: Any, status: GenRMPoolStatus) -> GenRMPoolStatus:
    """A decision at every step."""
    return status.evolve(next_ordinal=status.next_ordinal + 1)


async def test_a_status_that_changes_at_every_step_is_written_twice_per_wake_not_in_a_loop(monkeypatch: Any) -> None:
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    plan_with(monkeypatch, new_ordinal)
    await run_for(reconciler, shell.ACTIVE_RESYNC_SECONDS / 2)
    assert kube.status_writes == 2


def scaling_out(replicas: int) -> dict[str, Any]:
    """A pool wanting ``replicas`` whose recorded scale-out 1 -> 3 created its pod 1, not seen yet."""
    manifest = pool(replicas, mode="Off")
    manifest["status"] = {"nextOrdinal": 2, "operationCount": 1, "operation": {
        "id": "op-1", "type": "ScaleOut", "from": 1, "to": 3, "phase": "Provisioning",
        "startedAt": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z",
        "addedPods": [{"name": f"{POOL}-1", "ordinal": 1}]}}
    return manifest


async def test_publishes_and_probes_run_beside_the_status_write_and_other_actions_after_it(
        monkeypatch: Any) -> None:
    kube = RecordingKube(scaling_out(1), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    beside = asyncio.Event()
    patch = kube.patch_pod_meta

    async def verify(*_: Any) -> None:
        kube.calls.append(("verify", time.monotonic()))

    async def patch_then_release(namespace: str, name: str, uid: str, labels: dict[str, str],
                                 annotations: dict[str, str]) -> None:
        await asyncio.sleep(0)  # the probe has been sent by now, if it was not held back
        await patch(namespace, name, uid, labels, annotations)
        if labels.get(PUBLISHED_LABEL) == "true":
            beside.set()

    plan_with(monkeypatch, new_ordinal, (Verify(f"{POOL}-0", "uid-0", None), CreatePod(f"{POOL}-1", 1),
                                         SetPublished(f"{POOL}-2", "uid-2", True),
                                         SetPublished(f"{POOL}-0", "uid-0", False), CreatePod(f"{POOL}-3", 3)))
    monkeypatch.setattr(reconciler.executor, "verify", verify)
    monkeypatch.setattr(kube, "patch_pod_meta", patch_then_release)
    write_after(monkeypatch, kube, beside)
    await reconciler.step()
    calls = [call for call, _ in kube.calls]
    assert calls.index("status") == 2, calls
    assert set(calls[:2]) == {"verify", f"patch {POOL}-2 {{'genrm.io/published': 'true'}}"}
    assert set(calls[3:]) == {f"patch {POOL}-0 {{'genrm.io/published': 'false'}}", f"create {POOL}-1",
                              f"create {POOL}-3"}, \
        "an unpublish and every create, a retried one too (decided again on this step's spec), wait for the record"


class PreconditionKube(RecordingKube):
    """Refuses a status write bound to a resourceVersion other than the pool's, as the API server does."""

    async def write_status(self, pool_: dict[str, Any], status: dict[str, Any], gating: bool = False) -> dict[str, Any]:
        if pool_["metadata"]["resourceVersion"] != self.pool["metadata"]["resourceVersion"]:
            self.calls.append(("conflict", time.monotonic()))
            raise Conflict(POOL)
        return await super().write_status(pool_, status)


async def test_a_retried_create_writes_even_an_unchanged_status_first_and_its_conflict_cancels_it() -> None:
    """replicas 2 -> 6 was recorded (the write landed) but its creates were lost (a SIGKILL, a refused
    create); then the user went back to 2 while the watch still shows 6. The retries are decided
    on replicas 6 with nothing new to record: without a write, nothing could stop them."""
    recorded = pool(6, mode="Off")
    recorded["status"] = {"nextOrdinal": 6, "operationCount": 1, "operation": {
        "id": "op-1", "type": "ScaleOut", "from": 2, "to": 6, "phase": "Provisioning",
        "startedAt": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z",
        "addedPods": [{"name": f"{POOL}-{i}", "ordinal": i} for i in range(2, 6)]}}
    kube = PreconditionKube(recorded, [serving_pod(0), serving_pod(1)])
    reconciler = frozen_reconciler(kube)
    await reconciler.step()  # brings counts and conditions up to date; the fake's pods never appear
    settled = copy.deepcopy(kube.pool)
    reconciler.observer.watched = lambda: copy.deepcopy(settled)
    reconciler.executor.expected = Expectations()  # the retry window passed, or the operator restarted
    kube.calls.clear()
    await reconciler.step()
    creates = [f"create {POOL}-{i}" for i in range(2, 6)]
    assert [call for call, _ in kube.calls] == ["status", *creates], "an unchanged status, written for its Conflict"
    assert kube.pool["status"] == settled["status"]

    kube.pool["spec"]["replicas"] = 2  # the user goes back to 2; the watch has not shown it yet
    kube.pool["metadata"]["generation"] = 2
    kube.bump()
    reconciler.executor.expected = Expectations()
    kube.calls.clear()
    with pytest.raises(Conflict):
        await reconciler.step()
    assert [call for call, _ in kube.calls] == ["conflict"], "no GPU pod started for replicas 6 under replicas 2"


async def test_actions_run_beside_a_write_that_only_updates_counts(monkeypatch: Any) -> None:
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    await reconciler.step()  # the first step: the pool's status was empty, so its write recorded decisions
    kube.calls.clear()
    patched = asyncio.Event()
    patch_pod_meta = kube.patch_pod_meta

    async def patch(*args: Any) -> None:
        await patch_pod_meta(*args)
        patched.set()

    def one_more_ready(observed: Any, status: GenRMPoolStatus) -> GenRMPoolStatus:
        return status.evolve(ready_replicas=observed.status.ready_replicas + 1)

    plan_with(monkeypatch, one_more_ready, (SetPublished(f"{POOL}-0", "uid-0", False),))
    monkeypatch.setattr(kube, "patch_pod_meta", patch)
    write_after(monkeypatch, kube, patched)
    await reconciler.step()
    assert [call.split(" ")[0] for call, _ in kube.calls] == ["patch", "status"], kube.calls


async def test_an_unpublish_the_watch_has_not_shown_yet_is_not_sent_again() -> None:
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0), serving_pod(1)])
    reconciler = frozen_reconciler(kube)  # the pods stay published in the watch, for good
    for _ in range(4):
        await reconciler.step()
    unpublishes = [call for call, _ in kube.calls if call.startswith("patch") and "'false'" in call]
    assert len(unpublishes) == 1, kube.calls
    reconciler.executor.expected = Expectations(seconds=0.0)  # past the window: done again
    await reconciler.step()
    assert len([call for call, _ in kube.calls if call.startswith("patch") and "'false'" in call]) == 2


async def test_the_watch_showing_the_reconcilers_own_status_write_wakes_nothing() -> None:
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    reconciler.pool_changed("1")
    assert reconciler.wake.is_set(), "before any write of its own, every change wakes it"
    await reconciler.step()
    assert kube.status_writes == 1
    reconciler.wake.clear()
    reconciler.pool_changed(kube.pool["metadata"]["resourceVersion"])
    assert not reconciler.wake.is_set(), "its own write coming back"
    kube.bump()  # someone else's change: kubectl scale, say
    reconciler.pool_changed(kube.pool["metadata"]["resourceVersion"])
    assert reconciler.wake.is_set()


async def test_the_echo_of_a_second_status_only_write_in_a_row_wakes_the_next_step(monkeypatch: Any) -> None:
    """Two steps in a row that only wrote the status (an operation finished, the next one's victims
    recorded): the second gets no immediate follow-up, and the watch showing its write wakes the
    next step instead of the resync."""
    kube = RecordingKube(pool(1, mode="Off"), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    plan_with(monkeypatch, new_ordinal)
    written = {2: asyncio.Event(), 3: asyncio.Event()}
    write_status = kube.write_status

    async def counted(pool_: dict[str, Any], status: dict[str, Any], gating: bool = False) -> dict[str, Any]:
        answer = await write_status(pool_, status, gating)
        if kube.status_writes in written:
            written[kube.status_writes].set()
        return answer

    monkeypatch.setattr(kube, "write_status", counted)
    task = asyncio.create_task(reconciler.run(lambda: False))
    try:
        await asyncio.wait_for(written[2].wait(), shell.ACTIVE_RESYNC_SECONDS / 2)
        await asyncio.sleep(0.05)
        assert kube.status_writes == 2, "once per wake"
        reconciler.pool_changed(kube.pool["metadata"]["resourceVersion"])  # the watch shows the second write
        await asyncio.wait_for(written[3].wait(), shell.ACTIVE_RESYNC_SECONDS / 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_counts_alone_wait_for_the_operations_next_write_or_the_report_delay(monkeypatch: Any) -> None:
    """While an operation runs, a status that only counts differently is not written at once: the
    operation's next write carries it, or a write of its own once it waited the report delay, for
    which the reconciler wakes without an event."""
    kube = RecordingKube(scaling_out(3), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    await reconciler.step()
    assert kube.status_writes == 1, "conditions and counts for a status that had none"

    def one_more_ready(observed: Any, status: GenRMPoolStatus) -> GenRMPoolStatus:
        return status.evolve(ready_replicas=observed.status.ready_replicas + 1)

    plan_with(monkeypatch, one_more_ready)
    await reconciler.step()
    assert kube.status_writes == 1, "only a count changed while the operation runs"
    delay = 0.3
    monkeypatch.setattr(model, "REPORT_DELAY_SECONDS", delay)
    monkeypatch.setattr(shell, "REPORT_DELAY_SECONDS", delay)
    kube.calls.clear()
    started = time.monotonic()
    await run_for(reconciler, delay * 1.5)  # within the active resync: only the delay wakes it
    writes = [at - started for call, at in kube.calls if call == "status"]
    assert len(writes) == 1 and writes[0] >= delay * 0.9, writes
    assert kube.pool["status"]["readyReplicas"] == 2


@pytest.mark.parametrize("failure", ["error", "deleted"])
async def test_a_failing_step_with_overdue_counts_waits_for_the_resync(monkeypatch: Any, failure: str) -> None:
    """Counts left for later and overdue must not make a step that fails (an unreachable API
    server) or finds its pool deleted run again at once: it waits for the resync, as before."""
    kube = RecordingKube(scaling_out(3), [serving_pod(0)])
    reconciler = frozen_reconciler(kube)
    await reconciler.step()

    def one_more_ready(observed: Any, status: GenRMPoolStatus) -> GenRMPoolStatus:
        return status.evolve(ready_replicas=observed.status.ready_replicas + 1)

    plan_with(monkeypatch, one_more_ready)
    delay = 0.05
    monkeypatch.setattr(model, "REPORT_DELAY_SECONDS", delay)
    monkeypatch.setattr(shell, "REPORT_DELAY_SECONDS", delay)
    await reconciler.step()
    assert kube.status_writes == 1, "the count waits"
    await asyncio.sleep(delay * 2)  # overdue now
    steps = 0
    step = reconciler.step

    async def failing() -> bool:
        nonlocal steps
        steps += 1
        if failure == "error":
            raise RuntimeError("Cannot connect to host")
        deleted = copy.deepcopy(kube.pool)
        deleted["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        reconciler.observer.watched = lambda: copy.deepcopy(deleted)
        reconciler.observer.written = None
        return await step()

    monkeypatch.setattr(reconciler, "step", failing)
    monkeypatch.setattr(shell.log, "exception", lambda *_, **__: None)
    await run_for(reconciler, shell.ACTIVE_RESYNC_SECONDS / 2)
    assert steps == 1, f"{steps} steps within half a resync"

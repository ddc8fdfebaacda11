"""Example-based tests of the reconcile state machine.

Aspects under test:
- scale-out phases Pending -> Provisioning -> Verifying -> Succeeded;
- scale-in phases Pending -> Unpublishing -> Fencing -> Draining -> Removing -> Succeeded, with
  the victims written into status before any action touches them;
- reversal: a new target while victims are soft-drained or fenced rescues them (Undrain)
  before any pod is created;
- victim order: unpublished or not ready first, then fewest in flight, then newest;
- drain timeout under onTimeout Fail (operation Failed, victim kept, Degraded, Warning event)
  and Force (victim deleted, forced recorded); an unreachable sidecar never counts as drained;
- failed, crashed and startup-timed-out replicas are replaced (a crashed one that still holds
  requests is fenced and deleted only when empty), the operation ends Partial
  with the reason, and replacements back off;
- Unschedulable ends Partial(Unschedulable) and completes once capacity appears;
- a verification mismatch is never published: Partial(ReplicaInconsistent), Degraded, event;
  the first replica is verified without a reference, later ones against the oldest serving;
- deterministic pod names and nextOrdinal (retried creates reuse the name, deleted names are
  never reused);
- conditions: the three types, CamelCase reasons, lastTransitionTime moves only on flips;
- bounded history; the status survives its wire form.
"""

from __future__ import annotations

import copy
import re
from itertools import pairwise
from typing import Any

import pytest
from genrm_operator.api.pool import GenRMPoolSpec, GenRMPoolStatus
from genrm_operator.api.status import HISTORY_LIMIT, HistoryEntry, Operation, OperationPhase
from genrm_operator.core.backoff import create_backoff
from genrm_operator.core.children import template_revision
from genrm_operator.core.classify import Replica, Role, classify, failure_reason
from genrm_operator.core.clock import stamp
from genrm_operator.core.conditions import find
from genrm_operator.core.model import (
    REPORT_DELAY_SECONDS,
    CreatePod,
    DeletePod,
    Drain,
    Observed,
    Plan,
    PodView,
    SetPublished,
    SidecarView,
    Undrain,
    Verify,
    report_waits,
    writes_first,
)
from genrm_operator.core.names import drain_id
from genrm_operator.core.reconcile import reconcile
from genrm_operator.core.step import NEVER_SERVED_GRACE_SECONDS, ordinal_of
from genrm_operator.core.victims import choose_victims

from .world import POOL, START, Ev, World, replace

NOW = START + 1000.0
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")


# ----- builders --------------------------------------------------------------------------------


def make_spec(replicas: int = 1, **wire: Any) -> GenRMPoolSpec:
    doc: dict[str, Any] = {
        "replicas": replicas, "model": {"path": "org/judge-7b"},
        "drain": {"propagationSeconds": 2, "quietSeconds": 1, "timeoutSeconds": 30},
        "engine": {"startupTimeoutSeconds": 60},
    }
    for key, value in wire.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return GenRMPoolSpec.model_validate(doc)


REVISION = template_revision(POOL, make_spec())


def serving_pod(name: str, created_at: float = START, **changes: Any) -> PodView:
    """A published replica made from ``make_spec()``'s pod template (the revision of every ``make_spec``
    without template changes)."""
    fields: dict[str, Any] = dict(uid=f"uid-{name}", created_at=created_at, phase="Running", ready=True,
                                  published=True, ever_published=True, verification="passed",
                                  revision=REVISION)
    fields.update(changes)
    return PodView(name=name, **fields)


def serving_sidecar(**changes: Any) -> SidecarView:
    fields: dict[str, Any] = dict(state="Serving", inflight=0, engine_healthy=True)
    fields.update(changes)
    return SidecarView(**fields)


def observe(spec: GenRMPoolSpec, pods: list[PodView], sidecars: dict[str, SidecarView | None] | None = None,
            status: GenRMPoolStatus | None = None, now: float = NOW) -> Observed:
    if sidecars is None:
        sidecars = {p.name: serving_sidecar() for p in pods}
    return Observed(name=POOL, generation=3, spec=spec, status=status or GenRMPoolStatus(), pods=tuple(pods),
                    sidecars=sidecars, now=now)


def scale_in(victims: list[dict[str, Any]], to: int = 1, phase: str = "Draining", **status: Any) -> GenRMPoolStatus:
    op = Operation.model_validate({
        "id": "op-7", "type": "ScaleIn", "from": 2, "to": to, "phase": phase,
        "startedAt": stamp(NOW - 100), "lastTransitionTime": stamp(NOW - 50), "victims": victims,
    })
    return GenRMPoolStatus.model_validate({"nextOrdinal": 9, "operationCount": 7, **status}).model_copy(
        update={"operation": op})


def converged_world(replicas: int, **spec_wire: Any) -> World:
    world = World(spec=make_spec(replicas, **spec_wire), keep_plans=True)
    run_until(world, world.converged)
    world.plans.clear()
    return world


def run_until(world: World, done: Any, max_steps: int = 200, events: list[Ev] | None = None) -> int:
    for taken in range(1, max_steps + 1):
        world.step(events or [])
        if done():
            return taken
    raise AssertionError(f"not done after {max_steps} steps: {world.status.operation}")


def names(plan: Plan, kind: type) -> list[str]:
    return [a.name for a in plan.actions if isinstance(a, kind)]  # type: ignore[attr-defined]


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


def phase_path(plans: list[Plan]) -> list[str]:
    """The operation phases the plans wrote, each run of one phase once."""
    path: list[str] = []
    for p in plans:
        phase = p.status.operation.phase if p.status.operation is not None else None
        if phase is not None and path[-1:] != [phase]:
            path.append(phase)
    return path


# ----- scale-out ------------------------------------------------------------------------------


def test_a_scale_out_goes_pending_provisioning_verifying_succeeded() -> None:
    world = converged_world(1)
    world.scale(3)
    run_until(world, world.converged)
    assert phase_path(world.plans) == ["Provisioning", "Verifying"]
    assert reasons(world.plans) == ["ScaleOutStarted", "ReplicaPublished", "ReplicaPublished", "ScaleOutSucceeded"]
    started = next(e for p in world.plans for e in p.events if e.reason == "ScaleOutStarted")
    assert started.message == "op-2 ScaleOut 1->3"
    last = world.status.history[-1]
    assert (last.type, last.from_, last.to, last.outcome, last.reason) == ("ScaleOut", 1, 3, "Succeeded",
                                                                            "TargetReached")
    assert world.status.serving_replicas == 3 and world.status.operation is None


def test_a_scale_out_creates_exactly_the_shortfall_and_publishes_only_verified_ready_replicas() -> None:
    spec = make_spec(3)
    plan = reconcile(observe(spec, [serving_pod("judge-0")]))
    assert plan.actions == (CreatePod("judge-1", 1), CreatePod("judge-2", 2))
    assert plan.status.operation is not None and plan.status.operation.phase == "Provisioning"
    assert [a.name for a in plan.status.operation.added_pods] == ["judge-1", "judge-2"]
    new = PodView("judge-1", "uid-1", NOW, phase="Running", ready=True)
    warm = reconcile(observe(spec, [serving_pod("judge-0"), new], status=plan.status, now=NOW + 5))
    assert Verify("judge-1", "uid-1", "judge-0") in warm.actions
    assert not names(warm, SetPublished)
    passed = reconcile(observe(spec, [serving_pod("judge-0"), PodView(
        "judge-1", "uid-1", NOW, phase="Running", ready=True, verification="passed")],
        status=warm.status, now=NOW + 6))
    assert SetPublished("judge-1", "uid-1", True) in passed.actions


def test_verification_starts_on_the_sidecars_report_and_publication_waits_for_ready() -> None:
    """The probes overlap the wait for the readiness probe; only a Ready pod is published."""
    spec = make_spec(2)
    created = reconcile(observe(spec, [serving_pod("judge-0")]))
    assert created.actions == (CreatePod("judge-1", 1),)
    unready = PodView("judge-1", "uid-1", NOW, phase="Running", ready=False)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), unready], status=created.status, now=NOW + 1))
    assert names(plan, Verify) == ["judge-1"] and not names(plan, SetPublished)
    checked = PodView("judge-1", "uid-1", NOW, phase="Running", ready=False, verification="passed")
    plan = reconcile(observe(spec, [serving_pod("judge-0"), checked], status=plan.status, now=NOW + 2))
    assert not names(plan, Verify) and not names(plan, SetPublished)
    ready = PodView("judge-1", "uid-1", NOW, phase="Running", ready=True, verification="passed")
    plan = reconcile(observe(spec, [serving_pod("judge-0"), ready], status=plan.status, now=NOW + 3))
    assert names(plan, SetPublished) == ["judge-1"]


def test_a_replica_whose_engine_is_not_warm_is_neither_verified_nor_published() -> None:
    spec = make_spec(2)
    pod = PodView("judge-1", "uid-1", NOW, phase="Running", ready=True, verification="passed")
    cold = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(engine_healthy=False)}
    plan = reconcile(observe(spec, [serving_pod("judge-0"), pod], cold))
    assert not names(plan, SetPublished) and not names(plan, Verify)


# ----- scale-in -------------------------------------------------------------------------------


def test_a_scale_in_goes_unpublishing_fencing_draining_removing_succeeded_with_victims_recorded_first() -> None:
    world = converged_world(2)
    world.step([Ev("arrive", 0, 3), Ev("arrive", 1, 1)])
    world.scale(1)
    statuses = [world.status]
    for _ in range(6):
        world.step()
        statuses.append(world.status)
    world.step([Ev("finish", 1, 1)])
    statuses.append(world.status)
    run_until(world, world.converged)
    statuses += [p.status for p in world.plans[len(statuses) - 1:]]

    assert phase_path(world.plans) == ["Unpublishing", "Fencing", "Draining", "Removing"]
    assert reasons(world.plans) == ["ScaleInStarted", "VictimsSelected", "ScaleInSucceeded"]
    assert world.status.history[-1].reason == "TargetReached"
    assert sorted(world.pods) == ["judge-0"], "the replica with fewer requests in flight was removed"
    # Every drain, unpublish and delete names a victim that the previously written status recorded.
    for before, plan in zip(statuses, world.plans, strict=False):
        recorded = {v.name for v in before.operation.victims} if before.operation else set()
        touched = names(plan, Drain) + names(plan, DeletePod) + [
            a.name for a in plan.actions if isinstance(a, SetPublished) and not a.published]
        assert set(touched) <= recorded, (touched, recorded)


def test_victims_are_written_into_status_in_a_step_without_side_effects() -> None:
    spec = make_spec(1)
    pods = [serving_pod("judge-0"), serving_pod("judge-1", START + 5)]
    plan = reconcile(observe(spec, pods))
    op = plan.status.operation
    assert op is not None and op.type == "ScaleIn" and op.phase == "Unpublishing"
    assert [(v.name, v.uid, v.needs_drain) for v in op.victims] == [("judge-1", "uid-judge-1", True)]
    assert plan.actions == ()
    nxt = reconcile(observe(spec, pods, status=plan.status, now=NOW + 1))
    assert nxt.actions == (SetPublished("judge-1", "uid-judge-1", False),
                           Drain("judge-1", drain_id("uid-judge-1"), "soft"))


def test_a_scale_out_waits_for_terminating_pods_to_release_their_gpus() -> None:
    spec = make_spec(2)
    leaving = PodView("judge-1", "uid-1", NOW - 50, phase="Running", deleting=True)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), leaving]))
    op = plan.status.operation
    assert op is not None and op.type == "ScaleOut" and op.phase == "Provisioning"
    assert names(plan, CreatePod) == [] and "1 more once leaving pods release their GPUs" in op.message
    plan = reconcile(observe(spec, [serving_pod("judge-0")], status=plan.status, now=NOW + 1))
    assert names(plan, CreatePod) == ["judge-2"]


def test_a_never_published_victim_is_deleted_at_once_without_a_drain() -> None:
    """Short grace, bound to the observed resourceVersion: a publication since then voids it."""
    spec = make_spec(1)
    starting = PodView("judge-1", "uid-1", NOW - 5, phase="Running", ready=False, resource_version="77")
    status = scale_in([{"name": "judge-1", "uid": "uid-1", "needsDrain": False}], phase="Unpublishing")
    plan = reconcile(observe(spec, [serving_pod("judge-0"), starting], status=status))
    assert plan.actions == (DeletePod("judge-1", "uid-1", NEVER_SERVED_GRACE_SECONDS, "77"),)


def test_a_victim_published_after_it_was_chosen_is_drained_rather_than_deleted() -> None:
    spec = make_spec(1)
    status = scale_in([{"name": "judge-1", "uid": "uid-judge-1", "needsDrain": False}], phase="Unpublishing")
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    plan = reconcile(observe(spec, pods, status=status))
    assert not names(plan, DeletePod)
    assert Drain("judge-1", drain_id("uid-judge-1"), "soft") in plan.actions
    assert plan.status.operation is not None and plan.status.operation.victims[0].needs_drain


def test_a_victim_is_deleted_only_once_its_sidecar_reports_drained() -> None:
    spec = make_spec(1)
    victim = {"name": "judge-1", "uid": "uid-judge-1", "unpublishedAt": stamp(NOW - 20),
              "fencedAt": stamp(NOW - 10)}
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    for state, inflight in (("Fenced", 0), ("Fenced", 2), ("SoftDrain", 0)):
        sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state=state, inflight=inflight)}
        plan = reconcile(observe(spec, pods, sidecars, scale_in([victim])))
        assert not names(plan, DeletePod), state
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="Drained")}
    plan = reconcile(observe(spec, pods, sidecars, scale_in([victim])))
    assert names(plan, DeletePod) == ["judge-1"]
    assert plan.status.operation is not None and plan.status.operation.phase == "Removing"
    assert plan.status.operation.victims[0].drained_at == stamp(NOW)


@pytest.mark.parametrize("on_timeout", ["Fail", "Force"])
def test_an_unreachable_sidecar_never_counts_as_drained(on_timeout: str) -> None:
    spec = make_spec(1, drain={"onTimeout": on_timeout})
    victim = {"name": "judge-1", "uid": "uid-judge-1", "unpublishedAt": stamp(NOW - 20),
              "fencedAt": stamp(NOW - 10)}
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    sidecars: dict[str, SidecarView | None] = {"judge-0": serving_sidecar(), "judge-1": None}
    plan = reconcile(observe(spec, pods, sidecars, scale_in([victim])))
    assert not names(plan, DeletePod)
    assert Drain("judge-1", drain_id("uid-judge-1"), "fence") in plan.actions
    replicas = classify(tuple(pods), sidecars, NOW, 60.0)
    assert replicas[1].role is Role.STARTING, "unknown is not Drained"


# ----- reversal -------------------------------------------------------------------------------


def test_scaling_back_out_rescues_soft_drained_and_fenced_victims_before_creating_pods() -> None:
    spec = make_spec(4)
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False),
            serving_pod("judge-2", published=False), serving_pod("judge-3", published=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="SoftDrain", inflight=1),
                "judge-2": serving_sidecar(state="Fenced", inflight=2),
                "judge-3": serving_sidecar(state="Fenced")}
    victims = [{"name": n, "uid": f"uid-{n}", "unpublishedAt": stamp(NOW - 5)}
               for n in ("judge-1", "judge-2", "judge-3")]
    plan = reconcile(observe(spec, pods, sidecars, scale_in(victims, to=1, phase="Fencing")))
    assert plan.status.history[-1].outcome == "Superseded"
    assert sorted(names(plan, Undrain)) == ["judge-1", "judge-2", "judge-3"]
    assert all(a.drain_id == drain_id(f"uid-{a.name}") for a in plan.actions if isinstance(a, Undrain))
    assert not names(plan, CreatePod) and not names(plan, DeletePod)
    assert {e.reason for e in plan.events} >= {"ReplicaRescued", "ScaleInSuperseded", "ScaleOutStarted"}


def test_a_reversal_in_the_world_reuses_the_draining_replicas() -> None:
    world = converged_world(4, drain={"propagationSeconds": 2, "quietSeconds": 1, "timeoutSeconds": 30})
    world.step([Ev("arrive", i, 2) for i in range(4)])
    world.scale(1)
    world.step()
    world.step()
    world.step()
    states = sorted(p.sidecar.state for p in world.pods.values())
    assert states.count("Serving") == 1 and set(states) <= {"Serving", "SoftDrain", "Fenced"}
    world.scale(4)
    first = world.step()
    assert len(names(first, Undrain)) == 3 and not names(first, CreatePod)
    run_until(world, world.converged)
    assert sorted(world.pods) == ["judge-0", "judge-1", "judge-2", "judge-3"], "no pod was created"


def test_a_scale_in_after_a_scale_out_removes_the_new_unpublished_pods_first() -> None:
    world = converged_world(2)
    world.scale(4)
    world.step()
    world.scale(2)
    run_until(world, world.converged)
    assert sorted(world.pods) == ["judge-0", "judge-1"]
    assert world.forced_deletes == 0


# ----- victim order ---------------------------------------------------------------------------


def test_victims_are_unpublished_or_not_ready_first_then_fewest_in_flight_then_newest() -> None:
    pods = {
        "old-busy": (serving_pod("old-busy", START), serving_sidecar(inflight=5)),
        "old-idle": (serving_pod("old-idle", START + 1), serving_sidecar(inflight=1)),
        "new-idle": (serving_pod("new-idle", START + 2), serving_sidecar(inflight=1)),
        "unready": (serving_pod("unready", START, ready=False), serving_sidecar(inflight=3)),
        "starting": (PodView("starting", "u-s", START + 3, phase="Running", ready=True), serving_sidecar()),
        "loading": (PodView("loading", "u-l", START + 3), None),
        "draining": (serving_pod("draining", START, published=False), serving_sidecar(state="SoftDrain",
                                                                                          inflight=9)),
    }
    replicas = classify(tuple(p for p, _ in pods.values()), {n: s for n, (_, s) in pods.items()}, NOW, 1e9)
    order = [r.pod.name for r in choose_victims(replicas, len(replicas), "")]
    assert order == ["draining", "loading", "starting", "unready", "new-idle", "old-idle", "old-busy"]
    assert [r.pod.name for r in choose_victims(replicas, 2, "")] == ["draining", "loading"]
    assert choose_victims(replicas, -1, "") == []


def test_the_scale_in_chooses_the_least_busy_newest_serving_replicas() -> None:
    spec = make_spec(2)
    pods = [serving_pod("judge-0", START), serving_pod("judge-1", START + 1), serving_pod("judge-2", START + 2),
            serving_pod("judge-3", START + 3)]
    sidecars = {"judge-0": serving_sidecar(inflight=1), "judge-1": serving_sidecar(inflight=0),
                "judge-2": serving_sidecar(inflight=4), "judge-3": serving_sidecar(inflight=1)}
    plan = reconcile(observe(spec, pods, sidecars))
    assert plan.status.operation is not None
    assert [v.name for v in plan.status.operation.victims] == ["judge-1", "judge-3"]


# ----- drain timeout --------------------------------------------------------------------------


def test_a_victim_still_published_after_a_crash_is_unpublished_again_before_any_fence() -> None:
    """The operator died between recording the victim and patching its label: however long ago
    that was, the fence waits for a whole propagation window after the pod is seen unpublished."""
    victim = {"name": "judge-1", "uid": "uid-judge-1", "unpublishedAt": stamp(NOW - 60)}
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]  # still published
    plan = reconcile(observe(make_spec(1), pods, None, scale_in([victim], phase="Unpublishing")))
    assert SetPublished("judge-1", "uid-judge-1", False) in plan.actions
    assert not [a for a in plan.actions if isinstance(a, Drain) and a.phase == "fence"]
    op = plan.status.operation
    assert op is not None and op.phase == "Unpublishing" and op.victims[0].unpublished_at is None
    # Seen unpublished one second later: the window (propagationSeconds 2) starts there, not before.
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="SoftDrain")}
    seen = reconcile(observe(make_spec(1), pods, sidecars, plan.status, now=NOW + 1))
    op = seen.status.operation
    assert op is not None and op.victims[0].unpublished_at == stamp(NOW + 1)
    early = reconcile(observe(make_spec(1), pods, sidecars, seen.status, now=NOW + 2.9))
    assert not [a for a in early.actions if isinstance(a, Drain) and a.phase == "fence"]
    due = reconcile(observe(make_spec(1), pods, sidecars, seen.status, now=NOW + 3))
    assert Drain("judge-1", drain_id("uid-judge-1"), "fence") in due.actions


def timed_out(on_timeout: str) -> Plan:
    spec = make_spec(1, drain={"onTimeout": on_timeout})
    victim = {"name": "judge-1", "uid": "uid-judge-1", "unpublishedAt": stamp(NOW - 60),
              "fencedAt": stamp(NOW - 31)}
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="Fenced", inflight=2)}
    return reconcile(observe(spec, pods, sidecars, scale_in([victim])))


def test_a_drain_timeout_under_fail_fails_the_operation_and_keeps_the_victim_fenced() -> None:
    plan = timed_out("Fail")
    assert not names(plan, DeletePod) and not names(plan, Undrain)
    assert not [a for a in plan.actions if isinstance(a, SetPublished) and a.published]
    assert plan.status.operation is None
    last = plan.status.history[-1]
    assert (last.outcome, last.reason, last.forced_drains) == ("Failed", "DrainTimeout", 0)
    assert "judge-1 not drained after 30s (2 in flight)" in last.message
    degraded = find(plan.status.conditions, "Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", "DrainTimeout")
    warning = [e for e in plan.events if e.type == "Warning"]
    assert [e.reason for e in warning] == ["ScaleInFailed"] and "DrainTimeout" in warning[0].message


def test_a_drain_timeout_under_force_deletes_the_victim_and_records_it() -> None:
    plan = timed_out("Force")
    assert plan.actions[-1] == DeletePod("judge-1", "uid-judge-1")
    op = plan.status.operation
    assert op is not None and op.phase == "Removing"
    assert op.victims[0].forced and op.victims[0].drained_at == stamp(NOW)
    assert (plan.events[0].type, plan.events[0].reason) == ("Warning", "DrainForced")
    gone = reconcile(observe(make_spec(1, drain={"onTimeout": "Force"}), [serving_pod("judge-0")],
                             status=plan.status, now=NOW + 1))
    assert gone.status.history[-1].forced_drains == 1
    assert gone.status.history[-1].outcome == "Succeeded"


def test_a_failed_drain_stays_degraded_in_the_world_until_the_requests_finish() -> None:
    world = converged_world(2, drain={"propagationSeconds": 1, "quietSeconds": 1, "timeoutSeconds": 5})
    world.step([Ev("arrive", 0, 1), Ev("arrive", 1, 1)])
    world.scale(1)
    run_until(world, lambda: any(h.outcome == "Failed" for h in world.status.history), max_steps=30)
    assert len(world.pods) == 2 and world.forced_deletes == 0
    degraded = find(world.status.conditions, "Degraded")
    assert degraded is not None and degraded.status == "True"
    for pod in world.pods.values():
        pod.sidecar.inflight = 0
    run_until(world, world.converged, max_steps=60)
    assert find(world.status.conditions, "Degraded").status == "False"  # type: ignore[union-attr]


# ----- failures -------------------------------------------------------------------------------


def bad_pod(name: str, uid: str, now: float, reason: str) -> PodView:
    if reason == "ReplicaCrashed":
        return PodView(name, uid, now - 1, phase="Running", restarts=2)
    if reason == "ReplicaFailed":
        return PodView(name, uid, now - 1, phase="Failed")
    return PodView(name, uid, now - 61, phase="Running")


@pytest.mark.parametrize("reason", ["ReplicaCrashed", "ReplicaFailed", "StartupTimeout"])
def test_the_scale_out_ends_partial_even_when_the_failed_replica_is_already_terminating(reason: str) -> None:
    """A never-served failure is deleted at once, so the next step sees it Terminating, not Failed."""
    spec = make_spec(2)
    first = reconcile(observe(spec, [serving_pod("judge-0")], now=NOW - 1))
    bad = bad_pod("judge-1", "uid-1", NOW, reason)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), bad], status=first.status))
    going = PodView(**{**bad.__dict__, "deleting": True})
    seen = PodView("judge-2", "uid-2", NOW + 1)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), going, seen], status=plan.status, now=NOW + 1))
    assert plan.status.history and (plan.status.history[-1].outcome, plan.status.history[-1].reason) == (
        "Partial", reason)


@pytest.mark.parametrize("reason", ["ReplicaCrashed", "ReplicaFailed", "StartupTimeout"])
def test_failed_crashed_and_late_replicas_are_replaced_and_the_scale_out_ends_partial(reason: str) -> None:
    spec = make_spec(2)
    first = reconcile(observe(spec, [serving_pod("judge-0")], now=NOW - 1))
    bad = bad_pod("judge-1", "uid-1", NOW, reason)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), bad], status=first.status))
    assert DeletePod("judge-1", "uid-1", NEVER_SERVED_GRACE_SECONDS, "") in plan.actions, "never served"
    assert names(plan, CreatePod) == ["judge-2"], "replaced at once"
    # It ends once the replacement's create is observed: until then only the operation counts it.
    assert not plan.status.history
    seen = PodView("judge-2", "uid-2", NOW + 1)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), bad, seen], status=plan.status, now=NOW + 1))
    last = plan.status.history[-1]
    assert (last.outcome, last.reason) == ("Partial", reason)
    assert any(e.reason == "ReplicaFailed" and e.type == "Warning" for e in plan.events)
    degraded = find(plan.status.conditions, "Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", "ReplicaFailed")

    again = reconcile(observe(spec, [serving_pod("judge-0"), bad_pod("judge-2", "uid-2", NOW + 1, reason)],
                              status=plan.status, now=NOW + 1))
    assert names(again, DeletePod) == ["judge-2"]
    assert not names(again, CreatePod), "the next replacement backs off"
    later = reconcile(observe(spec, [serving_pod("judge-0")], status=again.status, now=NOW + 11))
    assert names(later, CreatePod) == ["judge-3"]


def test_a_crashed_serving_replica_is_replaced_in_the_world() -> None:
    world = converged_world(2)
    world.step([Ev("crash", 1)])
    run_until(world, world.converged)
    assert sorted(world.pods) == ["judge-0", "judge-2"]
    assert "ReplicaFailed" in reasons(world.plans)


def test_a_crashed_replica_still_holding_requests_is_fenced_and_deleted_only_when_empty() -> None:
    spec = make_spec(2)
    pods = [serving_pod("judge-0"), serving_pod("judge-1", restarts=1)]
    busy = observe(spec, pods, {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(inflight=3)})
    plan = reconcile(busy)
    assert names(plan, SetPublished) == ["judge-1"] and names(plan, Drain) == ["judge-1"]
    assert "judge-1" not in names(plan, DeletePod)

    unpublished = [pods[0], serving_pod("judge-1", restarts=1, published=False)]
    still_busy = observe(spec, unpublished, {"judge-0": serving_sidecar(),
                                             "judge-1": serving_sidecar(state="Fenced", inflight=1)})
    assert "judge-1" not in names(reconcile(still_busy), DeletePod)

    empty = observe(spec, unpublished, {"judge-0": serving_sidecar(),
                                        "judge-1": serving_sidecar(state="Fenced", inflight=0)})
    assert names(reconcile(empty), DeletePod) == ["judge-1"]


def finished(outcome: str, at: float, reason: str = "") -> HistoryEntry:
    return HistoryEntry.model_validate({
        "id": "op-1", "type": "ScaleOut", "from": 0, "to": 1, "outcome": outcome, "reason": reason,
        "startedAt": stamp(at), "finishedAt": stamp(at), "durationSeconds": 0,
    })


def test_create_backoff_doubles_per_consecutive_failure_ignores_superseded_and_resets_on_success() -> None:
    assert create_backoff([], NOW) == 0.0
    assert create_backoff([finished("Partial", NOW)], NOW) == 10.0
    assert create_backoff([finished("Partial", NOW), finished("Failed", NOW)], NOW) == 20.0
    three = [finished("Partial", NOW), finished("Superseded", NOW), finished("Failed", NOW),
             finished("Partial", NOW)]
    assert create_backoff(three, NOW + 5) == 35.0
    assert create_backoff([finished("Partial", NOW)] * 12, NOW) == 300.0
    assert create_backoff([*three, finished("Succeeded", NOW)], NOW) == 0.0


def test_create_backoff_waits_from_the_last_failure_and_skips_its_own_waits() -> None:
    failure = finished("Partial", NOW, "ReplicaFailed")
    waited = finished("Partial", NOW + 4, "BackOff")
    superseded = finished("Superseded", NOW + 3, "TargetChanged")
    assert create_backoff([failure, waited], NOW + 5) == 5.0, "10 s from the failure, not 20 s from the wait"
    assert create_backoff([failure, superseded], NOW + 5) == 5.0
    assert create_backoff([waited], NOW + 5) == 0.0
    assert create_backoff([failure, finished("Failed", NOW + 1, "DrainTimeout")], NOW + 1) == 20.0


def test_a_pod_being_deleted_is_judged_only_by_what_it_did_before_its_deletion() -> None:
    """Its phase is the kubelet's answer to the deletion and it no longer has to become ready; a
    restart (never done for a terminating pod) happened before."""
    for phase in ("Succeeded", "Failed"):
        ended = PodView("judge-1", "uid-1", NOW - 1, phase=phase)
        assert failure_reason(ended, NOW, 60) == "ReplicaFailed"
        assert failure_reason(replace(ended, deleting=True), NOW, 60) == ""
    late = PodView("judge-1", "uid-1", NOW - 61, phase="Running")
    assert failure_reason(late, NOW, 60) == "StartupTimeout"
    assert failure_reason(replace(late, deleting=True), NOW, 60) == ""
    crashed = PodView("judge-1", "uid-1", NOW - 1, phase="Failed", restarts=1, deleting=True)
    assert failure_reason(crashed, NOW, 60) == "ReplicaCrashed"


def test_a_new_replica_deleted_by_hand_during_a_scale_out_is_replaced_without_blame() -> None:
    """Whoever deletes it, the kubelet ends it Succeeded or Failed: the scale-out replaces it and
    still succeeds, with no Warning and no back-off."""
    world = converged_world(1)
    world.scale(3)
    run_until(world, lambda: any(p.name != "judge-0" and p.scheduled_at is not None for p in world.pods.values()),
              max_steps=10)
    added = next(p for p in world.pods.values() if p.name != "judge-0")
    world.admin_delete(added)
    answered = False

    def done() -> bool:
        nonlocal answered
        answered = answered or (added.name in world.pods and added.phase in ("Succeeded", "Failed"))
        return world.converged()
    run_until(world, done)
    assert answered and added.name not in world.pods
    assert [(h.type, h.outcome) for h in world.status.history[-1:]] == [("ScaleOut", "Succeeded")]
    events = reasons(world.plans)
    assert "ScaleOutPartial" not in events and "ReplicaFailed" not in events, events
    assert create_backoff(world.status.history, world.now) == 0.0


def test_unschedulable_replicas_end_partial_and_the_pool_completes_when_gpus_appear() -> None:
    world = World(spec=make_spec(3), gpus=1, keep_plans=True)
    run_until(world, lambda: any(h.reason == "Unschedulable" for h in world.status.history), max_steps=20)
    last = world.status.history[-1]
    assert last.outcome == "Partial" and "Insufficient nvidia.com/gpu" in last.message
    assert len(world.pods) == 3, "unschedulable pods are kept, not replaced"
    world.gpus = 3
    run_until(world, world.converged, max_steps=400)
    assert world.status.history[-1].outcome == "Succeeded"
    assert sorted(world.pods) == ["judge-0", "judge-1", "judge-2"]


MISSING_SECRET = 'container engine-key: CreateContainerConfigError: secret "judge-key" not found'


def test_replicas_that_cannot_start_end_partial_are_kept_past_the_startup_timeout_and_start_once_fixed() -> None:
    world = World(spec=make_spec(2), keep_plans=True, cannot_start=MISSING_SECRET)
    run_until(world, lambda: any(h.reason == "ReplicaCannotStart" for h in world.status.history), max_steps=20)
    last = world.status.history[-1]
    assert last.outcome == "Partial" and MISSING_SECRET in last.message and "judge-" in last.message
    created = set(world.pods)
    world.now += float(world.spec.engine.startup_timeout_seconds) + 60
    for _ in range(10):
        world.step([])
    assert set(world.pods) == created, "a replacement would wait the same way: the pods are kept"
    assert "StartupTimeout" not in {h.reason for h in world.status.history}
    world.cannot_start = ""  # the Secret is created: the same pods start, their startup time from now
    run_until(world, world.converged, max_steps=400)
    assert world.status.history[-1].outcome == "Succeeded" and set(world.pods) == created


# ----- verification ---------------------------------------------------------------------------


def test_the_first_replica_is_published_after_its_probes_without_a_reference() -> None:
    world = World(spec=make_spec(1), keep_plans=True)
    run_until(world, world.converged)
    verifies = [a for p in world.plans for a in p.actions if isinstance(a, Verify)]
    assert verifies and all(v.reference is None for v in verifies)
    assert world.pods["judge-0"].verification == "passed"


def test_a_new_replica_is_verified_against_the_oldest_serving_replica() -> None:
    world = converged_world(2)
    world.scale(3)
    run_until(world, world.converged)
    verifies = {a.reference for p in world.plans for a in p.actions if isinstance(a, Verify)}
    assert verifies == {"judge-0"}


def test_a_replica_answering_differently_is_never_published_and_is_replaced() -> None:
    world = converged_world(1)
    world.step([Ev("perturb"), Ev("scale", 2)])
    run_until(world, lambda: world.status.operation is None and world.status.history[-1].id == "op-2")
    last = world.status.history[-1]
    assert (last.outcome, last.reason) == ("Partial", "ReplicaInconsistent")
    assert last.message.startswith("judge-1: ReplicaInconsistent: judge-1 on node unknown (no GPU product label) "
                                   "against judge-0 on node unknown (no GPU product label): ")
    assert "judge-1" in world.names_deleted, "replaced, not kept on its GPU"
    assert not any(isinstance(a, SetPublished) and a.name == "judge-1" and a.published
                   for p in world.plans for a in p.actions)
    for reason in ("ScaleOutPartial", "ReplicaFailed"):
        event = next(e for p in world.plans for e in p.events if e.reason == reason)
        assert event.type == "Warning" and "new='verdict: 3/10 (judge-1)'" in event.message
        assert "reference='verdict: 7/10 by " in event.message  # the world's answers name their judge
    run_until(world, world.converged)
    assert sorted(world.pods) == ["judge-0", "judge-2"]
    assert find(world.status.conditions, "Degraded").status == "False"  # type: ignore[union-attr]


def test_a_replica_that_keeps_answering_differently_is_replaced_with_exponential_back_off() -> None:
    """The first replacement goes at once; each later one waits for the back-off that counts every
    failed operation in a row (20 s after two, 40 s after three), with conditions saying why and
    until when."""
    world = converged_world(1)
    created: dict[str, float] = {}
    held = []
    for taken in range(200):
        plan = world.step([Ev("perturb"), Ev("perturb"), Ev("perturb"), Ev("scale", 2)] if taken == 0 else [])
        for name in names(plan, CreatePod):
            created.setdefault(name, world.now)
        degraded = find(plan.status.conditions, "Degraded")
        if degraded is not None and degraded.reason == "VerificationBackOff":
            held.append((degraded, find(plan.status.conditions, "Progressing")))
        if world.converged():
            break
    assert sorted(world.pods) == ["judge-0", "judge-4"], "three replicas answered differently, the fourth serves"
    gaps = [created[f"judge-{n + 1}"] - created[f"judge-{n}"] for n in (1, 2, 3)]
    assert gaps[0] < 10.0 and 20.0 <= gaps[1] < 40.0 <= gaps[2], gaps
    degraded, progressing = held[-1]
    assert degraded.status == "True" and degraded.observed_generation == world.generation
    assert re.search(r"^next replica create at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(40s back-off after 3 failed "
                     r"operation\(s\) in a row\); last: op-\d+ Partial \(ReplicaInconsistent\): judge-3: "
                     r"ReplicaInconsistent: judge-3 on node", degraded.message), degraded.message
    assert progressing is not None and (progressing.status, progressing.reason) == ("False", "VerificationBackOff")
    assert "next replica create at" in progressing.message
    assert len({c.last_transition_time for c, _ in held}) <= 2, "one transition per wait, not one per step"
    assert find(world.status.conditions, "Degraded").status == "False"  # type: ignore[union-attr]


def test_verification_disabled_publishes_warm_replicas_directly() -> None:
    world = World(spec=make_spec(2, verification={"enabled": False}), keep_plans=True)
    run_until(world, world.converged)
    assert not [a for p in world.plans for a in p.actions if isinstance(a, Verify)]


# ----- names ----------------------------------------------------------------------------------


def test_pod_names_are_deterministic_and_next_ordinal_is_kept_in_status() -> None:
    world = World(spec=make_spec(3), keep_plans=True)
    first = world.step([Ev("lose")])
    assert first.actions == (CreatePod("judge-0", 0), CreatePod("judge-1", 1), CreatePod("judge-2", 2))
    assert world.status.next_ordinal == 3 and not world.pods, "the creates were lost"
    retry = world.step()
    assert retry.actions == first.actions, "a lost create is retried under the same name"
    run_until(world, world.converged)
    world.scale(2)
    run_until(world, world.converged)
    world.scale(3)
    run_until(world, world.converged)
    assert "judge-3" in world.pods and world.status.next_ordinal == 4
    assert ordinal_of(POOL, "judge-12") == 12 and ordinal_of(POOL, "other-1") is None
    assert ordinal_of(POOL, "judge-x") is None


def test_a_create_decided_on_a_stale_spec_waits_for_its_record_and_is_cancelled_with_it() -> None:
    """New creates wait for the status write that records them (``needs_record``). A step that
    decides on a spec the watch has not caught up with (replicas 2 -> 6 -> 2) has its write
    refused with a Conflict, and its creates are never sent: no GPU pod starts that the spec no
    longer wants, and no ordinal is spent."""
    world = converged_world(2)
    blind = world.step([Ev("scale", 6), Ev("stale")])
    assert not names(blind, CreatePod), "the step saw replicas 2"
    stale = world.step([Ev("scale", 2), Ev("stale")])
    assert names(stale, CreatePod) == ["judge-2", "judge-3", "judge-4", "judge-5"], "decided on replicas 6"
    assert sorted(world.pods) == ["judge-0", "judge-1"] and world.status.next_ordinal == 2, "the write was refused"
    assert not names(world.step(), CreatePod), "the next step sees replicas 2"
    run_until(world, world.converged)
    assert world.names_ever == {"judge-0", "judge-1"}


def test_a_retried_create_decided_on_a_stale_spec_is_cancelled_by_its_write() -> None:
    """A retry is decided again, on the step's spec: a scale-out whose record landed but whose
    creates were lost (a SIGKILL, a refused create), then replicas back to 2 while the next step
    still sees 6, must not start the four pods. The step writes its unchanged status for the
    Conflict (``writes_first``), and the retried creates wait for it."""
    world = converged_world(2)
    lost = world.step([Ev("scale", 6), Ev("lose")])
    assert names(lost, CreatePod) == ["judge-2", "judge-3", "judge-4", "judge-5"]
    assert sorted(world.pods) == ["judge-0", "judge-1"] and world.status.next_ordinal == 6, "recorded, not created"
    stale = world.step([Ev("scale", 2), Ev("stale")])
    assert names(stale, CreatePod) == ["judge-2", "judge-3", "judge-4", "judge-5"], "retried on replicas 6"
    assert writes_first(world.status, stale.status, stale.actions), "a due create writes even an unchanged status"
    assert sorted(world.pods) == ["judge-0", "judge-1"], "the write was refused and the retries with it"
    run_until(world, world.converged)
    assert sorted(world.pods) == ["judge-0", "judge-1"]


def test_a_verified_replica_waiting_for_readiness_keeps_the_scale_out_verifying() -> None:
    """Between its verification and its Ready condition a replica is past provisioning: the
    operation does not fall back to Provisioning (two more status writes and events, and the
    publish held behind the second one)."""
    spec = make_spec(2)
    op = Operation.model_validate({
        "id": "op-4", "type": "ScaleOut", "from": 1, "to": 2, "phase": "Verifying",
        "startedAt": stamp(NOW - 10), "lastTransitionTime": stamp(NOW - 5),
        "addedPods": [{"name": "judge-1", "ordinal": 1, "observed": True}],
    })
    status = GenRMPoolStatus.model_validate({"nextOrdinal": 2, "operationCount": 4}).model_copy(
        update={"operation": op})
    waiting = serving_pod("judge-1", created_at=NOW - 8, published=False, ever_published=False, ready=False)
    plan = reconcile(observe(spec, [serving_pod("judge-0"), waiting], status=status))
    assert plan.status.operation is not None and plan.status.operation.phase == "Verifying"
    assert not plan.actions and not [e for e in plan.events if e.reason.startswith("ScaleOut")]
    ready = reconcile(observe(spec, [serving_pod("judge-0"), replace(waiting, ready=True)], status=plan.status))
    assert names(ready, SetPublished) == ["judge-1"]
    assert ready.status.decisions() == plan.status.decisions(), "publishing needs no new record"


def test_a_publish_whose_status_write_was_refused_is_counted_as_serving() -> None:
    """A publish goes out beside the status write of its step (``needs_record``). When that write is
    refused, the next step sees the replica published and counts it: the operation succeeds,
    nothing is published twice or taken down."""
    world = converged_world(1)
    world.scale(2)
    for _ in range(50):
        if names(copy.deepcopy(world).step(), SetPublished):  # what the next step will decide
            break
        world.step()
    status = world.status
    refused = world.step([Ev("unwritten")])
    assert names(refused, SetPublished) == ["judge-1"] and world.pods["judge-1"].published
    assert world.status is status, "the write was refused"
    nxt = world.step()
    assert not names(nxt, SetPublished) and nxt.status.serving_replicas == 2
    run_until(world, world.converged)
    assert [h.outcome for h in world.status.history][-1] == "Succeeded"
    assert sorted(world.pods) == ["judge-0", "judge-1"]


def test_next_ordinal_follows_pods_even_when_the_status_was_lost() -> None:
    spec = make_spec(3)
    plan = reconcile(observe(spec, [serving_pod("judge-4"), serving_pod("judge-7")]))
    assert names(plan, CreatePod) == ["judge-8"]
    assert plan.status.next_ordinal == 9


# ----- conditions, history, wire --------------------------------------------------------------


def test_conditions_have_camel_case_reasons_and_move_their_time_only_on_flips() -> None:
    world = World(spec=make_spec(2), keep_plans=True)
    statuses = [world.status]
    for evs in ([], [], [], [Ev("scale", 0)], [], [], [], [], [], [Ev("scale", 1)], [], [], [], [], []):
        world.step(evs, dt=3.0)
        statuses.append(world.status)
    flips = 0
    for before, after in pairwise(statuses[1:]):
        assert [c.type for c in after.conditions] == ["Available", "Progressing", "Degraded"]
        for cond in after.conditions:
            assert CAMEL.match(cond.reason), cond.reason
            assert cond.observed_generation == world.generation or cond.observed_generation is not None
            old = find(before.conditions, cond.type)
            assert old is not None
            if old.status == cond.status:
                assert cond.last_transition_time == old.last_transition_time
            else:
                flips += 1
                assert cond.last_transition_time > old.last_transition_time
    assert flips >= 2
    available = find(world.status.conditions, "Available")
    assert available is not None and (available.status, available.reason) == ("True", "ReplicasServing")


def test_scaled_to_zero_is_available_with_its_own_reason() -> None:
    plan = reconcile(observe(make_spec(0), []))
    available = find(plan.status.conditions, "Available")
    progressing = find(plan.status.conditions, "Progressing")
    assert available is not None and (available.status, available.reason) == ("True", "ScaledToZero")
    assert progressing is not None and (progressing.status, progressing.reason) == ("False", "AtTarget")


def test_history_keeps_only_the_last_operations_newest_last() -> None:
    world = converged_world(1, verification={"enabled": False})
    for i in range(HISTORY_LIMIT + 3):
        world.scale(2 if i % 2 == 0 else 1)
        run_until(world, world.converged)
    history = world.status.history
    assert len(history) == HISTORY_LIMIT
    ids = [int(h.id.split("-")[1]) for h in history]
    assert ids == sorted(ids) and ids[-1] == world.status.operation_count
    assert all(h.duration_seconds >= 0 for h in history)


def test_the_status_survives_its_wire_form() -> None:
    world = converged_world(2)
    world.scale(1)
    world.step()
    wire = world.status.to_wire()
    assert wire["operation"]["from"] == 2 and "from_" not in wire["operation"]
    assert wire["selector"] == "genrm.io/pool=judge"
    assert GenRMPoolStatus.model_validate(wire) == world.status


def test_replica_inflight_is_zero_when_the_sidecar_is_unknown() -> None:
    assert Replica(pod=serving_pod("judge-0"), role=Role.SERVING, sidecar=None).inflight == 0


def test_the_propagation_window_is_whole_even_when_the_unpublish_came_late_in_a_second() -> None:
    """Seen unpublished at x.9 s: the fence must not come before x.9 + propagationSeconds (a record in
    whole seconds would have shortened the window by up to a second, letting the fence meet traffic
    that endpoint propagation was still sending)."""
    spec = make_spec(1)  # propagationSeconds 2
    victim = {"name": "judge-1", "uid": "uid-judge-1"}
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="SoftDrain")}
    unpublished = reconcile(observe(spec, pods, sidecars, scale_in([victim], phase="Unpublishing"), now=NOW + 0.9))
    status = GenRMPoolStatus.model_validate(unpublished.status.to_wire())
    early = reconcile(observe(spec, pods, sidecars, status, now=NOW + 2.5))
    assert not [a for a in early.actions if isinstance(a, Drain) and a.phase == "fence"]
    due = reconcile(observe(spec, pods, sidecars, status, now=NOW + 2.9))
    assert Drain("judge-1", drain_id("uid-judge-1"), "fence") in due.actions


def test_a_drained_victim_counts_once_among_the_draining_replicas() -> None:
    """A victim that drained is both a victim left and a Drained replica: one replica, counted once."""
    victim = {"name": "judge-1", "uid": "uid-judge-1", "unpublishedAt": stamp(NOW - 20), "fencedAt": stamp(NOW - 10)}
    pods = [serving_pod("judge-0"), serving_pod("judge-1", published=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="Drained")}
    plan = reconcile(observe(make_spec(1), pods, sidecars, scale_in([victim])))
    assert DeletePod("judge-1", "uid-judge-1") in plan.actions
    assert plan.status.draining_replicas == 1


def test_counts_wait_for_the_operations_next_decision_and_nothing_else_does() -> None:
    """A status that differs only in a count is carried by the operation's next write of a
    decision, or written on its own once it waited ``REPORT_DELAY_SECONDS``; decisions (a phase, a
    victim's mark, a create seen), condition flips, a new observedGeneration and any change outside
    an operation are written at once (``report_waits``)."""
    world = converged_world(3)
    world.step([Ev("scale", 2)])
    running = world.status
    op = running.operation
    assert op is not None and op.victims, "the victims are recorded"
    fewer_ready = running.evolve(ready_replicas=running.ready_replicas - 1)
    assert report_waits(running, fewer_ready, 0.0)
    assert not report_waits(running, fewer_ready, REPORT_DELAY_SECONDS), "written on its own after the delay"
    draining = running.evolve(operation=op.evolve(phase=OperationPhase.DRAINING, message="1 victim(s) left",
                                                  last_transition_time=stamp(world.now + 1)))
    assert not report_waits(running, draining, 0.0), "a phase"
    fenced = running.evolve(operation=op.evolve(victims=[op.victims[0].evolve(fenced_at=stamp(world.now))]))
    assert not report_waits(running, fenced, 0.0), "the start of the drain timeout"
    degraded = [c.model_copy(update={"status": "True", "reason": "ReplicaFailed"}) if c.type == "Degraded" else c
                for c in running.conditions]
    assert not report_waits(running, running.evolve(conditions=degraded), 0.0), "a condition flip"
    assert not report_waits(running, running.evolve(observed_generation=running.observed_generation + 1), 0.0)
    idle = converged_world(3).status
    assert idle.operation is None
    assert not report_waits(idle, idle.evolve(ready_replicas=2), 0.0), "outside an operation: something went wrong"


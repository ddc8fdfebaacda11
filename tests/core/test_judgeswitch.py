"""Blue/green judge switches, in the simulated world (``world.py``).

The world's checks run at every step, one more among them for this: the pool's clients never reach
two judge revisions at once (`World.check_one_judge`: what the Service lists and what admits
requests on kept-alive connections). These tests add the sequence a user sees: a preview brought
up within itself, promoted by each mode, the previous revision fenced with the switch as reason and
retired after the scale-down delay, a rollback within it that loads nothing, and a preview
abandoned by a second change retired without ever taking traffic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from genrm_contract.sidecar import DrainPhase, DrainReason, DrainState
from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.api.status import ConditionType, Operation, OperationPhase, OperationType
from genrm_operator.core.children import service_manifest
from genrm_operator.core.childrenplan import PatchChild
from genrm_operator.core.clock import stamp
from genrm_operator.core.conditions import find
from genrm_operator.core.judge import judge_revision
from genrm_operator.core.judgeswitch import PEERS_LEAD_SECONDS, told_revisions
from genrm_operator.core.model import (
    CreatePod,
    Drain,
    LabelJudge,
    Observed,
    ObservedChildren,
    SetPublished,
    Undrain,
    Verify,
)
from genrm_operator.core.names import JUDGE_REVISION_LABEL
from genrm_operator.core.reconcile import reconcile

from .test_reconcile import NOW, converged_world, make_spec, observe, reasons, run_until, serving_pod
from .world import POOL, World


def blue_green(promotion: str, **more: Any) -> dict[str, Any]:
    return {"judgeUpdate": {"strategy": "BlueGreen", "blueGreen": {"promotion": promotion, **more}}}


def change_judge(world: World, path: str = "judge-v2") -> str:
    world.edit(model={"path": path})
    return judge_revision(world.spec)


def judges(world: World) -> dict[str, int]:
    live: dict[str, int] = {}
    for pod in world.pods.values():
        if not pod.deleting:
            live[pod.judge] = live.get(pod.judge, 0) + 1
    return live


def switch(world: World) -> Any:
    op = world.status.operation
    assert op is not None and op.type is OperationType.JUDGE_SWITCH, op
    return op


def test_an_auto_switch_brings_the_preview_up_beside_the_active_one_and_moves_the_service_in_one_step() -> None:
    world = converged_world(3, **blue_green("Auto", scaleDownDelaySeconds=5))
    old = judge_revision(world.spec)
    new = change_judge(world)
    run_until(world, lambda: judges(world).get(new, 0) == 3 and world.status.judge is not None
              and world.status.judge.active == new)
    # The preview was verified within itself: never against a replica of the other judge.
    verified = [a for plan in world.plans for a in plan.actions if isinstance(a, Verify)]
    assert verified and not [a for a in verified if a.reference and world.pods[a.reference].judge != new]
    assert {world.pods[n].judge for n in world.in_service_now()} == {new}
    run_until(world, world.converged, max_steps=100)
    assert judges(world) == {new: 3}
    last = world.status.history[-1]
    assert (last.type, last.outcome) == (OperationType.JUDGE_SWITCH, OperationPhase.SUCCEEDED)
    assert world.status.judge is not None and [r.name for r in world.status.judge.revisions] == [new]
    events = reasons(world.plans)
    assert events.index("JudgeSwitchStarted") < events.index("JudgePromoted") < events.index("JudgeRetiring") \
        < events.index("JudgeSwitchSucceeded")
    fences = [a for plan in world.plans for a in plan.actions if isinstance(a, Drain) and a.reason]
    assert fences and {(a.reason, a.active) for a in fences} == {(DrainReason.JUDGE_SWITCHED, new)}
    assert {n for n in (a.name for a in fences)} <= {p for p in world.names_ever if p} and old != new


def test_the_status_names_each_revision_and_its_role_while_the_switch_runs() -> None:
    world = converged_world(2, **blue_green("Manual"))
    old = judge_revision(world.spec)
    new = change_judge(world)
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.AWAITING_PROMOTION)
    judge = world.status.judge
    assert judge is not None and judge.active == old
    assert [(r.name, r.role, r.replicas, r.serving) for r in judge.revisions] == [(old, "Active", 2, 2),
                                                                                 (new, "Preview", 2, 2)]
    op = switch(world)
    assert (op.judge_from, op.judge_to) == (old, new)
    assert f"genrm.io/promote={new}" in op.message
    progressing = find(world.status.conditions, ConditionType.PROGRESSING)
    assert progressing is not None and progressing.reason == "SwitchingJudge"
    assert {world.pods[n].judge for n in world.in_service_now()} == {old}


def test_a_manual_switch_waits_for_the_annotation_naming_the_preview() -> None:
    world = converged_world(2, **blue_green("Manual", scaleDownDelaySeconds=0))
    old = judge_revision(world.spec)
    new = change_judge(world)
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.AWAITING_PROMOTION)
    world.promote = old  # naming another revision promotes nothing
    for _ in range(5):
        world.step()
    assert world.status.judge is not None and world.status.judge.active == old
    world.promote = new
    run_until(world, world.converged, max_steps=100)
    assert judges(world) == {new: 2} and world.status.judge is not None and world.status.judge.active == new


def test_an_idle_gap_switch_waits_while_the_active_revision_is_busy() -> None:
    world = converged_world(2, **blue_green("IdleGap", idleGapSeconds=3, scaleDownDelaySeconds=0))
    old = judge_revision(world.spec)
    busy = next(iter(world.serving()))
    world.arrive(busy, 2)
    new = change_judge(world)
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.AWAITING_PROMOTION)
    for _ in range(6):
        world.step()
    op = switch(world)
    assert op.phase is OperationPhase.AWAITING_PROMOTION and "in flight" in op.message
    assert world.status.judge is not None and world.status.judge.active == old
    world.finish(busy, 2)
    steps = run_until(world, lambda: world.status.judge is not None and world.status.judge.active == new)
    assert steps >= 3  # the gap is counted from the last request's end
    run_until(world, world.converged, max_steps=100)


def test_reverting_within_the_scale_down_delay_promotes_the_fenced_revision_back_without_loading_it() -> None:
    world = converged_world(2, **blue_green("Auto", scaleDownDelaySeconds=60))
    old = judge_revision(world.spec)
    new = change_judge(world)
    run_until(world, lambda: switch(world).phase is OperationPhase.PROMOTED and all(
        p.sidecar.state is DrainState.FENCED for p in world.pods.values() if p.judge == old))
    created = set(world.names_ever)
    world.plans.clear()
    change_judge(world, "org/judge-7b")  # the model the pool had: the previous revision again
    assert judge_revision(world.spec) == old
    run_until(world, lambda: world.status.judge is not None and world.status.judge.active == old)
    assert world.names_ever == created  # nothing was loaded again
    undrained = {a.name for plan in world.plans for a in plan.actions if isinstance(a, Undrain)}
    assert undrained == {p.name for p in world.pods.values() if p.judge == old}
    assert {world.pods[n].judge for n in world.in_service_now()} == {old}
    superseded = [h for h in world.status.history if h.type is OperationType.JUDGE_SWITCH]
    assert superseded[-1].outcome is OperationPhase.SUPERSEDED and superseded[-1].reason == "JudgeChanged"
    assert new in {p.judge for p in world.pods.values()}  # still fenced beside it, for the delay


def test_a_preview_abandoned_by_a_second_change_retires_without_ever_taking_the_pools_traffic() -> None:
    world = converged_world(2, **blue_green("Manual", scaleDownDelaySeconds=0))
    old = judge_revision(world.spec)
    first = change_judge(world)
    run_until(world, lambda: judges(world).get(first, 0) == 2)
    second = change_judge(world, "judge-v3")
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.AWAITING_PROMOTION
              and first not in judges(world))
    assert switch(world).judge_from == old and switch(world).judge_to == second
    world.promote = second
    run_until(world, world.converged, max_steps=100)
    assert judges(world) == {second: 2}


def test_a_pool_without_blue_green_never_starts_a_switch_and_keeps_its_service_unpinned() -> None:
    world = converged_world(2)
    for _ in range(3):
        world.step()
    assert world.status.judge is not None and world.status.judge.active == judge_revision(world.spec)
    assert world.pinned() is None
    assert not [a for plan in world.plans for a in plan.actions if isinstance(a, CreatePod)]


def switching_status(judge_from: str, judge_to: str) -> GenRMPoolStatus:
    op = Operation.model_validate({
        "id": "op-4", "type": "JudgeSwitch", "from": 1, "to": 1, "phase": "Provisioning",
        "startedAt": stamp(NOW - 30), "lastTransitionTime": stamp(NOW - 30), "judgeFrom": judge_from,
        "judgeTo": judge_to, "addedPods": [{"name": "judge-1", "ordinal": 1, "observed": True}],
    })
    return GenRMPoolStatus.model_validate({"nextOrdinal": 2, "operationCount": 4, "judge": {"active": judge_from}}
                                          ).model_copy(update={"operation": op})


def with_service(obs: Observed, pinned: str | None) -> Observed:
    service = service_manifest(POOL, "pool-uid", "ml", obs.spec, pinned)
    return dataclasses.replace(obs, children=ObservedChildren(pool_uid="pool-uid", namespace="ml", token="t",
                                                              objects={"Service": service}))


def test_the_service_pins_the_active_revision_from_the_written_status_before_a_preview_is_published() -> None:
    spec = make_spec(1, model={"path": "judge-v2"}, **blue_green("Manual"))
    new = judge_revision(spec)
    active = serving_pod("judge-0", judge="old0000000")
    preview = serving_pod("judge-1", judge=new, published=False, ever_published=False)
    obs = observe(spec, [active, preview], status=switching_status("old0000000", new))
    unpinned = reconcile(with_service(obs, None))
    patches = [c for c in unpinned.children if isinstance(c, PatchChild) and c.kind == "Service"]
    assert patches and patches[0].patch["spec"]["selector"][JUDGE_REVISION_LABEL] == "old0000000"
    assert not [a for a in unpinned.actions if isinstance(a, SetPublished) and a.name == "judge-1"]
    pinned = reconcile(with_service(obs, "old0000000"))
    assert not [c for c in pinned.children if isinstance(c, PatchChild)]
    assert [a for a in pinned.actions if isinstance(a, SetPublished) and a.name == "judge-1" and a.published]


def test_the_previous_revision_is_fenced_once_its_gateways_had_time_to_hold_the_new_peers() -> None:
    """Fenced for the switch, a gateway hands what reaches it to the new judge: the fence waits for its
    new peers, not for the Service's move (kube-proxy may lag it anyway)."""
    spec = make_spec(1, model={"path": "judge-v2"}, **blue_green("Auto"))
    new = judge_revision(spec)
    status = switching_status("old0000000", new)
    assert status.operation is not None and status.judge is not None
    status = status.model_copy(update={
        "judge": status.judge.evolve(active=new),
        "operation": status.operation.evolve(phase=OperationPhase.PROMOTED, promoted_at=stamp(NOW))})
    pods = [serving_pod("judge-0", judge="old0000000"), serving_pod("judge-1", judge=new)]
    obs = observe(spec, pods, status=status)
    assert not [a for a in reconcile(with_service(obs, "old0000000")).actions if isinstance(a, Drain)]
    later = reconcile(with_service(dataclasses.replace(obs, now=NOW + PEERS_LEAD_SECONDS), "old0000000"))
    assert [a for a in later.actions if isinstance(a, Drain)] == [
        Drain("judge-0", "genrm/uid-judge-0", DrainPhase.FENCE, DrainReason.JUDGE_SWITCHED, new)]


def test_pods_made_before_judge_revisions_are_labelled_before_a_switch_starts() -> None:
    """A pod without the judge label would fall out of the Service's pin, and later count as the new
    judge's: it is labelled with the active revision first, and the switch waits for the label."""
    spec = make_spec(2, model={"path": "judge-v2"}, **blue_green("Auto"))
    old = judge_revision(make_spec(2))
    pods = [serving_pod("judge-0", judge=""), serving_pod("judge-1", judge=old)]
    status = GenRMPoolStatus.model_validate({"nextOrdinal": 2, "judge": {"active": old}})
    plan = reconcile(observe(spec, pods, status=status))
    assert [a for a in plan.actions if isinstance(a, LabelJudge)] == [LabelJudge("judge-0", "uid-judge-0", old)]
    assert plan.status.operation is None and not [a for a in plan.actions if isinstance(a, CreatePod)]
    labelled = reconcile(observe(spec, [dataclasses.replace(pods[0], judge=old), pods[1]], status=status))
    assert labelled.status.operation is not None and labelled.status.operation.type is OperationType.JUDGE_SWITCH


def test_the_preview_is_made_whole_when_the_active_revision_has_more_pods_than_the_spec_asks() -> None:
    """Nothing scales the active revision during a switch: with 4 active pods and spec.replicas 2 (one
    apply lowered the count and changed the judge), the preview still gets its 2 pods."""
    world = converged_world(4, **blue_green("Manual"))
    world.edit(replicas=2, model={"path": "judge-v2"})
    new = judge_revision(world.spec)
    run_until(world, lambda: switch(world).phase is OperationPhase.AWAITING_PROMOTION if world.status.operation
              else False)
    assert judges(world)[new] == 2


def test_the_gateways_are_told_the_active_and_preview_revisions_from_the_written_status() -> None:
    spec = make_spec(1, model={"path": "judge-v2"}, **blue_green("Manual"))
    new = judge_revision(spec)
    assert told_revisions(observe(spec, [])) is None
    status = switching_status("old0000000", new)
    assert told_revisions(observe(spec, [], status=status)) == ("old0000000", new)
    assert status.operation is not None and status.judge is not None
    promoted = status.model_copy(update={"judge": status.judge.evolve(active=new), "operation": status.operation.evolve(
        phase=OperationPhase.PROMOTED, promoted_at=stamp(NOW))})
    assert told_revisions(observe(spec, [], status=promoted)) == (new, None)
    assert told_revisions(observe(spec, [], status=promoted.model_copy(update={"operation": None}))) == (new, None)

"""Rolling updates of the pod template, in the simulated world (``world.py``).

A change to anything that shapes a replica pod gives it a new revision; with the default
``RollingUpdate`` (maxSurge 1, maxUnavailable 0) the core replaces the replicas one at a
time: a surge replica is created, verified and published before an outdated one is drained
exactly like a scale-in victim. The world's own checks run at every step (no request lost,
published only when verified, the pod bound, the serving floor, no Partial blaming a pod
deleted while healthy); these tests add the sequence, the status and the conditions a user sees.

A second change before the first rollout is done retargets it: its surge replica is outdated
and the rollout retires it itself, whether it was starting, being verified or already
published. The kubelet then ends the deleted pod Succeeded or Failed (the world does so too),
which is no failure: the rollout still ends Succeeded and nothing backs off. A surge replica
that really fails still ends the rollout Partial. One whose containers cannot be created (an
invalid image name in the new template) ends it Partial without choosing any outdated replica to make room.
"""

from __future__ import annotations

from collections.abc import Callable

from genrm_operator.api.status import ConditionType, OperationPhase, OperationType
from genrm_operator.core.backoff import create_backoff
from genrm_operator.core.conditions import find
from genrm_operator.core.model import DeletePod, Drain
from genrm_operator.core.step import NEVER_SERVED_GRACE_SECONDS

from .test_reconcile import converged_world, reasons, run_until
from .world import SimPod, World

ENV = {"env": [{"name": "JUDGE_MODE", "value": "strict"}]}


def change_template(world: World) -> None:
    world.edit(engine={**world.spec.engine.to_wire(), **ENV})


def serving_count(world: World) -> int:
    return len(world.serving())


def test_a_template_change_replaces_every_replica_surge_first_and_never_below_the_count() -> None:
    world = converged_world(3)
    old = world.revision
    change_template(world)
    assert world.revision != old
    most_pods, least_serving = 0, 3
    def done() -> bool:
        nonlocal most_pods, least_serving
        most_pods = max(most_pods, len([p for p in world.pods.values() if not p.deleting]))
        least_serving = min(least_serving, serving_count(world))
        return world.converged()
    run_until(world, done, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}
    assert most_pods <= 4 and least_serving >= 3
    last = world.status.history[-1]
    assert (last.type, last.outcome) == (OperationType.ROLLOUT, OperationPhase.SUCCEEDED)
    assert "3 replica(s) replaced" in last.message
    status = world.status
    assert (status.updated_replicas, status.update_revision, status.current_revision) == (3, world.revision,
                                                                                         world.revision)
    events = reasons(world.plans)
    assert events.index("RolloutStarted") < events.index("ReplicaPublished") < events.index("ReplicasRetiring")


def test_during_a_rollout_the_status_shows_the_operation_and_the_old_revision() -> None:
    world = converged_world(2)
    old = world.revision
    change_template(world)
    world.step()
    status = world.status
    assert status.operation is not None and status.operation.type is OperationType.ROLLOUT
    assert status.operation.revision == world.revision
    assert (status.current_revision, status.update_revision, status.updated_replicas) == (old, world.revision, 0)
    progressing = find(status.conditions, ConditionType.PROGRESSING)
    assert progressing is not None and progressing.reason == "RollingOut"
    blocked = find(status.conditions, ConditionType.ROLLOUT_BLOCKED)
    assert blocked is not None and blocked.status == "False"


def test_no_spare_gpu_and_no_unavailability_allowed_blocks_the_rollout_visibly() -> None:
    world = converged_world(2)
    world.gpus = 2
    change_template(world)
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.PROVISIONING
              and any(p.unschedulable for p in world.pods.values()), max_steps=20)
    world.step()
    blocked = find(world.status.conditions, ConditionType.ROLLOUT_BLOCKED)
    assert blocked is not None and blocked.status == "True" and blocked.reason == "SurgeBlocked"
    assert "Insufficient nvidia.com/gpu" in blocked.message and "maxUnavailable=0" in blocked.message
    assert ConditionType.ROLLOUT_BLOCKED in reasons(world.plans)
    for _ in range(10):
        world.step()
    assert serving_count(world) == 2  # nothing old was drained
    world.gpus = 3
    run_until(world, world.converged, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}


def test_with_max_unavailable_a_blocked_surge_falls_back_to_drain_first() -> None:
    world = converged_world(2, updateStrategy={"type": "RollingUpdate",
                                               "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}})
    world.gpus = 2
    change_template(world)
    least = 2
    def done() -> bool:
        nonlocal least
        least = min(least, serving_count(world))
        return world.converged()
    run_until(world, done, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}
    assert least == 1  # one replica out at a time, as maxUnavailable allows
    assert ConditionType.ROLLOUT_BLOCKED not in reasons(world.plans)


def test_a_surge_replica_that_cannot_start_ends_the_rollout_partial_without_draining_old_ones() -> None:
    world = converged_world(2, updateStrategy={"type": "RollingUpdate",
                                               "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}})
    old = set(world.pods)
    world.cannot_start = 'container engine: InvalidImageName: couldn\'t parse image name "judge:Typo!"'
    change_template(world)
    run_until(world, lambda: any(h.reason == "ReplicaCannotStart" for h in world.status.history), max_steps=40)
    assert "judge:Typo!" in world.status.history[-1].message
    for _ in range(20):
        world.step([])
    drained = [a for p in world.plans for a in p.actions if isinstance(a, Drain)]
    assert not drained and serving_count(world) == 2, "the old replicas keep serving: draining one would not help"
    assert "ReplicasRetiring" not in reasons(world.plans), "no old replica is even chosen to make room"
    assert old <= set(world.pods)
    world.cannot_start = ""
    run_until(world, world.converged, max_steps=400)
    assert {p.revision for p in world.pods.values()} == {world.revision}


def test_surge_replicas_one_unplaceable_and_one_that_cannot_start_still_end_the_rollout_partial() -> None:
    world = converged_world(2, updateStrategy={"type": "RollingUpdate",
                                               "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0}})
    world.gpus = 3  # room for one surge replica: the second cannot be placed
    world.cannot_start = 'container engine: CreateContainerConfigError: secret "hf-token" not found'
    change_template(world)
    run_until(world, lambda: any(h.reason == "ReplicaCannotStart" for h in world.status.history), max_steps=40)
    assert 'secret "hf-token"' in world.status.history[-1].message
    assert any(p.unschedulable for p in world.pods.values()), "the mixed case: one surge replica unplaceable"


def test_pause_stops_between_replacements_and_resume_finishes() -> None:
    world = converged_world(3)
    change_template(world)
    run_until(world, lambda: world.status.operation is not None and bool(world.status.operation.victims))
    world.edit(paused=True)
    run_until(world, lambda: world.status.operation is not None
              and world.status.operation.phase is OperationPhase.PAUSED,
              max_steps=100)
    replaced = world.status.operation.replaced
    outdated = sum(1 for p in world.pods.values() if p.revision != world.revision)
    for _ in range(20):
        world.step()
    assert world.status.operation.phase is OperationPhase.PAUSED and world.status.operation.replaced == replaced
    assert sum(1 for p in world.pods.values() if p.revision != world.revision) == outdated > 0
    progressing = find(world.status.conditions, ConditionType.PROGRESSING)
    assert progressing is not None and (progressing.status, progressing.reason) == ("False", "RolloutPaused")
    world.edit(paused=False)
    run_until(world, world.converged, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}


def test_on_delete_leaves_replicas_alone_until_they_are_deleted() -> None:
    world = converged_world(2, updateStrategy={"type": "OnDelete"})
    old = world.revision
    change_template(world)
    for _ in range(30):
        world.step()
    assert {p.revision for p in world.pods.values()} == {old}
    assert world.status.operation is None and world.status.updated_replicas == 0
    victim = world.pod_at(0)
    assert victim is not None
    world.admin_delete(victim)
    run_until(world, world.converged, max_steps=100)
    assert sorted(p.revision for p in world.pods.values()) == sorted([old, world.revision])
    assert world.status.updated_replicas == 1


def test_a_scale_in_during_a_rollout_supersedes_it_and_takes_outdated_replicas_first() -> None:
    world = converged_world(3)
    change_template(world)
    run_until(world, lambda: any(p.revision == world.revision and p.published for p in world.pods.values()))
    world.scale(1)
    run_until(world, world.converged, max_steps=300)
    kinds = [(h.type, h.outcome) for h in world.status.history]
    assert (OperationType.ROLLOUT, OperationPhase.SUPERSEDED) in kinds
    assert [p.revision for p in world.pods.values()] == [world.revision]


def test_a_scale_out_during_a_rollout_creates_new_template_replicas() -> None:
    world = converged_world(2)
    change_template(world)
    world.step()
    world.scale(4)
    run_until(world, world.converged, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}
    assert len(world.pods) == 4


def test_a_surge_replica_on_its_way_is_not_a_blocked_rollout() -> None:
    # Regression: with maxSurge 1 the surge replica fills the room; while it starts (scheduled,
    # or its create not yet observed) the rollout is progressing, not blocked.
    world = converged_world(3)
    change_template(world)
    def done() -> bool:
        blocked = find(world.status.conditions, ConditionType.ROLLOUT_BLOCKED)
        assert blocked is None or blocked.status == "False", blocked
        return world.converged()
    run_until(world, done, max_steps=300)
    assert ConditionType.ROLLOUT_BLOCKED not in reasons(world.plans)


def retarget(world: World, surge_reached: Callable[[SimPod], bool]) -> SimPod:
    """Change the template, step until its surge replica ``surge_reached``, then change the template
    again: the rollout is retargeted and that replica is outdated before it replaced anything."""
    change_template(world)
    first = world.revision

    def surge() -> SimPod | None:
        return next((p for p in world.pods.values() if p.revision == first), None)
    run_until(world, lambda: (pod := surge()) is not None and surge_reached(pod), max_steps=30)
    pod = surge()
    assert pod is not None
    world.edit(engine={**world.spec.engine.to_wire(), "env": [{"name": "JUDGE_MODE", "value": "lenient"}]})
    return pod


def deletes_of(world: World, name: str) -> list[DeletePod]:
    return [a for p in world.plans for a in p.actions if isinstance(a, DeletePod) and a.name == name]


def assert_retired_without_blame(world: World, surge: SimPod) -> None:
    """The retargeted rollout retires ``surge`` itself, the core sees the kubelet's answer to that
    deletion (a terminal phase on a Terminating pod), and the rollout still ends Succeeded with no
    Warning and no back-off."""
    answered = False

    def done() -> bool:
        nonlocal answered
        answered = answered or (surge.name in world.pods and surge.deleting
                                and surge.phase in ("Succeeded", "Failed"))
        return world.converged()
    run_until(world, done, max_steps=300)
    assert answered and surge.name in world.names_deleted
    rollouts = [(h.outcome, h.reason) for h in world.status.history if h.type is OperationType.ROLLOUT]
    assert rollouts == [(OperationPhase.SUCCEEDED, "TargetReached")], world.status.history
    events = reasons(world.plans)
    assert "RolloutRetargeted" in events
    assert "RolloutPartial" not in events and "ReplicaFailed" not in events, events
    assert {p.revision for p in world.pods.values()} == {world.revision}
    assert create_backoff(world.status.history, world.now) == 0.0


def test_a_retarget_retires_an_unpublished_surge_replica_without_blaming_it() -> None:
    world = converged_world(3)
    surge = retarget(world, lambda pod: pod.scheduled_at is not None and not pod.warm)
    assert_retired_without_blame(world, surge)
    assert deletes_of(world, surge.name)[0].grace_seconds == NEVER_SERVED_GRACE_SECONDS  # never served


def test_a_retarget_during_verification_retires_the_surge_replica_without_blaming_it() -> None:
    world = converged_world(3)
    surge = retarget(world, lambda pod: pod.warm and not pod.published)
    assert world.status.operation is not None and world.status.operation.phase is OperationPhase.VERIFYING
    assert_retired_without_blame(world, surge)
    assert not surge.ever_published


def test_a_retarget_drains_a_published_surge_replica_and_does_not_blame_it() -> None:
    world = converged_world(3)
    surge = retarget(world, lambda pod: pod.published)
    assert_retired_without_blame(world, surge)
    assert any(isinstance(a, Drain) and a.name == surge.name for p in world.plans for a in p.actions)
    assert deletes_of(world, surge.name)[0].grace_seconds is None  # it served: drained, then deleted


def test_a_surge_replica_that_really_fails_still_ends_the_rollout_partial_and_backs_off() -> None:
    world = converged_world(3)
    change_template(world)
    run_until(world, lambda: any(p.revision == world.revision and p.scheduled_at is not None
                                 for p in world.pods.values()), max_steps=10)
    surge = next(p for p in world.pods.values() if p.revision == world.revision)
    world.fail(surge)
    run_until(world, lambda: any(h.type is OperationType.ROLLOUT for h in world.status.history), max_steps=20)
    last = world.status.history[-1]
    assert (last.type, last.outcome, last.reason, last.message) == (
        OperationType.ROLLOUT, OperationPhase.PARTIAL, "ReplicaFailed", f"{surge.name}: ReplicaFailed")
    assert surge.name not in world.pods, "gone before the rollout ended: the failure was remembered"
    assert "RolloutPartial" in reasons(world.plans)
    assert create_backoff(world.status.history, world.now) > 0.0
    run_until(world, world.converged, max_steps=300)
    assert {p.revision for p in world.pods.values()} == {world.revision}

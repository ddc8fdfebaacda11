"""A scale-in never leaves the Service empty while a victim could serve, and "serving" means a ready
endpoint of the Service.

Aspects under test:
- a published victim stays published while no other replica is a ready endpoint (the survivor
  NotReady, or published but not yet listed by the EndpointSlices), with a VictimKeptPublished event
  once and the operation's message saying so; it leaves once another one is;
- a victim already taken out (soft-drained or fenced) is undrained and published again once Ready
  (VictimRescued); a Drained one never is;
- a scale-in whose survivor failed gives the victim back and ends, instead of waiting for a
  replacement no operation creates;
- scale to zero holds nothing (the activator's guard decides there);
- a scale-out succeeds only once its replicas are ready endpoints, and the status counts only those
  as serving;
- in the simulated world: a survivor going NotReady right after the victim was unpublished gets the
  victim undrained and republished, and the pool converges once it recovers.
"""

from __future__ import annotations

from typing import Any

from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.api.status import Operation
from genrm_operator.core.clock import stamp
from genrm_operator.core.model import DeletePod, Drain, Observed, Plan, SetPublished, Undrain, needs_record
from genrm_operator.core.names import drain_id
from genrm_operator.core.reconcile import reconcile

from .test_reconcile import (
    NOW,
    converged_world,
    make_spec,
    names,
    observe,
    reasons,
    run_until,
    scale_in,
    serving_pod,
    serving_sidecar,
)
from .world import POOL, Ev

VICTIM = {"name": "judge-1", "uid": "uid-judge-1", "needsDrain": True}


def step(pods: list[Any], sidecars: dict[str, Any] | None = None, endpoints: frozenset[str] | None = None,
         status: GenRMPoolStatus | None = None, replicas: int = 1) -> Plan:
    obs = observe(make_spec(replicas), pods, sidecars, status or scale_in([VICTIM], phase="Unpublishing"))
    return reconcile(Observed(**{**obs.__dict__, "endpoints": endpoints}))


def unpublished(at: float = NOW - 1) -> dict[str, Any]:
    return {**VICTIM, "unpublishedAt": stamp(at).isoformat()}


def test_a_published_victim_stays_while_the_survivor_is_not_ready() -> None:
    plan = step([serving_pod("judge-0", ready=False), serving_pod("judge-1")])
    assert not [a for a in plan.actions if isinstance(a, (SetPublished, Drain))]
    assert reasons([plan]) == ["VictimKeptPublished"]
    op = plan.status.operation
    assert op is not None and op.victims[0].held_at is not None
    assert "judge-1 kept in the Service: no other replica serves" in op.message
    # Held on the next step too, with no second event.
    again = reconcile(observe(make_spec(1), [serving_pod("judge-0", ready=False), serving_pod("judge-1")],
                              status=plan.status))
    assert reasons([again]) == [] and not names(again, Drain)


def test_a_victim_stays_until_the_survivor_is_a_ready_endpoint_of_the_service() -> None:
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    held = step(pods, endpoints=frozenset({"judge-1"}))
    assert not names(held, Drain) and reasons([held]) == ["VictimKeptPublished"]
    released = step(pods, endpoints=frozenset({"judge-0", "judge-1"}), status=held.status)
    assert SetPublished("judge-1", "uid-judge-1", False) in released.actions
    op = released.status.operation
    assert op is not None and op.victims[0].held_at is None and "kept" not in op.message


def test_a_soft_drained_victim_is_undrained_and_published_again_at_once() -> None:
    pods = [serving_pod("judge-0", ready=False), serving_pod("judge-1", published=False, ready=False)]
    sidecars = {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="SoftDrain")}
    plan = step(pods, sidecars, status=scale_in([unpublished()], phase="Unpublishing"))
    # The label goes on with the undrain, both after the record: a Conflict cancels both.
    assert plan.actions == (Undrain("judge-1", drain_id("uid-judge-1")),
                            SetPublished("judge-1", "uid-judge-1", True, rescue=True))
    assert all(needs_record(action) for action in plan.actions)
    assert reasons([plan]) == ["VictimRescued"]
    victim = plan.status.operation.victims[0]  # type: ignore[union-attr]
    assert victim.unpublished_at is None and victim.held_at is not None

    held = [serving_pod("judge-0", ready=False), serving_pod("judge-1")]
    again = step(held, status=plan.status)
    assert again.actions == () and reasons([again]) == []


def test_a_fenced_victim_is_undrained_but_a_drained_one_is_deleted() -> None:
    pods = [serving_pod("judge-0", ready=False), serving_pod("judge-1", published=False, ready=False)]
    fenced = {**unpublished(NOW - 30), "fencedAt": stamp(NOW - 20).isoformat()}
    plan = step(pods, {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="Fenced", inflight=2)},
                status=scale_in([fenced]))
    assert names(plan, Undrain) == ["judge-1"] and not names(plan, DeletePod)

    drained = step(pods, {"judge-0": serving_sidecar(), "judge-1": serving_sidecar(state="Drained")},
                   status=scale_in([fenced]))
    assert names(drained, DeletePod) == ["judge-1"] and not names(drained, Undrain)


def test_a_scale_in_whose_survivor_failed_gives_the_victim_back_and_ends() -> None:
    pods = [serving_pod("judge-0", restarts=1, ready=False), serving_pod("judge-1")]
    plan = step(pods)
    assert plan.status.operation is None
    entry = plan.status.history[-1]
    assert (entry.outcome, entry.reason) == ("Succeeded", "TargetReached")
    assert "kept judge-1: the pool needs it again" in entry.message
    assert "VictimKeptPublished" in reasons([plan])
    assert "judge-1" not in names(plan, DeletePod) + names(plan, Drain)
    assert SetPublished("judge-1", "uid-judge-1", False) not in plan.actions


def test_scale_to_zero_holds_nothing() -> None:
    status = scale_in([VICTIM, {"name": "judge-0", "uid": "uid-judge-0"}], to=0, phase="Unpublishing")
    plan = step([serving_pod("judge-0", ready=False), serving_pod("judge-1")], status=status, replicas=0)
    assert sorted(a.name for a in plan.actions if isinstance(a, SetPublished) and not a.published) == [
        "judge-0", "judge-1"]


def scale_out_status() -> GenRMPoolStatus:
    op = Operation.model_validate({
        "id": "op-7", "type": "ScaleOut", "from": 0, "to": 1, "phase": "Verifying",
        "startedAt": stamp(NOW - 100), "lastTransitionTime": stamp(NOW - 50),
        "addedPods": [{"name": "judge-0", "ordinal": 0, "observed": True}],
    })
    return GenRMPoolStatus.model_validate({"nextOrdinal": 1, "operationCount": 7}).model_copy(update={"operation": op})


def test_a_scale_out_succeeds_only_once_its_replica_is_a_ready_endpoint() -> None:
    published = [serving_pod("judge-0")]
    waiting = step(published, endpoints=frozenset(), status=scale_out_status())
    op = waiting.status.operation
    assert op is not None and op.phase == "Verifying"
    assert op.message == "0/1 serving; 1 published, not yet ready endpoints of the Service"
    assert waiting.status.serving_replicas == 0
    done = step(published, endpoints=frozenset({"judge-0"}), status=waiting.status)
    assert done.status.operation is None and done.status.history[-1].outcome == "Succeeded"
    assert done.status.serving_replicas == 1


def test_a_survivor_going_not_ready_after_the_unpublish_gets_the_victim_back_in_the_world() -> None:
    world = converged_world(2, drain={"propagationSeconds": 3})
    world.scale(1)
    run_until(world, lambda: any(not p.published and p.sidecar.state == "SoftDrain" for p in world.pods.values()))
    [victim] = [p for p in world.pods.values() if not p.published]
    [survivor] = [p for p in world.pods.values() if p.published]
    survivor_index = sorted(world.pods, key=lambda n: world.pods[n].ordinal).index(survivor.name)
    world.plans.clear()
    rescued = world.step([Ev("sick", survivor_index, 3)])
    assert names(rescued, Undrain) == [victim.name]
    assert SetPublished(victim.name, victim.uid, True, rescue=True) in rescued.actions
    assert reasons([rescued]) == ["VictimRescued"]
    assert world.in_service_now() == {victim.name}
    run_until(world, world.converged)
    assert world.status.history[-1].type == "ScaleIn" and world.status.history[-1].outcome == "Succeeded"
    assert len(world.pods) == 1 and POOL in next(iter(world.pods))


def test_a_held_victims_fence_clock_counts_only_the_time_it_was_not_held() -> None:
    """A survivor whose readiness blips must not restart the victim's drain for ever (the drain
    timeout must still come), nor may a long hold use the timeout up."""
    fenced_at, held_at = NOW - 50, NOW - 30
    held = {**VICTIM, "fencedAt": stamp(fenced_at).isoformat(), "heldAt": stamp(held_at).isoformat()}
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    released = step(pods, status=scale_in([held], phase="Unpublishing"))
    victim = released.status.operation.victims[0]  # type: ignore[union-attr]
    assert victim.held_at is None and victim.fenced_at is not None
    # Fenced 20 s before the hold; the 30 s held do not count.
    assert victim.fenced_at.timestamp() == fenced_at + (NOW - held_at)
    assert SetPublished("judge-1", "uid-judge-1", False) in released.actions


def test_a_published_replica_left_draining_outside_any_operation_is_undrained() -> None:
    """A victim put back whose undrain was lost when its operation was superseded."""
    pods = [serving_pod("judge-0"), serving_pod("judge-1")]
    plan = reconcile(observe(make_spec(2), pods, {"judge-0": serving_sidecar(),
                                                  "judge-1": serving_sidecar(state="SoftDrain")}))
    assert Undrain("judge-1", drain_id("uid-judge-1")) in plan.actions
    assert not names(plan, Drain) and not names(plan, DeletePod)

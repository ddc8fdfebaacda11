"""Every event the core records carries a reason of the users' vocabulary (``EventReason``), and every
failure a replica is replaced for one of ``FailureReason``: generated disturbances, rollouts
included, against the simulated world."""

from __future__ import annotations

from genrm_operator.api.status import EventReason, FailureReason
from hypothesis import given
from hypothesis import strategies as st

from .test_properties import KINDS, budget, rollout_specs, sequences, settle
from .world import World

REASONS = {str(r) for r in EventReason}


@budget(120)
@given(spec=rollout_specs(), steps=sequences((*KINDS, "template", "pause", "perturb")), gpus=st.integers(1, 8))
def test_every_event_reason_and_failure_is_in_the_vocabulary(spec: object, steps: list[list[object]],
                                                              gpus: int) -> None:
    world = World(spec=spec, keep_plans=True)  # type: ignore[arg-type]
    world.gpus = gpus
    for evs in steps:
        world.step(evs)  # type: ignore[arg-type]
    settle(world, "after the disturbances")
    reasons = {e.reason for p in world.plans for e in p.events}
    assert reasons <= REASONS, reasons - REASONS
    failures = {a.failure for p in world.plans if p.status.operation is not None
                for a in p.status.operation.added_pods if a.failure}
    assert failures <= {str(f) for f in FailureReason}, failures


def test_operation_events_are_spelt_from_the_type_and_the_stage() -> None:
    assert EventReason.operation("ScaleIn", "Superseded") is EventReason.SCALE_IN_SUPERSEDED  # type: ignore[arg-type]
    assert EventReason.operation("Rollout", "Started") is EventReason.ROLLOUT_STARTED  # type: ignore[arg-type]

"""Closed-loop runs of the benchmark profile: step to 4x one replica's capacity, hold, drop to zero."""

from __future__ import annotations

from itertools import pairwise

import pytest
from genrm_operator.api.autoscaling import AutoscalingSpec

from bench.simulate import LoadProfile, simulate

SPEC = AutoscalingSpec.model_validate(
    {
        "mode": "Auto",
        "maxReplicas": 16,
        "intervalSeconds": 2,
        "metrics": [{"type": "InFlight", "target": {"averageValue": "8"}}],
    }
)


@pytest.mark.parametrize("startup_s", [5, 30, 120])
def test_bench_targets_with_a_closed_loop_load(startup_s: float) -> None:
    result = simulate(SPEC, LoadProfile(), startup_s=startup_s, duration_s=400)
    assert result.reaction_s is not None and result.reaction_s <= 2 * 2.0
    assert result.flaps == 0
    assert result.overshoot_replicas <= 1
    assert result.settle_s is not None and result.settle_s <= startup_s + 2 * 2.0
    assert result.replicas[-1][1] == 4  # the 600 s scale-down window has not passed


def test_open_loop_backlog_is_followed_at_most_once_per_startup() -> None:
    """Open loop: the backlog piling up while replicas load cannot order replicas before they serve."""
    startup_s = 60.0
    result = simulate(SPEC, LoadProfile(), startup_s=startup_s, duration_s=400, closed_loop=False)
    ups = [t for d, (t, _, _) in zip(result.decisions, result.replicas, strict=True)
           if d.apply and d.desired_replicas > d.current_replicas]
    assert result.reaction_s is not None and result.reaction_s <= 4.0
    assert all(b - a >= startup_s for a, b in pairwise(ups))
    assert result.flaps == 0


def test_load_drop_scales_in_after_the_window() -> None:
    quick = SPEC.model_copy(
        update={"behavior": SPEC.behavior.model_copy(
            update={"scale_down": SPEC.behavior.scale_down.model_copy(update={"stabilization_window_seconds": 30})}
        )}
    )
    result = simulate(quick, LoadProfile(drop_at_s=100), startup_s=10, duration_s=700)
    assert result.replicas[-1][1] == 1

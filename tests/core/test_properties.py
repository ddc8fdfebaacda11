"""Property-based tests of the reconcile core in a simulated world (see ``world.py``).

Hypothesis generates a pool spec and a sequence of up to 30 steps, each with up to two
disturbances (spec.replicas changes, requests arriving and finishing, crashes, pod
failures, slow starts, GPU capacity changes, clock jumps, lost actions, refused status
writes (the creates beside them done), index lag,
unreachable sidecars, pods deleted by hand, replicas that answer differently). The world
checks at every step, against ground truth:

- a replica with in-flight requests is never deleted unless its drain timed out under
  ``drain.onTimeout: Force``; an ever-published replica is deleted only once its sidecar
  is Drained (or it failed, or it was forced);
- the pod-count bound of ``reconcile.py``'s docstring: pods holding GPUs (Terminating and
  Drained included, failed ones excepted) never exceed ``max(spec.replicas, their count
  before the step)``;
- no pod name is ever used twice and ``status.nextOrdinal`` stays ahead of every ordinal;
- a replica is published only when the core saw it ready with a warm engine and, with
  verification enabled, its verification passed;
- the status survives its wire form, a finished operation never stays active, and the
  three conditions are always present;
- an operation that ends Partial or Failed never blames a pod deleted while nothing was wrong
  with it, by the core (a victim, a surge replica a retarget made outdated) or by hand, although
  every deleted pod that ran is seen Terminating in the kubelet's terminal phase first;

- a scale-in, or a rollout that means to leave replicas serving, unpublishes a healthy victim only
  while another replica is a ready endpoint of the Service, and puts a healthy replica that served
  back at the next undisturbed step when no published replica is Ready any more (`check_last_out`,
  `check_rescue`);

and finally that once inputs stop changing and the world is healthy with enough GPUs,
the pool converges to ``spec.replicas`` serving replicas and no operation within a
bounded number of steps, and then stays quiet; on nodes of two GPU products, it then serves
from one.

Runs 3,200 generated sequences in total (derandomized, so CI is reproducible).
"""

from __future__ import annotations

import math

from genrm_operator.api.pool import GenRMPoolSpec
from genrm_operator.core.backoff import BACKOFF_MAX_SECONDS
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .world import Ev, Violation, World

CALM_DT = 2.0


def budget(max_examples: int) -> settings:
    """Reproducible settings for CI: derandomized, no deadline, no example database."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


KINDS = (
    "none", "none", "none", "scale", "scale", "scale", "arrive", "arrive", "arrive", "finish", "finish",
    "crash", "fail", "slow", "perturb", "gpus", "tick", "tick", "lose", "unwritten", "stale", "lag", "lag",
    "unreachable", "admin_delete", "sick",
)
TICKS = (1, 2, 5, 30)


def make_spec(replicas: int, propagation: int, quiet: int, timeout: int, on_timeout: str,
              verification: bool, startup: int, surge: int = 1, unavailable: int = 0,
              strategy: str = "RollingUpdate") -> GenRMPoolSpec:
    return GenRMPoolSpec.model_validate({
        "updateStrategy": {"type": strategy, "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
        "replicas": replicas,
        "model": {"path": "org/judge-7b"},
        "engine": {"startupTimeoutSeconds": startup},
        "drain": {"propagationSeconds": propagation, "quietSeconds": quiet, "timeoutSeconds": timeout,
                  "onTimeout": on_timeout},
        "verification": {"enabled": verification},
    })


def to_event(kind: str, a: int, b: int) -> Ev:
    if kind == "scale":
        return Ev(kind, a % 6)
    if kind == "gpus":
        return Ev(kind, a % 6)
    if kind == "tick":
        return Ev(kind, TICKS[a % len(TICKS)])
    return Ev(kind, a, b + 1)


def specs(on_timeout: st.SearchStrategy[str]) -> st.SearchStrategy[GenRMPoolSpec]:
    return st.builds(
        make_spec,
        replicas=st.integers(0, 4),
        propagation=st.integers(0, 3),
        quiet=st.integers(0, 2),
        timeout=st.sampled_from([8, 15]),
        on_timeout=on_timeout,
        verification=st.booleans(),
        startup=st.sampled_from([20, 40]),
    )


def events(kinds: tuple[str, ...]) -> st.SearchStrategy[Ev]:
    return st.builds(to_event, st.sampled_from(kinds), st.integers(0, 7), st.integers(0, 2))


def sequences(kinds: tuple[str, ...]) -> st.SearchStrategy[list[list[Ev]]]:
    return st.lists(st.lists(events(kinds), min_size=1, max_size=2), min_size=6, max_size=30)


def convergence_budget(world: World) -> int:
    """Steps within which a healthy world must converge: the longest create back-off, a slow
    start timing out, two drains running into their timeout, plus slack for a few steps; and
    for a rollout, one replacement (start, verify, drain) per replica."""
    spec = world.spec
    drain = spec.drain
    drain_s = drain.propagation_seconds + drain.quiet_seconds + drain.timeout_seconds
    replacements = max(spec.replicas, len(world.pods)) * (world.warmup + 4 * CALM_DT + drain_s)
    seconds = (BACKOFF_MAX_SECONDS + spec.engine.startup_timeout_seconds + 2 * drain_s + 60 + replacements)
    return math.ceil(seconds / CALM_DT)


def settle(world: World, label: str) -> int:
    """Heal the world, step until converged (within the budget), then check it stays quiet."""
    world.heal()
    budget = convergence_budget(world)
    for taken in range(1, budget + 1):
        world.heal()
        world.step(dt=CALM_DT)
        if world.converged():
            for _ in range(3):
                plan = world.step(dt=CALM_DT)
                if not world.converged() or plan.actions:
                    raise Violation(f"{label}: converged pool did not stay quiet: {plan.actions}")
            return taken
    op = world.status.operation
    raise Violation(
        f"{label}: no convergence to {world.spec.replicas} serving within {budget} steps: "
        f"serving={len(world.serving())} pods={sorted(world.pods)} op={op and (op.type, op.phase, op.message)} "
        f"history={[(h.type, h.outcome, h.reason) for h in world.status.history]}"
    )


def run(spec: GenRMPoolSpec, steps: list[list[Ev]], *, gpus: int = 8, nodes: dict[str, str] | None = None) -> World:
    world = World(spec=spec, keep_plans=True, nodes=dict(nodes or {}))
    settle(world, "initial scale-out")
    world.gpus = gpus
    for evs in steps:
        world.step(evs)
    settle(world, "after the disturbances")
    for outcome in sorted({f"{h.type} {h.outcome} {h.reason}" for h in world.status.history}):
        event(outcome)
    kinds = {type(a).__name__ for p in world.plans for a in p.actions}
    for kind in sorted(kinds):
        event(f"action {kind}")
    if world.forced_deletes:
        event("forced delete")
    world.plans.clear()
    return world


@budget(1400)
@given(spec=specs(st.sampled_from(["Fail", "Force"])), steps=sequences(KINDS), gpus=st.integers(1, 8))
def test_random_disturbances_never_lose_requests_and_the_pool_converges(
    spec: GenRMPoolSpec, steps: list[list[Ev]], gpus: int
) -> None:
    run(spec, steps, gpus=gpus)


GPU_NODES = {"gpu-a": "NVIDIA-H100-80GB-HBM3", "gpu-b": "NVIDIA-B200", "gpu-c": "NVIDIA-H100-80GB-HBM3"}
"""Nodes of two GPU products, one with two nodes: replicas answer as their product computes."""


@budget(300)
@given(spec=specs(st.sampled_from(["Fail", "Force"])), steps=sequences(KINDS), gpus=st.integers(1, 8))
def test_a_pool_on_two_gpu_products_ends_serving_from_one(
    spec: GenRMPoolSpec, steps: list[list[Ev]], gpus: int
) -> None:
    """With nodes of two GPU products, whatever happened, the healed pool serves from one product:
    new replicas are required onto the serving replicas' product, and a never-served replica on the
    other one is replaced before it could be verified or published."""
    world = run(spec, steps, gpus=gpus, nodes=GPU_NODES)
    assert len({p.product for p in world.serving()}) <= 1, [(p.name, p.product) for p in world.serving()]


DRAIN_KINDS = (
    "none", "none", "scale", "scale", "scale", "arrive", "arrive", "arrive", "arrive", "finish", "tick", "tick",
    "lose", "lag", "unreachable",
)


@budget(600)
@given(spec=specs(st.sampled_from(["Fail", "Force"])), steps=sequences(DRAIN_KINDS))
def test_busy_scale_ins_only_drop_requests_of_force_timed_out_victims(
    spec: GenRMPoolSpec, steps: list[list[Ev]]
) -> None:
    world = run(spec, steps)
    if spec.drain.on_timeout == "Fail":
        assert world.forced_deletes == 0
        assert all(h.forced_drains == 0 for h in world.status.history)


FAULT_KINDS = (
    "none", "scale", "crash", "fail", "slow", "gpus", "lose", "unwritten", "stale", "lag", "tick", "admin_delete",
    "sick",
)


@budget(400)
@given(spec=specs(st.just("Fail")), steps=sequences(FAULT_KINDS), gpus=st.integers(0, 6))
def test_failures_and_short_capacity_are_repaired_once_the_world_heals(
    spec: GenRMPoolSpec, steps: list[list[Ev]], gpus: int
) -> None:
    run(spec, steps, gpus=gpus)


ROLLOUT_KINDS = (
    "none", "template", "template", "template", "pause", "scale", "scale", "arrive", "arrive", "finish",
    "crash", "fail", "slow", "perturb", "gpus", "tick", "lose", "unwritten", "stale", "lag", "unreachable",
    "admin_delete", "sick",
)


def rollout_specs() -> st.SearchStrategy[GenRMPoolSpec]:
    return st.builds(
        make_spec,
        replicas=st.integers(1, 4),
        propagation=st.integers(0, 2),
        quiet=st.integers(0, 1),
        timeout=st.just(8),
        on_timeout=st.sampled_from(["Fail", "Force"]),
        verification=st.booleans(),
        startup=st.just(20),
        surge=st.integers(0, 2),
        unavailable=st.integers(0, 2),
        strategy=st.sampled_from(["RollingUpdate", "RollingUpdate", "RollingUpdate", "OnDelete"]),
    ).filter(lambda s: s.update_strategy.rolling_update.max_surge + s.update_strategy.rolling_update.max_unavailable)


@budget(600)
@given(spec=rollout_specs(), steps=sequences(ROLLOUT_KINDS), gpus=st.integers(1, 8))
def test_rollouts_mixed_with_scaling_and_faults_keep_every_promise(
    spec: GenRMPoolSpec, steps: list[list[Ev]], gpus: int
) -> None:
    """Template changes, pauses, scale changes and faults in any order: the world's checks hold
    (published only when ready and verified, no request lost, at most replicas + maxSurge pods
    during a rollout, a rollout never takes the serving count below replicas - maxUnavailable)
    and the healed pool ends with every replica on the current template (OnDelete: untouched)."""
    world = run(spec, steps, gpus=gpus)
    if spec.update_strategy.type == "RollingUpdate":
        assert {p.revision for p in world.pods.values()} <= {world.revision}
        assert world.status.updated_replicas == world.spec.replicas == world.status.replicas


RESCUE_KINDS = (
    "none", "scale", "scale", "scale", "sick", "sick", "crash", "crash", "fail", "arrive", "arrive", "finish",
    "tick", "tick", "lose", "unwritten", "lag", "unreachable", "admin_delete",
)


@budget(500)
@given(spec=specs(st.sampled_from(["Fail", "Force"])), steps=sequences(RESCUE_KINDS), first=st.integers(1, 3))
def test_a_scale_in_never_empties_the_service_while_a_victim_could_serve(
    spec: GenRMPoolSpec, steps: list[list[Ev]], first: int
) -> None:
    """Scale-ins interleaved with the other replicas crashing, failing, going NotReady (an unhealthy
    engine, no restart) or being deleted by hand: the world's `check_last_out` (a healthy victim is
    unpublished only while another replica is a ready endpoint and serves) and `check_rescue` (the
    Service is not left without a published Ready replica for more than one undisturbed step while
    a healthy replica that served is kept out) hold at every step, and the pool converges. The pool
    starts one scale-in at once (to ``first`` replicas, from one more), so most sequences disturb one
    while it runs."""
    spec = spec.model_copy(update={"replicas": first + 1})
    run(spec, [[Ev("scale", first)], *steps], gpus=8)

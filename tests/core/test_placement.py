"""GPU-generation-aware placement: the pin, the node affinity it becomes, and a reconcile around it.

Aspects under test:
- the pin (`placement.choose`): the GPU product of the oldest serving replica's node (what new
  replicas are verified against), or while none serves the oldest scheduled replica's, for a
  deterministic pool and for a non-deterministic one verified with greedy probes; none for a
  non-deterministic pool without verification, for nodes without the label, or when the user's
  selector chooses;
- the pod builder merges ``nvidia.com/gpu.product In [product]`` into every one of the user's
  required node selector terms (AND), never into a term or nodeSelector that already chooses the
  product, never into the spec's own objects, and never into the template revision; a property
  checks that the merged affinity admits exactly the nodes the user's admits with that product;
- a reconcile step pins its creates, records the pin in ``status.placement``, and replaces a
  replica that never served and landed on another product before verifying it;
- a verification names both replicas' nodes and GPU products, and a mismatch reaches the
  condition and the events with them;
- in the simulated world with two GPU products: a pool grown from nothing ends on one product,
  and new replicas of a serving pool land only on its product.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from genrm_operator.api.pool import GenRMPoolSpec, GenRMPoolStatus
from genrm_operator.api.spec import TemplateSpec
from genrm_operator.api.status import Placement
from genrm_operator.core import children, placement
from genrm_operator.core.classify import Replica, Role
from genrm_operator.core.conditions import find
from genrm_operator.core.model import CreatePod, DeletePod, Observed, PodView, SidecarView, Verify
from genrm_operator.core.placement import GPU_PRODUCT_LABEL
from genrm_operator.core.reconcile import reconcile
from hypothesis import given, settings
from hypothesis import strategies as st

from .world import POOL, START, Ev, World

NOW = START + 1000.0
H100, B200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-B200"
NODES = {"gpu-a": H100, "gpu-b": B200}
PIN = Placement(gpu_product=H100, replica="judge-0", node="gpu-a")


def make_spec(replicas: int = 2, **wire: Any) -> GenRMPoolSpec:
    return GenRMPoolSpec.model_validate({"replicas": replicas, "model": {"path": "org/judge-7b"}, **wire})


def replica(name: str, role: Role, node: str = "", created_at: float = START, **changes: Any) -> Replica:
    return Replica(pod=PodView(name=name, uid=f"uid-{name}", created_at=created_at, node=node, **changes), role=role,
                   sidecar=None)


def pod_affinity(spec: GenRMPoolSpec, product: str = H100) -> dict[str, Any]:
    return children.pod_manifest(POOL, "uid", "ml", spec, "judge-3", 3, product)["spec"].get("affinity", {})


def terms(affinity: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])


REQUIREMENT = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [H100]}


# ----- the pin ----------------------------------------------------------------------------------


def test_the_pin_is_the_product_of_the_oldest_serving_replicas_node() -> None:
    replicas = [replica("judge-1", Role.SERVING, "gpu-b", START + 5), replica("judge-0", Role.SERVING, "gpu-a"),
                replica("judge-2", Role.STARTING, "gpu-b", START - 5)]
    assert placement.choose(make_spec(), replicas, NODES) == PIN


def test_without_a_serving_replica_the_oldest_scheduled_one_on_a_labelled_node_sets_the_pin() -> None:
    replicas = [replica("judge-0", Role.STARTING), replica("judge-1", Role.STARTING, "plain", START + 1),
                replica("judge-2", Role.STARTING, "gpu-b", START + 2),
                replica("judge-3", Role.STARTING, "gpu-a", START + 3)]
    assert placement.choose(make_spec(), replicas, NODES) == Placement(gpu_product=B200, replica="judge-2",
                                                                       node="gpu-b")


def test_a_greedy_verified_non_deterministic_pool_is_pinned_as_a_deterministic_one_is() -> None:
    """Its greedy answers are compared, and another GPU generation's kernels give other ones."""
    replicas = [replica("judge-0", Role.SERVING, "gpu-a"), replica("judge-1", Role.STARTING, "gpu-b", START + 1)]
    greedy = make_spec(engine={"deterministic": False}, verification={"sampling": "Greedy"})
    assert placement.choose(greedy, replicas, NODES) == placement.choose(make_spec(), replicas, NODES) == PIN
    assert placement.compares_answers(greedy) and placement.compares_answers(make_spec())
    unverified = make_spec(engine={"deterministic": False}, verification={"enabled": False, "sampling": "Greedy"})
    assert not placement.compares_answers(unverified)
    assert placement.choose(unverified, replicas, NODES) is None


def test_no_pin_without_a_label_for_a_non_deterministic_pool_or_when_the_user_chooses_the_product() -> None:
    serving = [replica("judge-0", Role.SERVING, "gpu-a")]
    assert placement.choose(make_spec(), serving, {}) is None, "the local cluster's nodes carry no label"
    assert placement.choose(make_spec(), [replica("judge-0", Role.SERVING, "plain"),
                                          replica("judge-1", Role.SERVING, "gpu-a", START + 1)], NODES) is None
    loose = make_spec(engine={"deterministic": False}, verification={"enabled": False})
    assert placement.choose(loose, serving, NODES) is None
    chosen = make_spec(template={"nodeSelector": {GPU_PRODUCT_LABEL: B200}})
    assert placement.choose(chosen, serving, NODES) is None
    assert placement.choose(make_spec(), [], NODES) is None


def test_the_user_chooses_the_product_with_a_node_selector_or_in_every_required_term() -> None:
    def pins(**template: Any) -> bool:
        return placement.user_pins_product(TemplateSpec.model_validate(template))
    product_term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "NotIn", "values": [B200]}]}
    zone_term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    assert pins(nodeSelector={GPU_PRODUCT_LABEL: H100})
    assert pins(affinity=required([product_term]))
    assert not pins(affinity=required([product_term, zone_term])), "one term leaves the product open"
    assert not pins(nodeSelector={"zone": "a"}) and not pins()


def test_only_a_never_served_replica_on_another_labelled_product_is_misplaced() -> None:
    assert placement.misplaced(replica("judge-1", Role.STARTING, "gpu-b"), PIN, NODES)
    assert not placement.misplaced(replica("judge-1", Role.STARTING, "gpu-a"), PIN, NODES)
    assert not placement.misplaced(replica("judge-1", Role.STARTING, "plain"), PIN, NODES), "no label: no evidence"
    assert not placement.misplaced(replica("judge-1", Role.STARTING), PIN, NODES), "not scheduled yet"
    assert not placement.misplaced(replica("judge-1", Role.SERVING, "gpu-b"), PIN, NODES)
    assert not placement.misplaced(replica("judge-1", Role.STARTING, "gpu-b", ever_published=True), PIN, NODES)


# ----- the pod builder --------------------------------------------------------------------------


def required(node_terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": node_terms}}}


def test_without_user_affinity_the_pod_requires_the_pinned_product() -> None:
    assert pod_affinity(make_spec()) == required([{"matchExpressions": [REQUIREMENT]}])
    assert "affinity" not in children.pod_manifest(POOL, "uid", "ml", make_spec(), "judge-3", 3)["spec"], "no pin"


def test_a_user_node_selector_stays_and_is_anded_with_the_requirement() -> None:
    spec = make_spec(template={"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}})
    manifest = children.pod_manifest(POOL, "uid", "ml", spec, "judge-3", 3, H100)["spec"]
    assert manifest["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert manifest["affinity"] == required([{"matchExpressions": [REQUIREMENT]}])


def test_the_requirement_is_merged_into_every_one_of_several_user_terms() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pool = {"key": "pool", "operator": "Exists"}
    host = {"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [zone]}}]
    affinity = required([{"matchExpressions": [zone]}, {"matchExpressions": [pool], "matchFields": [host]}])
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": []}
    spec = make_spec(template={"affinity": affinity})
    before = copy.deepcopy(spec.template.affinity)
    merged = pod_affinity(spec)
    assert terms(merged) == [{"matchExpressions": [zone, REQUIREMENT]},
                             {"matchExpressions": [pool, REQUIREMENT], "matchFields": [host]}]
    assert merged["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert merged["podAntiAffinity"] == affinity["podAntiAffinity"]
    assert spec.template.affinity == before, "the spec's own objects are never changed"


def test_a_user_who_already_chooses_the_product_is_not_contradicted() -> None:
    mine = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [B200]}
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    spec = make_spec(template={"affinity": required([{"matchExpressions": [mine]}, {"matchExpressions": [zone]}])})
    assert terms(pod_affinity(spec)) == [{"matchExpressions": [mine]}, {"matchExpressions": [zone, REQUIREMENT]}]
    chosen = make_spec(template={"nodeSelector": {GPU_PRODUCT_LABEL: B200}, "affinity": required([
        {"matchExpressions": [zone]}])})
    assert pod_affinity(chosen) == chosen.template.affinity


def test_the_pin_is_no_part_of_the_pod_template_revision() -> None:
    spec = make_spec()
    pinned = children.pod_manifest(POOL, "uid", "ml", spec, "judge-3", 3, H100)
    plain = children.pod_manifest(POOL, "uid", "ml", spec, "judge-3", 3)
    assert pinned["metadata"]["labels"] == plain["metadata"]["labels"], "a new pin makes no replica outdated"


LABELS = ("zone", GPU_PRODUCT_LABEL)
VALUES = ("a", "b", H100, B200)
expressions = st.fixed_dictionaries({
    "key": st.sampled_from(LABELS), "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    "values": st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True),
})
node_labels = st.dictionaries(st.sampled_from(LABELS), st.sampled_from(VALUES))


def admits(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """The scheduler's reading of one node selector term (matchExpressions only)."""
    def holds(e: Mapping[str, Any]) -> bool:
        present, value = e["key"] in labels, labels.get(e["key"])
        return {"In": present and value in e["values"], "NotIn": not present or value not in e["values"],
                "Exists": present, "DoesNotExist": not present}[e["operator"]]
    return all(holds(e) for e in term.get("matchExpressions") or [])


def schedulable(affinity: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    node_terms = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    return node_terms is None or any(admits(t, labels) for t in node_terms["nodeSelectorTerms"])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(node_terms=st.lists(st.fixed_dictionaries({"matchExpressions": st.lists(expressions, max_size=3)}),
                           max_size=3),
       labels=node_labels, product=st.sampled_from([H100, B200]))
def test_the_merged_affinity_admits_the_users_nodes_of_the_pinned_product(
    node_terms: list[dict[str, Any]], labels: dict[str, str], product: str
) -> None:
    user = required(node_terms) if node_terms else {}
    merged = placement.require_product({}, user, product)
    users_choice = [t for t in node_terms if placement.constrains_product(t)]
    if schedulable(merged, labels):
        assert schedulable(user, labels), "the operator never widens the user's selector"
    if not users_choice:
        assert schedulable(merged, labels) == (schedulable(user, labels) and labels.get(GPU_PRODUCT_LABEL) == product)
    else:
        assert all(t in terms(merged) for t in users_choice), "a term choosing the product is kept as it is"


# ----- a reconcile step -------------------------------------------------------------------------


def serving(name: str, node: str, created_at: float = START) -> PodView:
    return PodView(name=name, uid=f"uid-{name}", created_at=created_at, phase="Running", ready=True, published=True,
                   ever_published=True, verification="passed", node=node,
                   revision=children.template_revision(POOL, make_spec()))


def observe(spec: GenRMPoolSpec, pods: list[PodView], status: GenRMPoolStatus | None = None,
            products: Mapping[str, str] = NODES) -> Observed:
    sidecars = {p.name: SidecarView(state="Serving", engine_healthy=True) for p in pods}  # type: ignore[arg-type]
    return Observed(name=POOL, generation=1, spec=spec, status=status or GenRMPoolStatus(), pods=tuple(pods),
                    sidecars=sidecars, now=NOW, gpu_products=products)


def test_creates_are_pinned_and_the_pin_is_in_the_status() -> None:
    plan = reconcile(observe(make_spec(3), [serving("judge-0", "gpu-a")]))
    assert [a for a in plan.actions if isinstance(a, CreatePod)] == [CreatePod("judge-1", 1, H100),
                                                                      CreatePod("judge-2", 2, H100)]
    assert plan.status.placement == PIN
    assert plan.status.to_wire()["placement"] == {"gpuProduct": H100, "replica": "judge-0", "node": "gpu-a"}
    unlabelled = reconcile(observe(make_spec(2), [serving("judge-0", "node-1")], products={}))
    assert [a for a in unlabelled.actions if isinstance(a, CreatePod)] == [CreatePod("judge-1", 1, "")]
    assert unlabelled.status.placement is None


def test_a_never_served_replica_on_another_product_is_replaced_before_it_is_verified() -> None:
    first = reconcile(observe(make_spec(2), [serving("judge-0", "gpu-a")]))
    stray = PodView("judge-1", "uid-judge-1", NOW - 5, phase="Running", ready=True, node="gpu-b")
    plan = reconcile(observe(make_spec(2), [serving("judge-0", "gpu-a"), stray], first.status))
    assert DeletePod("judge-1", "uid-judge-1", 2, "") in plan.actions
    assert not [a for a in plan.actions if isinstance(a, Verify)]
    event = next(e for e in plan.events if e.reason == "ReplicaMisplaced")
    assert event.message == (f"Replacing judge-1 on node gpu-b (GPU {B200}): new replicas go to GPU {H100}, "
                             "the product of judge-0's node")


def test_a_misplaced_replica_deleted_while_the_index_lags_is_never_created_again() -> None:
    """Retiring a replica that landed on another product records nothing new; the step after, the
    index lags and still shows it. Its name must not come back once it is gone (the world checks
    every create against the names the core deleted): the create having been seen is part of the
    record. A review's random sweep found this sequence."""
    world = World(spec=make_spec(3), nodes=dict(NODES))
    for events, dt in (((), 3.0), ((), 0.2), ((Ev("lag"),), 0.2), ((), 1.0), ((), 1.0), ((), 3.0)):
        world.step(events, dt=dt)  # raises on a create of a deleted name


def test_a_verification_names_both_replicas_nodes_and_gpu_products() -> None:
    first = reconcile(observe(make_spec(2), [serving("judge-0", "gpu-a")]))
    warm = PodView("judge-1", "uid-judge-1", NOW - 5, phase="Running", ready=True, node="gpu-b")
    plan = reconcile(observe(make_spec(2, template={"nodeSelector": {GPU_PRODUCT_LABEL: B200}}),
                             [serving("judge-0", "gpu-a"), warm], first.status))
    [verify] = [a for a in plan.actions if isinstance(a, Verify)]
    assert verify.context == (f"judge-1 on node gpu-b (GPU {B200}) against judge-0 on node gpu-a (GPU {H100}); "
                              "the GPU products differ, and SGLang's kernels differ across GPU generations")


def test_a_mismatch_names_both_gpu_products_in_the_condition_and_the_events() -> None:
    spec = make_spec(2, template={"nodeSelector": {GPU_PRODUCT_LABEL: B200}})  # the user placed it there
    first = reconcile(observe(spec, [serving("judge-0", "gpu-a")]))
    message = (f"judge-1 on node gpu-b (GPU {B200}) against judge-0 on node gpu-a (GPU {H100}): probe 0 differs: "
               "new='8' reference='7'")
    failed = PodView("judge-1", "uid-judge-1", NOW - 5, phase="Running", ready=True, node="gpu-b",
                     verification="failed", verification_message=message)
    plan = reconcile(observe(spec, [serving("judge-0", "gpu-a"), failed], first.status))
    assert DeletePod("judge-1", "uid-judge-1", 2, "") in plan.actions, "replaced, not kept on its GPU"
    degraded = find(plan.status.conditions, "Degraded")
    assert degraded is not None and (degraded.status, degraded.reason) == ("True", "ReplicaInconsistent")
    assert degraded.message == f"judge-1: ReplicaInconsistent: {message}"
    assert [e.message for e in plan.events if e.reason == "ReplicaFailed"] == [
        f"Replacing judge-1: ReplicaInconsistent: {message}"]
    added = plan.status.operation.added_pods if plan.status.operation else []
    assert [(a.failure, a.failure_message) for a in added if a.name == "judge-1"] == [("ReplicaInconsistent",
                                                                                        message)]


# ----- the simulated world ----------------------------------------------------------------------


def products_serving(world: World) -> set[str]:
    return {p.product for p in world.serving()}


def test_a_pool_grown_from_nothing_on_two_products_ends_on_one() -> None:
    world = World(spec=make_spec(4), nodes=dict(NODES), keep_plans=True)
    for _ in range(200):
        world.step()
        if world.converged():
            break
    assert world.converged() and len(products_serving(world)) == 1, [(p.name, p.product) for p in world.serving()]
    assert world.status.placement is not None and {world.status.placement.gpu_product} == products_serving(world)
    assert any(e.reason == "ReplicaMisplaced" for p in world.plans for e in p.events)
    assert not [h for h in world.status.history if h.outcome != "Succeeded"], "retiring a misplaced one is no failure"


def test_new_replicas_of_a_serving_pool_land_only_on_its_product() -> None:
    world = World(spec=make_spec(1), nodes=dict(NODES), keep_plans=True)
    for _ in range(100):
        world.step()
        if world.converged():
            break
    [product] = products_serving(world)
    world.plans.clear()
    world.step([Ev("scale", 5)])
    for _ in range(200):
        world.step()
        if world.converged():
            break
    assert world.converged() and products_serving(world) == {product}
    creates = [a for p in world.plans for a in p.actions if isinstance(a, CreatePod)]
    assert creates and {a.gpu_product for a in creates} == {product}
    assert not any(e.reason in ("ReplicaMisplaced", "ReplicaFailed") for p in world.plans for e in p.events)

"""Scale from zero in the core (``genrm_operator.core.activation``): when the pool's Service also
points at the activator, and the order going to zero.

Aspects: a ``scaleToZero`` pool with an activator gets the activator's EndpointSlice while it is
meant to be at zero or the controller's slices list no ready endpoint, and loses it once one does;
without scaleToZero or without an activator nothing changes; going to zero, the last replica is not
unpublished before the activator's slice is in place (a request arriving meanwhile must find an
endpoint); the route tells the activator the Service's Host values and the ready endpoints.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from genrm_operator.core import activation
from genrm_operator.core.childrenplan import CreateChild, DeleteChild
from genrm_operator.core.model import ActivatorView, Observed, ObservedChildren, SetPublished
from genrm_operator.core.reconcile import plan_pool_children, reconcile

from .test_reconcile import POOL, make_spec, observe, scale_in, serving_pod

ZERO = {"mode": "Auto", "minReplicas": 1, "maxReplicas": 4,
        "metrics": [{"type": "InFlight", "target": {"averageValue": "2"}}], "scaleToZero": {"idleSeconds": 60}}
ACTIVATOR = ActivatorView(("10.244.0.7", "10.244.0.8"), 8000)


def controller_slice(*ready: str) -> dict[str, Any]:
    return {"kind": "EndpointSlice", "metadata": {"name": f"{POOL}-x7k2p", "labels": {
                activation.SERVICE_NAME_LABEL: POOL, activation.MANAGED_BY_LABEL: activation.CONTROLLER}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in ready]}


def with_children(obs: Observed, *slices: dict[str, Any], activator: ActivatorView | None = ACTIVATOR,
                  objects: dict[str, Any] | None = None) -> Observed:
    children = ObservedChildren(pool_uid="pool-uid", namespace="rl", token="t", objects=objects or {},
                                slices=tuple(slices), activator=activator)
    return replace(obs, children=children)


def slice_actions(obs: Observed) -> list[Any]:
    return [a for a in plan_pool_children(obs) if getattr(a, "kind", None) == "EndpointSlice"
            or (isinstance(a, CreateChild) and a.manifest["kind"] == "EndpointSlice")]


def test_the_activator_slice_is_wanted_only_while_no_replica_is_ready_or_the_pool_goes_to_zero() -> None:
    at_zero = with_children(observe(make_spec(0, autoscaling=ZERO), []))
    [create] = slice_actions(at_zero)
    assert isinstance(create, CreateChild)
    manifest = create.manifest
    assert manifest["metadata"]["name"] == f"{POOL}-activator"
    assert manifest["metadata"]["labels"][activation.SERVICE_NAME_LABEL] == POOL
    assert manifest["metadata"]["labels"][activation.MANAGED_BY_LABEL] == activation.MANAGED_BY
    assert [e["addresses"] for e in manifest["endpoints"]] == [["10.244.0.7"], ["10.244.0.8"]]
    assert manifest["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    serving = with_children(observe(make_spec(1, autoscaling=ZERO), [serving_pod("judge-0")]),
                            controller_slice("10.244.1.2"), objects={"EndpointSlice": {
                                **manifest, "metadata": {**manifest["metadata"], "uid": "s-1"}}})
    [delete] = slice_actions(serving)
    assert isinstance(delete, DeleteChild) and delete.uid == "s-1"
    waking = with_children(observe(make_spec(1, autoscaling=ZERO), [serving_pod("judge-0")]), controller_slice())
    assert [type(a) for a in slice_actions(waking)] == [CreateChild], "no ready endpoint yet: keep holding"
    going = with_children(observe(make_spec(0, autoscaling=ZERO), [serving_pod("judge-0")]),
                          controller_slice("10.244.1.2"))
    assert [type(a) for a in slice_actions(going)] == [CreateChild], "told to go to zero: before the unpublish"


def test_without_scale_to_zero_or_an_activator_the_service_is_left_alone() -> None:
    assert slice_actions(with_children(observe(make_spec(0), []))) == []
    assert slice_actions(with_children(observe(make_spec(0, autoscaling=ZERO), []), activator=None)) == []


def test_the_last_replica_is_unpublished_only_once_the_activator_slice_is_in_place() -> None:
    victim = {"name": "judge-0", "uid": "uid-judge-0"}
    spec = make_spec(0, autoscaling=ZERO)
    status = scale_in([victim], to=0, phase="Unpublishing")
    obs = with_children(observe(spec, [serving_pod("judge-0")], None, status), controller_slice("10.244.1.2"))
    waiting = reconcile(obs)
    assert SetPublished("judge-0", "uid-judge-0", False) not in waiting.actions
    placed = {"EndpointSlice": activation.slice_manifest(POOL, "pool-uid", "rl", ACTIVATOR, {})}
    ready = reconcile(with_children(observe(spec, [serving_pod("judge-0")], None, status),
                                    controller_slice("10.244.1.2"), objects=placed))
    assert SetPublished("judge-0", "uid-judge-0", False) in ready.actions


def test_the_route_names_the_services_hosts_and_its_ready_endpoints() -> None:
    service = {"kind": "Service", "spec": {"clusterIP": "10.96.0.12"}}
    obs = with_children(observe(make_spec(1, autoscaling=ZERO), [serving_pod("judge-0")]),
                        controller_slice("10.244.1.2", "10.244.1.3"), objects={"Service": service})
    route = activation.pool_route(obs)
    assert route is not None and route.targets == ("10.244.1.2:8000", "10.244.1.3:8000")
    wanted = {"10.96.0.12", "10.96.0.12:8000", POOL, f"{POOL}:8000", f"{POOL}.rl", f"{POOL}.rl.svc:8000"}
    assert wanted <= set(route.hosts)
    assert activation.pool_route(with_children(observe(make_spec(1), []))) is None

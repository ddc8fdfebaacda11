"""Tests of the per-concern children plan (desired against observed).

Aspects under test:
- missing children are created, in order Secret, Service, PodDisruptionBudget; none without a PDB
  when it is disabled, and a disabled one that exists is deleted, bound to its UID;
- a child as desired needs nothing, even with what the API server adds (clusterIP, nodePort) and
  labels or annotations others added;
- a changed spec.service (port, type) or spec.disruptionBudget.maxUnavailable becomes a merge patch
  of exactly the owned fields; ports are replaced whole, a selector key added by hand is removed,
  a removed pool label is restored;
- an object of the child's name that the pool does not control is reported, never patched;
- observed objects are picked by kind and the child's name; the token is read from the Secret;
- a child error makes Degraded=True with the API server's message.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from genrm_operator.api.pool import GenRMPoolSpec, GenRMPoolStatus
from genrm_operator.core.childrenplan import (
    CHILD_FAILED,
    CreateChild,
    DeleteChild,
    ForeignChild,
    PatchChild,
    desired_children,
    observed_token,
    plan_children,
    select_observed,
)
from genrm_operator.core.conditions import find
from genrm_operator.core.model import Observed
from genrm_operator.core.names import POOL_LABEL
from genrm_operator.core.reconcile import reconcile

UID = "pool-uid"


def spec(**wire: Any) -> GenRMPoolSpec:
    return GenRMPoolSpec.model_validate({"replicas": 1, "model": {"path": "org/judge"}, **wire})


def desired(**wire: Any) -> dict[str, dict[str, Any]]:
    return desired_children("judge", UID, "ml", spec(**wire), "tok")


def as_observed(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for a created child: defaults and allocations added."""
    obj = copy.deepcopy(manifest)
    obj["metadata"].update(uid=f"{obj['kind']}-uid", resourceVersion="7",
                           annotations={"someone/else": "x"})
    obj["metadata"]["labels"]["team"] = "judges"
    if obj["kind"] == "Service":
        obj["spec"].update(clusterIP="10.96.0.10", sessionAffinity="None")
        for port in obj["spec"]["ports"]:
            port["nodePort"] = 31000
    if obj["kind"] == "Secret":
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()}
    return obj


def observed(**wire: Any) -> dict[str, dict[str, Any]]:
    return {kind: as_observed(m) for kind, m in desired(**wire).items()}


def test_missing_children_are_created_secret_first() -> None:
    actions = plan_children(desired(), {}, UID)
    assert [a.manifest["kind"] for a in actions if isinstance(a, CreateChild)] == [
        "Secret", "Service", "PodDisruptionBudget"]
    assert len(actions) == 3


def test_children_as_desired_need_nothing_despite_server_and_foreign_additions() -> None:
    assert plan_children(desired(), observed(), UID) == ()


def test_a_deleted_service_is_recreated_alone() -> None:
    have = observed()
    del have["Service"]
    assert plan_children(desired(), have, UID) == (CreateChild(desired()["Service"]),)


def test_a_changed_service_port_is_a_merge_patch_replacing_the_ports() -> None:
    actions = plan_children(desired(service={"port": 9000}), observed(), UID)
    assert actions == (PatchChild("Service", "judge", {"spec": {"ports": [
        {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}]}}),)


def test_a_changed_service_type_patches_only_the_type() -> None:
    actions = plan_children(desired(service={"type": "NodePort"}), observed(), UID)
    assert actions == (PatchChild("Service", "judge", {"spec": {"type": "NodePort"}}),)


def test_a_selector_key_added_by_hand_is_removed_and_a_removed_pool_label_restored() -> None:
    have = observed()
    have["Service"]["spec"]["selector"]["extra"] = "1"
    del have["Service"]["metadata"]["labels"][POOL_LABEL]
    [patch] = plan_children(desired(), have, UID)
    assert patch == PatchChild("Service", "judge", {
        "metadata": {"labels": {POOL_LABEL: "judge"}},
        "spec": {"selector": {"extra": None, POOL_LABEL: "judge", "genrm.io/published": "true"}},
    })


def test_a_changed_disruption_budget_is_patched() -> None:
    actions = plan_children(desired(disruptionBudget={"maxUnavailable": 3}), observed(), UID)
    assert actions == (PatchChild("PodDisruptionBudget", "judge", {"spec": {"maxUnavailable": 3}}),)


def test_a_disabled_budget_is_deleted_bound_to_its_uid_and_not_recreated() -> None:
    wanted = desired(disruptionBudget={"enabled": False})
    assert "PodDisruptionBudget" not in wanted
    assert plan_children(wanted, observed(), UID) == (
        DeleteChild("PodDisruptionBudget", "judge", "PodDisruptionBudget-uid"),)
    have = observed()
    del have["PodDisruptionBudget"]
    assert plan_children(wanted, have, UID) == ()


def test_an_object_the_pool_does_not_control_is_reported_not_patched() -> None:
    have = observed(service={"port": 9000})
    have["Service"]["metadata"]["ownerReferences"] = []
    assert plan_children(desired(), have, UID) == (ForeignChild("Service", "judge"),)
    assert "not controlled by this pool" in ForeignChild("Service", "judge").message


def test_observed_children_are_picked_by_kind_and_name() -> None:
    mine = as_observed(desired()["Service"])
    other = {**mine, "metadata": {**mine["metadata"], "name": "judge-extra"}}
    secret = as_observed(desired()["Secret"])
    assert select_observed("judge", [other, mine, secret]) == {"Service": mine, "Secret": secret}
    assert observed_token(secret) == "tok"
    assert observed_token({"data": {"token": "%%%"}}) is None
    assert observed_token(None) is None


def test_a_child_error_makes_the_pool_degraded_with_the_api_servers_message() -> None:
    message = 'Pod judge-0: Pod "judge-0" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "cache"'
    plan = reconcile(Observed(name="judge", generation=1, spec=spec(), status=GenRMPoolStatus(), pods=(),
                              child_errors=(message,), now=100.0))
    degraded = find(plan.status.conditions, "Degraded")
    assert degraded is not None and degraded.status == "True"
    assert degraded.reason == CHILD_FAILED and degraded.message == message

"""Tests of ``genrm_operator.shell.autoscaler`` inside a real ``PoolReconciler`` step (fake API server).

Aspects under test: a due decision goes into the same status PUT as the core's status
(``status.autoscaler`` with its decision record, HPA's three conditions next to the core's),
and only then is ``spec.replicas`` written through the scale subresource, with a
SuccessfulRescale Event and the ``genrm_autoscaler_*`` series; between intervals the
conditions are carried over untouched (no status churn); Advisory records without writing;
an external write of ``spec.replicas`` is adopted, not fought (AutoscalerOverridden=True,
a Warning Event, no write while the stabilization window protects it); a lost own write is
repeated, not mistaken for an external one; mode Off drops the autoscaler's conditions;
``forget_pool`` removes the autoscaler series.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
from genrm_contract.sidecar import DrainState, EngineReport, StateDocument
from genrm_operator.api.autoscaling import AutoscalerStatus, AutoscalingSpec, DecisionRecord
from genrm_operator.api.pool import GenRMPoolSpec
from genrm_operator.api.status import ConditionType
from genrm_operator.autoscaling.override import external_write
from genrm_operator.core.children import template_revision
from genrm_operator.core.model import Event
from genrm_operator.shell import metrics
from genrm_operator.shell.autoscaler import PoolAutoscaler
from genrm_operator.shell.kube import Conflict
from genrm_operator.shell.reconciler import PoolReconciler
from prometheus_client import REGISTRY

NS, POOL = "ml", "judge"
OVERRIDDEN = ConditionType.AUTOSCALER_OVERRIDDEN


def exposition(inflight: float) -> str:
    return f"# TYPE genrm_gateway_inflight_requests gauge\ngenrm_gateway_inflight_requests {inflight}\n"


class FakeKube:
    """The API calls a reconcile step makes, against one pool object held in memory."""

    def __init__(self, pool: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.pool, self.pods = pool, pods
        self.scaled: list[int] = []
        self.status_writes = 0
        self.version = 1

    def bump(self) -> str:
        self.version += 1
        self.pool["metadata"]["resourceVersion"] = str(self.version)
        return str(self.version)

    async def get_pool(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.pool)

    async def write_status(self, pool: dict[str, Any], status: dict[str, Any], gating: bool = False) -> dict[str, Any]:
        self.status_writes += 1
        self.pool["status"] = status
        self.bump()
        return copy.deepcopy(self.pool)

    async def scale(self, namespace: str, name: str, replicas: int, resource_version: str) -> None:
        """Optimistic like the API server: a stale resourceVersion is a Conflict."""
        if resource_version != str(self.version):
            raise Conflict(name)
        self.scaled.append(replicas)
        self.pool["spec"]["replicas"] = replicas
        self.bump()

    async def create(self, manifest: dict[str, Any]) -> bool:
        return True

    async def delete_pod(self, *args: Any) -> None:
        pass

    async def patch_pod_meta(self, *args: Any) -> None:
        pass


class FakeSidecars:
    """Every replica serves, idle and healthy, for good: a long poll waits out its time."""

    async def state(self, ep: Any, version: int | None = None, wait_seconds: float = 0.0) -> StateDocument:
        if version is not None:
            await asyncio.sleep(wait_seconds)
        return StateDocument(
            state=DrainState.SERVING, drain_id=None, inflight=0, admitted_total=0, completed_total=0,
            refused_total=0, engine=EngineReport(up=True, healthy=True, running_requests=0, queued_requests=0,
                                                 token_usage=0.0), idle_since_seconds=1.0, boot_id="b", version=1)


def serving_pod(ordinal: int) -> dict[str, Any]:
    """A published replica made from the pool's current pod template (autoscaling does not shape pods)."""
    revision = template_revision(POOL, GenRMPoolSpec.model_validate(pool(1)["spec"]))
    return {
        "metadata": {"name": f"{POOL}-{ordinal}", "uid": f"uid-{ordinal}", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"genrm.io/pool": POOL, "genrm.io/published": "true", "genrm.io/revision": revision},
                     "annotations": {"genrm.io/ever-published": "true", "genrm.io/verification": "passed"}},
        "spec": {"containers": []},
        "status": {"phase": "Running", "podIP": f"10.0.0.{ordinal + 1}",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def service_slices(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The EndpointSlice controller's slice of the pool's Service, as the operator's index holds it: the
    published pods, ready when their Ready condition is."""
    published = [p for p in pods if p["metadata"]["labels"].get("genrm.io/published") == "true"]
    return [{
        "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{POOL}-x7k2p", "labels": {
            "genrm.io/pool": POOL, "kubernetes.io/service-name": POOL,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": [p["status"]["podIP"]], "targetRef": {"kind": "Pod", "name": p["metadata"]["name"]},
                       "conditions": {"ready": any(c["type"] == "Ready" and c["status"] == "True"
                                                   for c in p["status"].get("conditions") or [])}}
                      for p in published],
    }]


def pool(replicas: int, mode: str = "Auto", **scaling: Any) -> dict[str, Any]:
    autoscaling = {"mode": mode, "minReplicas": 1, "maxReplicas": 6, "intervalSeconds": 5,
                   "metrics": [{"type": "InFlight", "target": {"averageValue": "2"}}], **scaling}
    return {"apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool",
            "metadata": {"name": POOL, "namespace": NS, "uid": "pool-uid", "generation": 1, "resourceVersion": "1"},
            "spec": {"replicas": replicas, "model": {"path": "sim/judge"}, "engine": {"image": "sim"},
                     "autoscaling": autoscaling}}


class Harness:
    """A reconciler over a fake API server whose replicas each report ``inflight`` requests."""

    def __init__(self, manifest: dict[str, Any], replicas: int, inflight: float) -> None:
        self.inflight = inflight
        self.kube = FakeKube(manifest, [serving_pod(i) for i in range(replicas)])
        self.events: list[Event] = []
        http = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda request: httpx.Response(200, text=exposition(self.inflight))))
        self.reconciler = PoolReconciler(self.kube, FakeSidecars(), self.post, NS, POOL,  # type: ignore[arg-type]
                                         lambda: copy.deepcopy(self.kube.pods),
                                         lambda: service_slices(self.kube.pods),
                                         lambda: copy.deepcopy(self.kube.pool))
        self.reconciler.autoscaler = PoolAutoscaler(self.kube, NS, POOL, http)  # type: ignore[arg-type]

    async def post(self, pool: dict[str, Any], event: Event) -> None:
        self.events.append(event)

    async def step(self) -> None:
        await self.reconciler.step()

    def due(self) -> None:
        """Make the next step a decision step (as if intervalSeconds had passed)."""
        self.reconciler.autoscaler._last_decision -= 3600

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.kube.pool["status"]
        return status

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == type_)


async def test_a_count_written_by_another_writer_between_status_and_scale_is_not_overwritten() -> None:
    h = Harness(pool(1), replicas=1, inflight=6)
    write_status = h.kube.write_status

    async def then_someone_scales(pool_: dict[str, Any], status: dict[str, Any],
                                  gating: bool = False) -> dict[str, Any]:
        ours = await write_status(pool_, status, gating)
        h.kube.pool["spec"]["replicas"] = 5                       # e.g. kubectl scale, right after our PUT
        h.kube.bump()
        return ours

    h.kube.write_status = then_someone_scales  # type: ignore[method-assign]
    await h.step()
    assert h.kube.scaled == [] and h.kube.pool["spec"]["replicas"] == 5
    assert "SuccessfulRescale" not in [e.reason for e in h.events]


async def test_a_decision_is_written_with_the_status_then_applied_through_scale() -> None:
    h = Harness(pool(1), replicas=1, inflight=6)
    await h.step()
    assert h.kube.scaled == [3]                                    # ceil(6 / 2)
    scaler = h.status["autoscaler"]
    assert scaler["desiredReplicas"] == 3
    assert scaler["decisions"][-1]["result"] == "ScaleUp" and scaler["decisions"][-1]["applied"] is True
    types = [c["type"] for c in h.status["conditions"]]
    assert types[:3] == ["Available", "Progressing", "Degraded"]
    assert set(types[3:]) == {"ScalingActive", "AbleToScale", "ScalingLimited", OVERRIDDEN}
    assert h.condition(OVERRIDDEN)["status"] == "False"
    assert [e.reason for e in h.events if e.reason == "SuccessfulRescale"] == ["SuccessfulRescale"]
    assert "New size: 3" in next(e.message for e in h.events if e.reason == "SuccessfulRescale")
    value = REGISTRY.get_sample_value("genrm_autoscaler_metric_value", {"namespace": NS, "pool": POOL,
                                                                        "metric": "InFlight"})
    assert value == 6.0
    assert REGISTRY.get_sample_value("genrm_autoscaler_desired_replicas", {"namespace": NS, "pool": POOL}) == 3


async def test_between_intervals_the_conditions_are_carried_over_without_a_write() -> None:
    h = Harness(pool(1), replicas=1, inflight=2)
    await h.step()
    await h.step()                                                 # not due: same status, no PUT
    writes, conditions = h.kube.status_writes, h.status["conditions"]
    await h.step()
    assert h.kube.status_writes == writes and h.status["conditions"] == conditions
    assert {c["type"] for c in conditions} >= {"ScalingActive", "AbleToScale", "ScalingLimited"}


async def test_advisory_records_without_writing() -> None:
    h = Harness(pool(1, mode="Advisory"), replicas=1, inflight=6)
    await h.step()
    assert h.kube.scaled == []
    assert h.status["autoscaler"]["decisions"][-1]["applied"] is False
    assert h.status["autoscaler"]["desiredReplicas"] == 3
    assert OVERRIDDEN not in {c["type"] for c in h.status["conditions"]}
    assert not [e for e in h.events if e.reason == "SuccessfulRescale"]


async def test_an_external_write_is_adopted_not_fought() -> None:
    h = Harness(pool(2), replicas=2, inflight=2)                   # 4 in flight: 2 replicas is right
    await h.step()
    h.kube.pool["spec"]["replicas"] = 5                            # kubectl scale, an HPA, KEDA...
    h.kube.bump()
    h.due()
    await h.step()
    assert h.kube.scaled == []                                     # the down window protects the external 5
    assert h.condition(OVERRIDDEN)["status"] == "True"
    assert h.condition(OVERRIDDEN)["reason"] == "ExternalWrite"
    assert any(e.reason == OVERRIDDEN and e.type == "Warning" for e in h.events)
    assert h.status["autoscaler"]["desiredReplicas"] == 5
    h.due()
    await h.step()                                                 # still overridden, not detected again
    assert h.condition(OVERRIDDEN)["status"] == "True" and h.kube.scaled == []
    h.inflight = 14                                                # 7 x 2 = 14 > 5 x 2: the load needs more
    h.due()
    await h.step()
    assert h.kube.scaled == [6]                                    # maxReplicas
    assert h.condition(OVERRIDDEN)["status"] == "False"            # the autoscaler is in charge again


def test_a_lost_own_write_is_not_an_external_one() -> None:
    spec = AutoscalingSpec.model_validate(pool(1)["spec"]["autoscaling"])
    record = DecisionRecord(id=1, time="2026-01-01T00:00:00Z", current_replicas=1, raw_recommendation=3,
                            desired_replicas=3, result="ScaleUp", applied=True)
    status = AutoscalerStatus(desired_replicas=3, decisions=(record,))
    assert not external_write(spec, 1, status)                     # the write to 3 never landed: repeat it
    assert external_write(spec, 2, status)
    assert not external_write(spec, 3, status)
    assert not external_write(spec, 2, None)                       # nothing decided yet
    advisory = spec.model_copy(update={"mode": "Advisory"})
    assert not external_write(advisory, 2, status)


async def test_mode_off_drops_the_autoscaler_conditions_and_forget_removes_the_series() -> None:
    h = Harness(pool(1), replicas=1, inflight=2)
    await h.step()
    h.kube.pool["spec"]["autoscaling"]["mode"] = "Off"
    h.kube.bump()
    await h.step()
    assert {c["type"] for c in h.status["conditions"]} == {"Available", "Progressing", "Degraded"}
    assert "autoscaler" in h.status                                # history kept for when it is turned on
    metrics.forget_pool(NS, POOL)
    labels = {"namespace": NS, "pool": POOL}
    assert REGISTRY.get_sample_value("genrm_autoscaler_desired_replicas", labels) is None
    assert REGISTRY.get_sample_value("genrm_autoscaler_decisions_total", {**labels, "outcome": "NoChange"}) is None

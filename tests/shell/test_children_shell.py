"""Tests of the children of ``PoolReconciler``'s steps against a fake API server with a fake watch.

Aspects under test: missing children are created in order (Secret, Service, PDB) and, once the
watch shows them, left alone; an edit of spec.service.port patches the existing Service; a
Secret that exists but that the watch does not show (its labels removed) is read, its token
kept and its labels restored; a child write the API server refuses and a refused pod create,
both decided in the step's Plan and both reported by the next step, make the pool Degraded
(ChildFailed) with the API server's message and post a Warning event carrying it; once the
refusal stops, Degraded clears.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from genrm_operator.core.childrenplan import CHILD_FAILED
from genrm_operator.core.model import Event
from genrm_operator.core.names import POOL_LABEL, TOKEN_KEY
from genrm_operator.shell.expectations import Expectations
from genrm_operator.shell.reconciler import PoolReconciler
from kubernetes.client.exceptions import ApiException

NS, POOL = "ml", "judge"
Manifest = dict[str, Any]


def refusal(message: str) -> ApiException:
    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = json.dumps({"kind": "Status", "message": message})
    return exc


def stored(manifest: Manifest) -> Manifest:
    """A created object as the API server stores it and the watch shows it."""
    obj = copy.deepcopy(manifest)
    obj["metadata"]["uid"] = f"{obj['kind']}-uid"
    if "stringData" in obj:
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()}
    return obj


class FakeKube:
    """One pool, its children (what the index shows) and every write, in memory."""

    def __init__(self) -> None:
        self.pool: Manifest = {
            "apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool",
            "metadata": {"name": POOL, "namespace": NS, "uid": "pool-uid", "generation": 1, "resourceVersion": "1"},
            "spec": {"replicas": 1, "model": {"path": "sim/judge"}, "engine": {"image": "sim"}},
        }
        self.children: list[Manifest] = []
        self.hidden: dict[str, Manifest] = {}
        """Objects that exist but that the label-filtered watch does not show."""
        self.writes: list[tuple[str, str, Any]] = []
        self.refuse: dict[str, ApiException] = {}
        """Kind -> the refusal its create gets."""

    async def get_pool(self, namespace: str, name: str) -> Manifest:
        return copy.deepcopy(self.pool)

    def changed(self) -> None:
        """Every change of an object gets a new resourceVersion, as on the API server."""
        meta = self.pool["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def edit_spec(self, **fields: Any) -> None:
        self.pool["spec"].update(fields)
        self.changed()

    async def write_status(self, pool: Manifest, status: Manifest, gating: bool = False) -> Manifest:
        self.pool["status"] = status
        self.changed()
        return copy.deepcopy(self.pool)

    async def create(self, manifest: Manifest) -> bool:
        kind = manifest["kind"]
        self.writes.append(("create", kind, manifest["metadata"]["name"]))
        if kind in self.refuse:
            raise self.refuse[kind]
        if kind in self.hidden:
            return False
        if kind != "Pod":
            self.children.append(stored(manifest))
        return True

    async def read_child(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.hidden.get(kind))

    async def patch_child(self, kind: str, namespace: str, name: str, patch: Manifest) -> None:
        self.writes.append(("patch", kind, patch))

    async def delete_child(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", kind, uid))


class FakeSidecars:
    """No pod here has an address, so no sidecar is ever asked."""

    async def state(self, ep: Any, version: int | None = None, wait_seconds: float = 0.0) -> None:
        raise AssertionError("no sidecar to ask")


class Harness:
    def __init__(self) -> None:
        self.kube = FakeKube()
        self.events: list[Event] = []
        self.reconciler = PoolReconciler(self.kube, FakeSidecars(), self.post, NS, POOL,  # type: ignore[arg-type]
                                         list, lambda: copy.deepcopy(self.kube.children),
                                         lambda: copy.deepcopy(self.kube.pool))

    async def post(self, pool: Manifest, event: Event) -> None:
        self.events.append(event)

    async def step(self) -> None:
        self.kube.writes.clear()
        await self.reconciler.step()

    def degraded(self) -> Manifest:
        return next(c for c in self.kube.pool["status"]["conditions"] if c["type"] == "Degraded")


async def test_missing_children_are_created_in_order_then_left_alone() -> None:
    h = Harness()
    await h.step()
    assert [w[1] for w in h.kube.writes] == ["Secret", "Service", "PodDisruptionBudget", "Pod"]
    await h.step()
    assert [w for w in h.kube.writes if w[1] != "Pod"] == []
    assert h.degraded()["status"] == "False"


async def test_an_edited_service_port_patches_the_existing_service() -> None:
    h = Harness()
    await h.step()
    h.kube.edit_spec(service={"port": 9000})
    await h.step()
    assert ("patch", "Service", {"spec": {"ports": [
        {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}]}}) in h.kube.writes


async def test_a_secret_the_watch_does_not_show_is_read_its_token_kept_and_its_labels_restored() -> None:
    h = Harness()
    token = base64.b64encode(b"old-token").decode()
    h.kube.hidden["Secret"] = {"kind": "Secret", "metadata": {
        "name": f"{POOL}-control", "uid": "secret-uid", "labels": {},
        "ownerReferences": [{"controller": True, "uid": "pool-uid"}]}, "data": {TOKEN_KEY: token}}
    await h.step()
    assert h.reconciler.applier.token == "old-token"
    [patch] = [w for w in h.kube.writes if w[0] == "patch"]
    assert patch[1] == "Secret" and patch[2]["metadata"]["labels"][POOL_LABEL] == POOL


async def test_refused_children_make_the_pool_degraded_with_the_api_servers_message() -> None:
    h = Harness()
    h.kube.refuse["Service"] = refusal('Service "judge" is invalid: metadata.name: Invalid value')
    await h.step()  # the Plan's Service create is refused after the decision
    await h.step()  # ... and reported by the next step, as a refused pod action is
    degraded = h.degraded()
    assert degraded["status"] == "True" and degraded["reason"] == CHILD_FAILED
    assert degraded["message"] == 'Service judge: Service "judge" is invalid: metadata.name: Invalid value'
    assert Event("Warning", CHILD_FAILED, degraded["message"]) in h.events

    del h.kube.refuse["Service"]
    h.kube.refuse["Pod"] = refusal('Pod "judge-0" is invalid: spec.tolerations[0].operator: Unsupported value')
    # The first step's create went through, and no pod ever shows up here: without this, the create
    # would not be tried again until the expectation of it runs out.
    h.reconciler.executor.expected = Expectations(seconds=0.0)
    await h.step()  # the Service is created; the pod create is refused after the status write
    await h.step()  # ... and reported by the next step
    assert h.degraded()["message"] == (
        'Pod judge-0: Pod "judge-0" is invalid: spec.tolerations[0].operator: Unsupported value')
    assert any(e.type == "Warning" and e.message.startswith("Pod judge-0:") for e in h.events)

    del h.kube.refuse["Pod"]
    await h.step()
    await h.step()
    assert h.degraded()["status"] == "False"

"""spec.verification.sampling, and the rule that ties verification to deterministic inference, checked
by the real CEL of a real kube-apiserver.

Aspects under test:
- ``sampling`` is ``Seeded`` (today's probes) unless set, ``Seeded`` or ``Greedy`` only, camelCase on
  the wire, with its default in the CRD;
- the API server (etcd and kube-apiserver built by hack/control-plane.sh, found through
  ``GENRM_BIN_DIR``; the CRD rendered from the models) admits Greedy verification of a
  non-deterministic engine and refuses Seeded verification of one, with a message reported at
  ``spec.verification.enabled`` that names every way out (deterministic inference, Greedy, no
  verification); a deterministic pool, or one without verification, is admitted in either mode;
- the rule holds for updates too: an admitted Greedy pool cannot be switched to Seeded while its
  engine is not deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from genrm_cluster.controlplane import ControlPlane
from genrm_cluster.kubeapi import ApiError, KubeAPI
from genrm_operator import crdgen
from genrm_operator.api.pool import GROUP, KIND, PLURAL, VERSION
from genrm_operator.api.spec import VerificationSpec
from pydantic import ValidationError

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

POOLS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
SERVICE_CIDR = "10.96.0.0/24"
"""Only configuration here: no Service is created and no kube-proxy runs."""
NON_DETERMINISTIC = {"deterministic": False}


def test_sampling_is_seeded_unless_set_and_takes_two_values() -> None:
    assert VerificationSpec().sampling == "Seeded"
    greedy = VerificationSpec.model_validate({"sampling": "Greedy"})
    assert greedy.sampling == "Greedy" and greedy.to_wire()["sampling"] == "Greedy"
    with pytest.raises(ValidationError):
        VerificationSpec.model_validate({"sampling": "greedy"})
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    verification = schema["properties"]["spec"]["properties"]["verification"]
    assert verification["properties"]["sampling"]["enum"] == ["Seeded", "Greedy"]
    assert verification["default"]["sampling"] == "Seeded"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    workdir = tmp_path_factory.mktemp("control-plane")
    crd = workdir / "crd.yaml"
    crd.write_text(crdgen.render())
    plane = ControlPlane(workdir)
    plane.start(SERVICE_CIDR, [crd])
    try:
        yield plane.api
    finally:
        plane.stop()


def manifest(name: str, engine: dict[str, Any], verification: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name},
            "spec": {"replicas": 0, "model": {"path": "org/judge"}, "engine": engine, "verification": verification}}


def refusal(api: KubeAPI, method: str, path: str, body: dict[str, Any],
            content_type: str = "application/json") -> str:
    """The API server's answer to a server-side dry run: its refusal, or "" when it admits the change."""
    try:
        api.request(method, path, body, params={"dryRun": "All"}, content_type=content_type)
    except ApiError as refused:
        assert refused.status == 422, refused
        return refused.body
    return ""


def assert_refused_with_the_ways_out(message: str) -> None:
    assert "spec.verification.enabled" in message, message
    for way_out in ("spec.engine.deterministic=true", "spec.verification.sampling=Greedy",
                    "spec.verification.enabled=false"):
        assert way_out in message, (way_out, message)


@pytest.mark.parametrize(("engine", "verification", "admitted"), [
    (NON_DETERMINISTIC, {"sampling": "Greedy"}, True),
    (NON_DETERMINISTIC, {}, False),
    (NON_DETERMINISTIC, {"sampling": "Seeded"}, False),
    (NON_DETERMINISTIC, {"enabled": False}, True),
    (NON_DETERMINISTIC, {"enabled": False, "sampling": "Seeded"}, True),
    ({}, {}, True),
    ({"deterministic": True}, {"sampling": "Greedy"}, True),
], ids=["greedy", "seeded-by-default", "seeded", "off", "off-seeded", "deterministic", "deterministic-greedy"])
def test_only_seeded_verification_needs_a_deterministic_engine(
        api: KubeAPI, engine: dict[str, Any], verification: dict[str, Any], admitted: bool) -> None:
    message = refusal(api, "POST", POOLS, manifest("judge", engine, verification))
    if admitted:
        assert message == ""
    else:
        assert_refused_with_the_ways_out(message)


def test_a_greedy_verified_pool_cannot_switch_to_seeded_without_deterministic_inference(api: KubeAPI) -> None:
    api.post(POOLS, manifest("greedy", NON_DETERMINISTIC, {"sampling": "Greedy"}))
    try:
        def patched(verification: dict[str, Any]) -> str:
            return refusal(api, "PATCH", f"{POOLS}/greedy", {"spec": {"verification": verification}},
                           "application/merge-patch+json")

        assert_refused_with_the_ways_out(patched({"sampling": "Seeded"}))
        assert patched({"sampling": "Seeded", "enabled": False}) == ""
    finally:
        api.delete(f"{POOLS}/greedy")

"""The hollow server's state long poll takes the gateway's parameters within the gateway's bounds, and
its replicas report a drain's reason as the gateway does.

Aspects under test: a version and a wait are read from the query; a missing, non-integer or
negative version and a non-numeric, negative, endless or too long wait are refused (None: the
server answers 400, as the gateway does) instead of failing inside the server; a drain's reason
(a judge switch) is in the state document until an undrain, and absent without one.
"""

from __future__ import annotations

from genrm_cluster.hollow import HollowReplica, long_poll
from genrm_contract.sidecar import MAX_WAIT_SECONDS, VERSION_PARAM, WAIT_PARAM, DrainRequest, UndrainRequest


def test_the_long_poll_parameters_are_read_within_the_gateways_bounds() -> None:
    assert long_poll({VERSION_PARAM: ["3"], WAIT_PARAM: ["30.0"]}) == (3, 30.0)
    assert long_poll({VERSION_PARAM: ["0"]}) == (0, 0.0)
    for bad in ({}, {VERSION_PARAM: ["x"]}, {VERSION_PARAM: ["-1"]}, {VERSION_PARAM: ["1"], WAIT_PARAM: ["soon"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: ["-1"]}, {VERSION_PARAM: ["1"], WAIT_PARAM: ["inf"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: ["nan"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: [str(MAX_WAIT_SECONDS + 1)]}):
        assert long_poll(bad) is None, bad


def test_a_hollow_replica_reports_a_drains_reason_as_the_gateway_does() -> None:
    replica = HollowReplica()
    assert replica.drain(DrainRequest.model_validate({"drainId": "d", "phase": "soft"}), 1.0)
    assert "drainReason" not in replica.document(1.0)
    assert replica.drain(DrainRequest.model_validate({"drainId": "d", "phase": "fence", "reason": "judgeSwitched",
                                                      "activeRevision": "4b1e9d0c7a"}), 2.0)
    assert replica.document(2.0)["drainReason"] == "judgeSwitched"
    assert replica.undrain(UndrainRequest(drain_id="d"), 2.5)
    assert "drainReason" not in replica.document(2.5)

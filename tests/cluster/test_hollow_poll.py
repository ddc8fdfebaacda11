"""The hollow server's state long poll takes the gateway's parameters within the gateway's bounds.

Aspects under test: a version and a wait are read from the query; a missing, non-integer or
negative version and a non-numeric, negative, endless or too long wait are refused (None: the
server answers 400, as the gateway does) instead of failing inside the server.
"""

from __future__ import annotations

from genrm_cluster.hollow import long_poll
from genrm_contract.sidecar import MAX_WAIT_SECONDS, VERSION_PARAM, WAIT_PARAM


def test_the_long_poll_parameters_are_read_within_the_gateways_bounds() -> None:
    assert long_poll({VERSION_PARAM: ["3"], WAIT_PARAM: ["30.0"]}) == (3, 30.0)
    assert long_poll({VERSION_PARAM: ["0"]}) == (0, 0.0)
    for bad in ({}, {VERSION_PARAM: ["x"]}, {VERSION_PARAM: ["-1"]}, {VERSION_PARAM: ["1"], WAIT_PARAM: ["soon"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: ["-1"]}, {VERSION_PARAM: ["1"], WAIT_PARAM: ["inf"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: ["nan"]},
                {VERSION_PARAM: ["1"], WAIT_PARAM: [str(MAX_WAIT_SECONDS + 1)]}):
        assert long_poll(bad) is None, bad

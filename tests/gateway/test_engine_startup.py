"""A gateway whose engine is still loading: SGLang's port stays closed until its weights are loaded."""

from __future__ import annotations

import httpx
import pytest
from conftest import gateway_stack
from genrm_testing import wait_ready

pytestmark = pytest.mark.timeout(30)


def test_a_gateway_started_before_its_engine_listens_is_unready_and_holds_requests_for_it() -> None:
    """The pod's containers start together, so the gateway first meets a closed engine port: it is
    unready, and a request that arrives meanwhile (no peer to take it) waits for the engine instead of
    failing when ``engineWaitSeconds`` asks for it (by default it is refused at once: test_peers)."""
    with gateway_stack("--engine-wait-seconds", "10", sim_args=("--sim-startup-seconds", "3"),
                       wait_ready_probe=False) as stack:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{stack.sim.url}/ready")
        assert httpx.get(f"{stack.control}/healthz/ready").status_code == 503
        answer = httpx.post(f"{stack.url}/generate", json={"text": "x"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["meta_info"]["finish_reason"] is not None
        wait_ready(f"{stack.control}/healthz/ready", seconds=5)

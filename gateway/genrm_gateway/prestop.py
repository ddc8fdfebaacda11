"""``genrm-gateway drain --wait``: the pod's preStop hook, run next to the gateway it drains.

Why a command and not an httpGet hook: the hook must block until the replica is drained (or a
deadline passes) so the kubelet's SIGTERM only comes when nothing is in flight, and it must step
through soft drain, the propagation window and the fence as the operator would. If the operator
is already draining this pod under its own drain id, the hook only waits for Drained (with the
same wait the engine container's hook runs, ``genrm_contract.drained``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
from genrm_contract.drained import control_token, wait_drained
from genrm_contract.sidecar import DRAIN_PATH, DrainPhase, DrainState

_RETRY_SECONDS = 0.2


@dataclass(frozen=True)
class PreStopDrain:
    port: int
    drain_id: str
    deadline_seconds: float
    propagation_seconds: float

    def run(self) -> int:
        """0 once Drained; 1 when the deadline passes first."""
        deadline = time.monotonic() + self.deadline_seconds
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}",
                          headers={"authorization": f"Bearer {control_token() or ''}"}, timeout=5.0) as client:
            soft = self._call(client, DrainPhase.SOFT, deadline)
            if soft is not None and soft.get("state") == DrainState.SOFT_DRAIN:
                time.sleep(max(0.0, min(self.propagation_seconds, deadline - time.monotonic())))
                self._call(client, DrainPhase.FENCE, deadline)
        drained = wait_drained(self.port, max(0.0, deadline - time.monotonic()))
        if drained is not None:
            print(f"genrm-gateway: drained ({drained.get('completedTotal')} requests completed)")
            return 0
        print(f"genrm-gateway: not drained after {self.deadline_seconds}s", file=sys.stderr)
        return 1

    def _call(self, client: httpx.Client, phase: DrainPhase, deadline: float) -> dict[str, Any] | None:
        """POST /v1/drain, retried until the deadline; None when another drain id owns the pod."""
        while time.monotonic() < deadline:
            try:
                response = client.post(DRAIN_PATH, json={"drainId": self.drain_id, "phase": phase})
            except httpx.TransportError:
                time.sleep(_RETRY_SECONDS)
                continue
            if response.status_code == 409:
                return None
            if response.status_code == 200:
                document: dict[str, Any] = response.json()
                return document
            print(f"genrm-gateway: drain {phase} refused: {response.status_code} {response.text}",
                  file=sys.stderr)
            return None
        return None

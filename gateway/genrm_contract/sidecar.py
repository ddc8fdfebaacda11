"""The operator <-> gateway sidecar contract: ports, paths, drain states, documents, headers, metrics.

Why one module: the gateway serves this protocol while the operator, the engine's preStop hook,
the dashboards and the tests speak it. Defined once, a change is one edit both sides see, and a
copy that drifts cannot exist. It imports only the standard library and pydantic (an
import-linter contract keeps it so), so any side, the functional core included, may use it.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from genrm_contract.drained import DRAINED
from genrm_contract.drained import STATE_PATH as STATE_PATH
from genrm_contract.drained import TOKEN_ENV as TOKEN_ENV
from genrm_contract.drained import TOKEN_FILE_ENV as TOKEN_FILE_ENV

TRAFFIC_PORT = 8000
"""Judge traffic: the Service's target (container port name ``http``)."""
CONTROL_PORT = 8001
"""Probes, the drain API and ``/metrics`` (container port name ``control``)."""
TRAFFIC_PORT_NAME = "http"
CONTROL_PORT_NAME = "control"

READY_PATH = "/healthz/ready"
LIVE_PATH = "/healthz/live"
DRAIN_PATH = "/v1/drain"
UNDRAIN_PATH = "/v1/undrain"
METRICS_PATH = "/metrics"

REASON_HEADER = "x-genrm-reason"
"""Every refusal names its reason here and in the JSON error body."""
DRAINING_HEADER = "x-genrm-draining"
"""Set on answers given while the replica drains."""

QUIET_SECONDS = 2
"""Fenced, empty and engine-idle this long counts as drained."""
PROPAGATION_SECONDS = 5
"""Soft drain to fence: time for endpoints to stop routing to the replica."""
MAX_BODY_BYTES = 8 * 1024 * 1024
"""Request bodies larger than this are refused with 413."""


class DrainState(enum.StrEnum):
    """Serving -> SoftDrain -> Fenced -> Drained (Drained is final: the replica never serves again)."""

    SERVING = "Serving"
    SOFT_DRAIN = "SoftDrain"
    FENCED = "Fenced"
    DRAINED = DRAINED


class Phase(enum.StrEnum):
    """What a drain call asks for: soft (keep admitting, stop keep-alive) or fence (refuse new requests)."""

    SOFT = "soft"
    FENCE = "fence"


class Reason(enum.StrEnum):
    """Refusal reasons a client or the operator acts on (all carry ``Retry-After`` and close the connection)."""

    DRAINING = "draining"
    ENGINE_UNAVAILABLE = "engineUnavailable"


class _Document(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class DrainRequest(_Document):
    """``POST /v1/drain``: idempotent per drain id; another drain id gets 409."""

    drain_id: str = Field(alias="drainId", min_length=1)
    phase: Phase
    quiet_seconds: float | None = Field(default=None, alias="quietSeconds", ge=0)


class UndrainRequest(_Document):
    """``POST /v1/undrain``: back to Serving, unless Drained (409)."""

    drain_id: str = Field(alias="drainId", min_length=1)


class EngineReport(_Document):
    up: bool
    healthy: bool
    running_requests: int | None = Field(alias="runningRequests")
    queued_requests: int | None = Field(alias="queuedRequests")
    token_usage: float | None = Field(alias="tokenUsage")


class StateDocument(_Document):
    """``GET /v1/state`` (and the answer to drain calls): the proof a replica drained."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    state: DrainState
    drain_id: str | None = Field(alias="drainId")
    inflight: int = Field(ge=0)
    admitted_total: int = Field(alias="admittedTotal")
    completed_total: int = Field(alias="completedTotal")
    refused_total: int = Field(alias="refusedTotal")
    engine: EngineReport
    idle_since_seconds: float | None = Field(alias="idleSinceSeconds")

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")


class Series(enum.StrEnum):
    """Series the gateway exports on ``/metrics`` (counters without their ``_total`` suffix)."""

    INFLIGHT = "genrm_gateway_inflight_requests"
    DRAIN_STATE = "genrm_gateway_drain_state"
    ENGINE_UP = "genrm_gateway_engine_up"
    OPEN_CONNECTIONS = "genrm_gateway_open_connections"
    REQUESTS = "genrm_gateway_requests"
    REQUEST_DURATION = "genrm_gateway_request_duration_seconds"
    REFUSED = "genrm_gateway_refused"
    ENGINE_RUNNING = "genrm_engine_running_requests"
    ENGINE_QUEUED = "genrm_engine_queued_requests"
    ENGINE_KV_CACHE = "genrm_engine_kv_cache_usage_ratio"

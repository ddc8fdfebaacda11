"""The operator <-> gateway sidecar contract: ports, paths, drain states, documents, headers, metrics.

Why one module: the gateway serves this protocol while the operator, the engine's preStop hook,
the dashboards and the tests speak it. Defined once, a change is one edit both sides see, and a
copy that drifts cannot exist. It imports only the standard library and pydantic (an
import-linter contract keeps it so), so any side, the functional core included, may use it.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genrm_contract.demand import DemandHint
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
SHED_PATH = "/v1/shed"
METRICS_PATH = "/metrics"
PROBE_PREFIX = "/v1/probe"
"""The judge routes again on the control port, under this prefix (``/v1/probe/generate``): the
operator's verification probes, authenticated by the pool's control token. The gateway adds the
engine's API key, so the operator never needs a pool's key, nor RBAC on the Secret holding it."""

ENGINE_KEY_ENV = "GENRM_ENGINE_API_KEY"
"""The key-writing init container's variable, a ``secretKeyRef`` to ``spec.engine.apiKey``."""
ENGINE_CONFIG_FILE = "sglang.yaml"
"""The engine's ``--config`` file (``api-key: <key>``), written by that init container."""
ENGINE_KEY_FILE = "api-key"
"""The gateway's copy of the key (``--engine-api-key-file``), written beside the engine's file."""

REASON_HEADER = "x-genrm-reason"
"""Every refusal names its reason here and in the JSON error body."""
DRAINING_HEADER = "x-genrm-draining"
"""Set on answers given while the replica drains."""
REVISION_HEADER = "x-genrm-revision"
"""The replica's judge revision, on every answer of its gateway, refusals included: which judge gave a
verdict, or which one refused it (the engine's ``weight_version`` says the same of a verdict)."""
HELD_HEADER = "x-genrm-held-seconds"
"""On an answer the activator forwarded: how long it held the request while the pool had no serving
replica (seconds, to the millisecond; ``0.000`` when one was serving at once). A trainer adds these
up to know what a step spent waiting for a pool at zero."""
JUDGE_REVISION_FLAG = "--judge-revision"
"""The gateway's flag (env ``GENRM_JUDGE_REVISION``) with the value of `REVISION_HEADER`."""
JUDGE_REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""What a judge revision may be: it goes into a response header and a label value as it is."""
SHOULD_RETRY_HEADER = "x-should-retry"
"""``true`` or ``false`` on every refusal the gateway and the activator write (:func:`retry_headers`).
Why this name: it is the marker the unmodified ``openai`` client already obeys (it overrides the
client's own guess from the status), so a trainer on that client retries exactly what the pool says
is safe, and a trainer on ``genrm-client`` reads the same marker."""

QUIET_SECONDS = 2
"""Fenced, empty and engine-idle this long counts as drained."""
IDLE_REPORT_SECONDS = 1.0
"""In-flight zero this long makes a replica report itself idle (``StateDocument.idle``)."""
PROPAGATION_SECONDS = 5
"""Soft drain to fence: time for endpoints to stop routing to the replica."""
MAX_BODY_BYTES = 8 * 1024 * 1024
"""Request bodies larger than this are refused with 413."""

WAIT_PARAM = "waitSeconds"
VERSION_PARAM = "version"
"""``GET /v1/state?version=V&waitSeconds=S`` is a long poll: the answer comes as soon as the state's
version differs from ``V``, or after ``S`` seconds with the same version. The operator keeps one such
poll open per replica instead of asking every replica at every reconcile step."""
MAX_WAIT_SECONDS = 60.0
"""The longest wait a state poll may ask for (less than the gateway's 75 s keep-alive)."""
WATCH_TICK_SECONDS = 0.2
"""How often a waiting state poll looks again: a deferred fence and Drained come due with time, not
with a call, so a change is answered within this long."""


class DrainState(enum.StrEnum):
    """Serving -> SoftDrain -> Fenced -> Drained (Drained is final: the replica never serves again)."""

    SERVING = "Serving"
    SOFT_DRAIN = "SoftDrain"
    FENCED = "Fenced"
    DRAINED = DRAINED


ADMITTING_STATES = frozenset({DrainState.SERVING, DrainState.SOFT_DRAIN})
"""The drain states in which a gateway admits requests; from the fence on it refuses them."""
OPERATOR_DRAIN_PREFIX = "genrm/"
"""The operator's drain ids are ``genrm/<pod uid>``; the gateway's own (preStop, SIGTERM) are not."""


def answers_ready(state: DrainState, drain_id: str | None) -> bool:
    """Whether a gateway in ``state``, drained under ``drain_id``, answers its readiness probe Ready
    (its engine permitting).

    Serving, yes. Soft-draining for the operator, yes: the replica still admits requests and leaves
    the pool's Service because the operator unpublished it, not through its readiness, so a victim
    the operator puts back (a scale-in's rescue: undrained and published again) is a ready endpoint
    the moment its label is back, with no probe period to wait. Soft-draining on its own (preStop,
    SIGTERM: a container restart the operator did not ask for), no: nothing unpublished it, and only
    its readiness takes it out of the Service before the fence. Fenced or Drained, no."""
    if state is DrainState.SOFT_DRAIN:
        return drain_id is not None and drain_id.startswith(OPERATOR_DRAIN_PREFIX)
    return state is DrainState.SERVING


class DrainPhase(enum.StrEnum):
    """What a drain call asks for: soft (keep admitting, stop keep-alive) or fence (refuse new requests)."""

    SOFT = "soft"
    FENCE = "fence"


class RefusalReason(enum.StrEnum):
    """Why the gateway answered a request itself: the clients' vocabulary, spelt in the
    ``x-genrm-reason`` header, the JSON error's ``reason`` and the ``reason`` label of
    ``genrm_gateway_refused_total``. Clients and the operator act on ``draining`` and
    ``engineUnavailable`` (both carry ``Retry-After`` and close the connection: retry on another
    replica); which reasons are retryable is :data:`RETRYABLE_REASONS`."""

    DRAINING = "draining"
    ENGINE_UNAVAILABLE = "engineUnavailable"
    # A blue/green judge switch (`DrainReason.JUDGE_SWITCHED`, `genrm_contract.revisions`).
    JUDGE_SWITCHED = "judgeSwitched"
    """The replica was fenced because the pool's judge changed: the Service already sends a new
    connection to the new revision (503, Retry-After)."""
    REVISION_RETIRED = "revisionRetired"
    """The request is pinned (``x-genrm-revision``) to a revision this replica does not serve, or to
    its own one, which the judge switch retired: no retry can be answered by it (409)."""
    # The engine, answering a request or the readiness probe.
    ENGINE_ERROR = "engineError"
    ENGINE_DISCONNECTED = "engineDisconnected"
    ENGINE_TIMEOUT = "engineTimeout"
    ENGINE_DOWN = "engineDown"
    ENGINE_UNHEALTHY = "engineUnhealthy"
    # A peer replica, answering a request forwarded while this replica's engine is down.
    PEER_FAILED = "peerFailed"
    """The peer took the request and broke before answering it whole (502, 504 when it timed out,
    or a cut stream): the peer's engine or gateway, not this replica's engine."""
    PEER_UNPROVEN = "peerUnproven"
    """The peer's answer did not prove it one of the pool's gateways (`genrm_contract.peers`): dropped,
    502."""
    # Authentication (the traffic port's API key, the control port's token).
    UNAUTHENTICATED = "unauthenticated"
    INVALID_API_KEY = "invalidApiKey"
    FORBIDDEN = "forbidden"
    # Routes.
    NOT_FOUND = "notFound"
    NOT_ALLOWED = "notAllowed"
    METHOD_NOT_ALLOWED = "methodNotAllowed"
    HTTP_ERROR = "httpError"
    # The request's HTTP framing (connection limits and parsing).
    BAD_REQUEST = "badRequest"
    BAD_HOST = "badHost"
    BAD_TRANSFER_ENCODING = "badTransferEncoding"
    INVALID_HEADER = "invalidHeader"
    HEAD_TOO_LARGE = "headTooLarge"
    TOO_MANY_HEADERS = "tooManyHeaders"
    TOO_MANY_PIPELINED = "tooManyPipelined"
    TOO_MANY_CONNECTIONS = "tooManyConnections"
    HEAD_TIMEOUT = "headTimeout"
    BODY_TIMEOUT = "bodyTimeout"
    BODY_TOO_LARGE = "bodyTooLarge"
    # The body's JSON.
    INVALID_JSON = "invalidJson"
    JSON_TOO_DEEP = "jsonTooDeep"
    JSON_TOO_COMPLEX = "jsonTooComplex"
    INVALID_REQUEST_ID = "invalidRequestId"
    BATCH_TOO_LARGE = "batchTooLarge"
    # The answer.
    STREAM_TOO_LARGE = "streamTooLarge"
    CLIENT_GONE = "clientGone"
    """The client disconnected before its answer (status 499, counted, nothing sent)."""
    WRITE_TIMEOUT = "writeTimeout"
    """A client stopped reading its answer (counted; the connection is closed)."""
    TRAILER_DROPPED = "trailerDropped"
    """A chunked body's trailer fields were dropped, not forwarded (counted; the request goes on)."""
    # The drain API.
    DRAIN_CONFLICT = "drainConflict"
    # Demand hints.
    TOO_MANY_HINTS = "tooManyHints"
    # The activator (`genrm_contract.activator`), for a pool at zero.
    UNKNOWN_POOL = "unknownPool"
    """The request's Host is no pool the activator serves (404)."""
    HOLD_QUEUE_FULL = "holdQueueFull"
    """The pool already holds ``maxHeld`` requests (503, Retry-After)."""
    HOLD_TIMEOUT = "holdTimeout"
    """No replica served within ``holdTimeoutSeconds`` (503, Retry-After)."""
    POOL_REMOVED = "poolRemoved"
    """The pool's route went away while the request was held (503, Retry-After)."""


RETRYABLE_REASONS: Mapping[RefusalReason, int] = MappingProxyType({
    RefusalReason.DRAINING: 1, RefusalReason.JUDGE_SWITCHED: 1, RefusalReason.ENGINE_UNAVAILABLE: 1,
    RefusalReason.TOO_MANY_CONNECTIONS: 1, RefusalReason.TOO_MANY_PIPELINED: 1, RefusalReason.HOLD_QUEUE_FULL: 1,
    RefusalReason.POOL_REMOVED: 1, RefusalReason.HOLD_TIMEOUT: 5,
})
"""The refusals a client may send again, unchanged, and the ``Retry-After`` (seconds) each carries.
Each comes before any engine work (nothing was judged), and another replica, or the same pool a
moment later, can answer: a second is kube-proxy's margin to send the retry elsewhere; a pool that
held a request for its whole hold timeout is still starting, so its clients wait longer. Every other
refusal is final for that request: a malformed or unauthenticated request stays so, and an engine
or peer that broke under a request otherwise (``engineError``, ``peerFailed``, ...) may have judged it;
an engine that died under it leaves the choice to the client (`UNMARKED_REASONS`)."""
OVERLOAD_REASONS = frozenset({RefusalReason.HOLD_QUEUE_FULL, RefusalReason.TOO_MANY_CONNECTIONS})
"""The retryable refusals that say the pool has more than it can take, not that one replica is
leaving: a client sending batches sends fewer at once after one (as after a ``429``)."""


UNMARKED_REASONS = frozenset({RefusalReason.ENGINE_DISCONNECTED})
"""Answers that carry no retry marker: an engine that died under the request. Nothing was refused, and
a judge has no side effects, so the client's own policy decides: the unmodified ``openai`` client
sends it again as it does any 5xx (what keeps its requests whole through an engine crash), while
``genrm-client``, which retries only what the pool marks, names it ``EngineFailed``."""


def retry_headers(reason: RefusalReason) -> tuple[tuple[str, str], ...]:
    """What a refusal for ``reason`` says about retrying it: the :data:`SHOULD_RETRY_HEADER` marker,
    and ``Retry-After`` when it is retryable (nothing for `UNMARKED_REASONS`). Every refusal of the
    gateway and the activator carries these, decided here once, so no refusal can be marked otherwise
    than its reason."""
    if reason in UNMARKED_REASONS:
        return ()
    seconds = RETRYABLE_REASONS.get(reason)
    if seconds is None:
        return ((SHOULD_RETRY_HEADER, "false"),)
    return (SHOULD_RETRY_HEADER, "true"), ("retry-after", str(seconds))


class HandBack(enum.StrEnum):
    """Why a gateway handed a client connection back (closed it gently so the client reconnects and
    the Service places it again): the label of ``genrm_gateway_connections_handed_back_total``."""

    BALANCE = "balance"
    """The replica held more than its fair share of the pool's client connections."""
    LOAD = "load"
    """The replica served well above its fair share of the pool's requests for a while."""
    MAX_AGE = "maxAge"
    """The connection reached its (jittered) maximum age: the backstop that needs no operator."""


class _Document(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class DrainReason(enum.StrEnum):
    """Why the operator drains a replica, when it says (``DrainRequest.reason``): what the replica
    then tells the clients it refuses, instead of the plain ``draining``."""

    JUDGE_SWITCHED = "judgeSwitched"
    """The pool's judge changed (blue/green): its Service now selects another judge revision, and this
    replica's is retired. Its refusals are ``judgeSwitched``, and a request pinned to its revision is
    ``revisionRetired`` (a retry could only find the new judge)."""


class DrainRequest(_Document):
    """``POST /v1/drain``: idempotent per drain id; another drain id gets 409.

    ``reason`` and ``activeRevision`` are optional, and an operator that names neither sends the
    same document as before them (it drops ``None`` fields), which every gateway takes. A call that
    names a reason sets it, and the active revision with it; a call of the same drain id that names
    none leaves them as they are (a retried or later phase of the same drain)."""

    drain_id: str = Field(alias="drainId", min_length=1)
    phase: DrainPhase
    quiet_seconds: float | None = Field(default=None, alias="quietSeconds", ge=0)
    reason: DrainReason | None = None
    active_revision: str | None = Field(default=None, alias="activeRevision", pattern=JUDGE_REVISION_PATTERN)
    """The judge revision now serving the pool, named in the refusals of a ``judgeSwitched`` fence."""

    @model_validator(mode="after")
    def _active_with_its_switch(self) -> DrainRequest:
        if self.active_revision is not None and self.reason is not DrainReason.JUDGE_SWITCHED:
            raise ValueError("activeRevision is told with reason judgeSwitched only")
        return self


class UndrainRequest(_Document):
    """``POST /v1/undrain``: back to Serving, unless Drained (409)."""

    drain_id: str = Field(alias="drainId", min_length=1)


class ShedRequest(_Document):
    """``POST /v1/shed``: hand back ``connections`` client connections, the busiest first.

    Each one closes gently: the response to its next request (or to the one running, if its head
    is not written yet) carries ``Connection: close``; a request running on it is never cut. A
    retried call with the same ``shedId`` does nothing more, so the operator may retry freely."""

    shed_id: str = Field(alias="shedId", min_length=1, max_length=128)
    connections: int = Field(ge=1, le=1_000_000)
    reason: HandBack


class ShedAnswer(_Document):
    """The answer to a shed call: how many connections were marked (fewer than asked when the
    replica holds fewer that are not already being handed back)."""

    shed_id: str = Field(alias="shedId")
    marked: int = Field(ge=0)

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")


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
    client_connections: int | None = Field(default=None, alias="clientConnections", ge=0)
    """Open client connections on the traffic port that are not being handed back: what the
    operator balances (None from a gateway older than balancing). A load figure: not significant."""
    handing_back: int = Field(default=0, alias="handingBack", ge=0)
    """Connections marked for hand-back and still open (their clients have not reconnected yet): the
    operator counts them in the pool's total, or it would shed again for connections on their way."""
    demand: tuple[DemandHint, ...] = ()
    """The demand hints this gateway was sent and that have not expired (`genrm_contract.demand`)."""
    boot_id: str | None = Field(default=None, alias="bootId")
    """Changes when the gateway restarts: versions count from 1 again."""
    version: int | None = Field(default=None, ge=0)
    """Grows whenever something the operator acts on changes (see :class:`Versions`)."""
    drain_reason: DrainReason | None = Field(default=None, alias="drainReason")
    """The reason the drain in progress was given (``DrainRequest.reason``): how the operator sees
    that it landed. Absent from the wire when None, so the document is the same as before it."""

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json",
                               exclude={"drain_reason"} if self.drain_reason is None else None)

    @property
    def idle(self) -> bool:
        """Nothing in flight for :data:`IDLE_REPORT_SECONDS` at least: what scale to zero waits on."""
        return self.inflight == 0 and self.idle_since_seconds is not None \
            and self.idle_since_seconds >= IDLE_REPORT_SECONDS

    def significant(self) -> tuple[object, ...]:
        """What the operator decides on: state, drain id, the engine's health, once fenced whether
        anything is still in flight, whether any client is connected (the operator balances only
        pools that have clients), whether the replica is idle (scale to zero), its demand hints and
        the drain's reason (a reason given to a replica already fenced is a change the operator waits
        for). Load figures change all the time and are not part of it; idleness changes at most twice
        per quiet spell, since it needs :data:`IDLE_REPORT_SECONDS` without a request to become true."""
        fenced_busy = self.inflight > 0 if self.state is DrainState.FENCED else None
        return (self.state, self.drain_id, self.engine.up, self.engine.healthy, fenced_busy,
                bool(self.client_connections), self.idle, tuple(self.demand), self.drain_reason)

    def newer_than(self, other: StateDocument | None) -> bool:
        """Whether this report supersedes ``other``: answers on separate connections may arrive out of
        order, so an older version never replaces a newer one of the same gateway process."""
        if other is None or self.boot_id != other.boot_id or self.version is None or other.version is None:
            return True
        return self.version >= other.version


class Versions:
    """Numbers a gateway's state documents: the version grows by one whenever the significant part of
    the document changes, so a long poll can wait for "anything other than version V"."""

    def __init__(self) -> None:
        self.boot_id = secrets.token_hex(6)
        self._version = 0
        self._last: tuple[object, ...] | None = None

    def stamp(self, document: StateDocument) -> StateDocument:
        """The document with this process's boot id and the version its significant part has."""
        significant = document.significant()
        if significant != self._last:
            self._last, self._version = significant, self._version + 1
        return document.model_copy(update={"boot_id": self.boot_id, "version": self._version})


class Series(enum.StrEnum):
    """Series the gateway exports on ``/metrics`` (counters without their ``_total`` suffix)."""

    INFLIGHT = "genrm_gateway_inflight_requests"
    DRAIN_STATE = "genrm_gateway_drain_state"
    ENGINE_UP = "genrm_gateway_engine_up"
    OPEN_CONNECTIONS = "genrm_gateway_open_connections"
    HANDED_BACK = "genrm_gateway_connections_handed_back"
    OPENED_CONNECTIONS = "genrm_gateway_connections_opened"
    REQUESTS = "genrm_gateway_requests"
    REQUEST_DURATION = "genrm_gateway_request_duration_seconds"
    REFUSED = "genrm_gateway_refused"
    FORWARDED = "genrm_gateway_forwarded"
    """Requests that found the engine down and went to peers, by ``outcome`` (`genrm_contract.peers`)."""
    ENGINE_RUNNING = "genrm_engine_running_requests"
    ENGINE_QUEUED = "genrm_engine_queued_requests"
    ENGINE_KV_CACHE = "genrm_engine_kv_cache_usage_ratio"

"""Talking to replica gateway sidecars: state, drain, undrain, peers and verification probes (generation
or reward-model scores).

An unreachable or confused sidecar yields ``None``: the core treats that as
unknown, never as drained, so a network blip can never release a victim.

One aiohttp session for every pool: its connector keeps the kept-alive connections of each
address apart (found by key, not by walking them all) and opens as many as the long polls need.
Why not httpx, which the gateway and its tests use: each httpx response is a reference cycle
(the response and its stream point at each other) of about 40 objects that only the cyclic
garbage collector frees; at one long poll per replica and 1,000 replicas that was a collection
holding the event loop every few seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from genrm_contract.peers import FORWARDED_TO_HEADER, PEERS_PATH, PeersDocument
from genrm_contract.revisions import REVISIONS_PATH, RevisionsDocument
from genrm_contract.sidecar import (
    DRAIN_PATH,
    PROBE_PREFIX,
    SHED_PATH,
    STATE_PATH,
    UNDRAIN_PATH,
    VERSION_PARAM,
    WAIT_PARAM,
    DrainRequest,
    ShedAnswer,
    ShedRequest,
    StateDocument,
    UndrainRequest,
)
from pydantic import ValidationError

from ..api.spec import ProbeRequest, VerificationSpec
from ..core.model import SidecarView
from . import metrics

log = logging.getLogger(__name__)
STATE_SECONDS = 2.0
CONNECT_SECONDS = 1.0
KEEPALIVE_SECONDS = 60.0
"""How long an idle connection to a sidecar is kept (the gateway keeps them 75 s)."""
SEEDED_TEMPERATURE = 0.7
"""Temperature of Seeded probes: their answers are sampled, so replicas agree only when they honour the seed
alike (deterministic inference)."""
DEFAULT_PROBES = (
    ProbeRequest(prompt="Rate the answer 'Paris' to the question 'What is the capital of France?' "
                        "from 1 to 10 and explain briefly.", max_new_tokens=32),
    ProbeRequest(prompt="Which response is more helpful? A: 'Use a for loop.' B: 'Iterate with "
                        "enumerate() to get index and value.' Answer A or B with a reason.", max_new_tokens=32),
    ProbeRequest(prompt="Score this proof step for correctness (0-1): 'If n is even then n^2 is even.'",
                 max_new_tokens=32),
)


CALLS = {STATE_PATH: "state", DRAIN_PATH: "drain", UNDRAIN_PATH: "undrain", SHED_PATH: "shed", PEERS_PATH: "peers"}
"""The ``call`` label of each control route; anything else is a verification probe (``probe``)."""


class NotItsOwn(Exception):
    """A verification probe answered by another replica (the gateway's ``FORWARDED_TO_HEADER``): a
    replica is verified by its own engine's answers or not at all."""


class PeersUnknown(Exception):
    """A gateway that answers ``404`` to ``POST /v1/peers``: it cannot forward, and asking again
    before it is replaced would only repeat the 404."""


def counted() -> aiohttp.TraceConfig:
    """Counts every request the session makes, once, when it ends (`metrics.SIDECAR_REQUESTS`).

    A hook on the session rather than a line at each call site: a call added later is counted too,
    and a long poll is counted when its answer (or its failure) comes, not when it starts."""
    trace = aiohttp.TraceConfig()

    async def answered(_: aiohttp.ClientSession, __: object, params: aiohttp.TraceRequestEndParams) -> None:
        metrics.SIDECAR_REQUESTS.labels(CALLS.get(params.url.path, "probe"), str(params.response.status)).inc()

    async def failed(_: aiohttp.ClientSession, __: object, params: aiohttp.TraceRequestExceptionParams) -> None:
        metrics.SIDECAR_REQUESTS.labels(CALLS.get(params.url.path, "probe"), "error").inc()

    trace.on_request_end.append(answered)
    trace.on_request_exception.append(failed)
    return trace


@dataclass(frozen=True)
class Endpoint:
    """Where one replica's sidecar listens for the operator (its control port), and the pool's control token."""

    ip: str
    control_port: int
    token: str

    @property
    def control(self) -> str:
        """State, drain, verification probes and ``/metrics``."""
        return f"http://{self.ip}:{self.control_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def parse_state(doc: Any) -> StateDocument | None:
    """A /v1/state document, or None when it is not one (unknown, never drained)."""
    try:
        return StateDocument.model_validate(doc)
    except ValidationError:
        return None


def view_of(document: StateDocument, received_at: float) -> SidecarView:
    """The core's view of a sidecar's report, received at ``received_at`` (seconds since the epoch)."""
    idle_from = received_at - document.idle_since_seconds \
        if document.idle and document.idle_since_seconds is not None else None
    return SidecarView(state=document.state, inflight=document.inflight, engine_healthy=document.engine.healthy,
                       idle_from=idle_from, demand=document.demand, reason=document.drain_reason)


class SidecarClient:
    """Async HTTP client shared by all pools of the operator."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def _http(self) -> aiohttp.ClientSession:
        """The session, made on first use (aiohttp sessions belong to the running event loop)."""
        if self._session is None:
            # No limit: every replica's long poll holds a connection of its own.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout(STATE_SECONDS),
                                                  trace_configs=[counted()])
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def state(self, ep: Endpoint, version: int | None = None, wait_seconds: float = 0.0) -> StateDocument | None:
        """The sidecar's state document; with ``version``, a long poll that answers once the state is no
        longer that version (or after ``wait_seconds``). None on any failure."""
        params = {VERSION_PARAM: str(version), WAIT_PARAM: str(wait_seconds)} if version is not None else None
        seconds = STATE_SECONDS if params is None else wait_seconds + STATE_SECONDS
        try:
            async with self._http.get(f"{ep.control}{STATE_PATH}", headers=ep.headers, params=params,
                                      timeout=timeout(seconds)) as response:
                return parse_state(await response.json(content_type=None)) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def drain(self, ep: Endpoint, request: DrainRequest) -> StateDocument | None:
        """POST /v1/drain: the state it led to, or None (to be retried next step) on any failure."""
        return await self._control(ep, DRAIN_PATH, request)

    async def undrain(self, ep: Endpoint, request: UndrainRequest) -> StateDocument | None:
        """POST /v1/undrain: the state it led to, or None (to be retried next step) on any failure."""
        return await self._control(ep, UNDRAIN_PATH, request)

    async def shed(self, ep: Endpoint, request: ShedRequest) -> ShedAnswer | None:
        """POST /v1/shed: how many connections the replica marked, or None on any failure."""
        text = await self._post(ep, SHED_PATH, request)
        try:
            return None if text is None else ShedAnswer.model_validate_json(text)
        except ValidationError:
            return None

    async def peers(self, ep: Endpoint, document: PeersDocument) -> PeersDocument | None:
        """POST /v1/peers: the peers document the gateway holds after the call (a newer one than
        ``document`` if one crossed it), or None on any failure; raises ``PeersUnknown`` when the
        gateway has no such route (a gateway older than peers, or a stand-in replica)."""
        try:
            async with self._http.post(f"{ep.control}{PEERS_PATH}", headers=ep.headers,
                                       json=document.wire()) as response:
                status, text = response.status, await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:  # the pusher logs once per streak of these
            log.debug("sidecar %s %s failed: %r", ep.control, PEERS_PATH, exc)
            return None
        if status == 404:
            raise PeersUnknown(ep.control)
        try:
            return PeersDocument.model_validate_json(text) if status == 200 else None
        except ValidationError:
            return None

    async def revisions(self, ep: Endpoint, document: RevisionsDocument) -> bool:
        """POST /v1/revisions: whether the gateway answered for good (it took the pool's revisions, or
        refused them as a gateway older than judge switches does, which a retry would not change);
        False when it could not be reached or failed, to be told again at a later step."""
        try:
            async with self._http.post(f"{ep.control}{REVISIONS_PATH}", headers=ep.headers,
                                       json=document.wire()) as response:
                return response.status < 500
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("sidecar %s %s failed: %r", ep.control, REVISIONS_PATH, exc)
            return False

    async def _control(self, ep: Endpoint, path: str, request: DrainRequest | UndrainRequest) -> StateDocument | None:
        text = await self._post(ep, path, request)
        try:
            return None if text is None else parse_state(json.loads(text))
        except ValueError:
            return None

    async def _post(self, ep: Endpoint, path: str, request: DrainRequest | UndrainRequest | ShedRequest) -> str | None:
        """The body of a 200 answer to a control call, or None (logged) on any failure."""
        body = request.model_dump(by_alias=True, exclude_none=True, mode="json")
        try:
            async with self._http.post(f"{ep.control}{path}", headers=ep.headers, json=body) as response:
                status, text = response.status, await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("sidecar %s %s failed: %r", ep.control, path, exc)
            return None
        if status != 200:
            log.info("sidecar %s %s -> %s %s", ep.control, path, status, text[:200])
            return None
        return text

    async def answers(self, ep: Endpoint, spec: VerificationSpec) -> list[str]:
        """Probe answers of one replica, in probe order (raises on any failure).

        A generative judge answers on ``/generate`` with text; a reward (sequence-classification)
        model, which SGLang serves on ``/classify`` only, answers with its score. The engine's
        ``/model_info`` says which. Each probe carries a request id of its own: SGLang refuses a
        second request under an id still in flight, and the probes (and verifications of several
        replicas) overlap.

        The probes reach the judge routes through the gateway's control port (``PROBE_PREFIX``), with
        the control token: the same proxy as the traffic port, but neither a pool's API key (which the
        operator never reads) nor a connection counted among the clients' (which the balancer shares
        out). An answer another replica gave (a gateway whose engine is down, older than the rule that it
        never forwards a probe) raises ``NotItsOwn``.
        """
        limit = timeout(float(spec.timeout_seconds))
        judge = f"{ep.control}{PROBE_PREFIX}"
        async with self._http.get(f"{judge}/model_info", timeout=limit, raise_for_status=True,
                                  headers=ep.headers) as info:
            its_own(info)
            generation = bool((await info.json(content_type=None)).get("is_generation", True))

        async def ask(probe: ProbeRequest) -> str:
            path, payload = probe_request(probe, spec, generation)
            async with self._http.post(f"{judge}{path}", json=payload, timeout=limit, raise_for_status=True,
                                       headers={**ep.headers,
                                                "X-Request-Id": f"genrm-verify-{uuid.uuid4().hex}"}) as response:
                its_own(response)
                return probe_answer(await response.json(content_type=None), generation)

        # At once, as a batch of judge calls would come: the answers do not depend on each other.
        return list(await asyncio.gather(*(ask(probe) for probe in spec.requests or DEFAULT_PROBES)))


def its_own(response: aiohttp.ClientResponse) -> None:
    """Raise ``NotItsOwn`` when a probe's answer came from a peer of the replica probed."""
    if FORWARDED_TO_HEADER in response.headers:
        raise NotItsOwn(f"{response.url} was answered by the replica at {response.headers[FORWARDED_TO_HEADER]}")


def timeout(seconds: float) -> aiohttp.ClientTimeout:
    """A whole request within ``seconds``; a connection within a second (a sidecar is one hop away)."""
    return aiohttp.ClientTimeout(total=seconds, sock_connect=CONNECT_SECONDS)


def probe_request(probe: ProbeRequest, spec: VerificationSpec, generation: bool) -> tuple[str, dict[str, Any]]:
    """Route and body of one probe: a generation decoded as ``spec.sampling`` says (`decoding`), or a
    classification, which has nothing to sample (a reward model's probe is one request in both modes)."""
    if not generation:
        return "/classify", {"text": probe.prompt}
    return "/generate", {"text": probe.prompt,
                         "sampling_params": {"max_new_tokens": probe.max_new_tokens, **decoding(spec)}}


def decoding(spec: VerificationSpec) -> dict[str, Any]:
    """The sampling parameters of a generative probe.

    Seeded: sampled with the fixed seed, which SGLang honours only under deterministic inference
    (the API requires it for this mode). Greedy: temperature 0 (SGLang then takes the argmax token)
    and no seed, since none would be used: comparable across replicas without deterministic
    inference, on the conditions ``VerificationSpec.sampling`` states."""
    if spec.sampling == "Greedy":
        return {"temperature": 0}
    return {"temperature": SEEDED_TEMPERATURE, "sampling_seed": spec.sampling_seed}


def probe_answer(doc: Any, generation: bool) -> str:
    """What is compared across replicas: the generated text, or the exact reward score(s)."""
    if generation:
        return str(doc.get("text", ""))
    return json.dumps(doc.get("embedding"))


def compare(candidate: list[str], reference: list[str] | None) -> tuple[bool, str]:
    """Verdict and a message naming the first differing probe with both answers."""
    if reference is None:
        return True, f"{len(candidate)} probes answered (first replica, no reference)"
    for i, (mine, theirs) in enumerate(zip(candidate, reference, strict=True)):
        if mine != theirs:
            return False, f"probe {i} differs: new={mine[:160]!r} reference={theirs[:160]!r}"
    return True, f"{len(candidate)} probes identical to the reference"

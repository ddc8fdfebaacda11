"""Keep-alive judge clients at their libraries' defaults, and each replica's share of the requests.

`KeepAliveClients` is the mix a trainer runs: 8 threads on one `httpx.Client`, 4 `requests.Session`s,
8 tasks on one `aiohttp.ClientSession` and 2 `openai.OpenAI` clients, all sending back to back
through the pool's Service, none told anything about the pool. Each holds its connections for as
long as it keeps sending, so kube-proxy (which places connections, not requests) decides once,
at connect time, which replica gets a client's traffic. The `openai` clients keep their default
retries; the retries they take are counted (from the library's own log), so a run shows whether a
retry, rather than the pool, saved a request.

`ShareMeter` reads every replica's `genrm_gateway_requests_total` from its sidecar's `/metrics`
(the control port, at the pod's address) twice a second, so shares are what the replicas served.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import httpx
import openai
import requests
from genrm_contract.sidecar import Series
from prometheus_client.parser import text_string_to_metric_families

from .plainclients import Failure, Senders, _status_failure, httpx_generate, requests_generate

MIX = {"httpx": 8, "requests": 4, "aiohttp": 8, "openai": 2}
"""Client kind -> concurrent senders (httpx threads share a client, aiohttp tasks share a session)."""
TIMEOUT_SECONDS = 30.0
CONTROL_PORT = 8001
WINDOW_SECONDS = 5.0
"""Shares are judged over windows this long: shorter ones read a few slow requests as skew."""
EVEN_FLOOR = 0.6
"""A replica serving at least this fraction of an even share (15% of four) counts as reached."""


class _RetryCounter(logging.Handler):
    """Counts the openai client's "Retrying request" log records (its only trace of a retry)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying request"):
            self.retries += 1


GATEWAY_ID = re.compile(r"gw[0-9a-f]{12}")
"""The start of every engine request id a gateway mints: its process's own, so it names the replica
that answered (``meta_info.id`` of SGLang's native answers, ``id`` of OpenAI-style ones)."""


@dataclass
class KeepAliveStats:
    ok: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    answered_by: list[tuple[float, str, str]] = field(default_factory=list)
    """(time.monotonic(), client kind, gateway id) of every successful answer."""

    @property
    def sent(self) -> int:
        return sum(self.ok.values()) + len(self.failures)


class KeepAliveClients(Senders):
    """Senders of each kind in ``mix`` (default `MIX`) against `base_url` (http://<ClusterIP>:<port>);
    a context manager."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 16, mix: dict[str, int] | None = None) -> None:
        super().__init__()
        self.base_url, self.model, self.max_tokens = base_url, model, max_tokens
        self.mix = dict(MIX if mix is None else mix)
        self.stats = KeepAliveStats(dict.fromkeys(self.mix, 0))
        self._ids = itertools.count()
        self._retry_log = _RetryCounter()
        self._logger = logging.getLogger("openai._base_client")

    @property
    def openai_retries(self) -> int:
        return self._retry_log.retries

    def __enter__(self) -> KeepAliveClients:
        self._logger.addHandler(self._retry_log)
        self._saved_level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._httpx = httpx.Client(timeout=TIMEOUT_SECONDS)
        senders: list[Callable[[], None]] = [self._httpx_sender] * self.mix.get("httpx", 0)
        senders += [self._requests_sender] * self.mix.get("requests", 0)
        senders += [self._openai_sender] * self.mix.get("openai", 0)
        if self.mix.get("aiohttp"):
            senders.append(self._aiohttp_senders)
        self._start([(f"keepalive-{i}", s) for i, s in enumerate(senders)])
        return self

    def __exit__(self, *exc: object) -> None:
        self._join()
        self._httpx.close()
        self._logger.removeHandler(self._retry_log)
        self._logger.setLevel(self._saved_level)

    def ok_everywhere(self, at_least: int) -> bool:
        return self._each_at_least(self.stats.ok, at_least)

    def _record(self, kind: str, started: float, failure: str | None, answer: str = "") -> None:
        with self._lock:
            if failure is None:
                self.stats.ok[kind] += 1
                if found := GATEWAY_ID.search(answer):
                    self.stats.answered_by.append((time.monotonic(), kind, found.group()))
            else:
                self.stats.failures.append(Failure(started, time.monotonic(), kind, failure))

    def kind_shares(self, start: float, end: float) -> dict[str, list[float]]:
        """Per client kind, the shares of its answers each replica (gateway) gave between ``start`` and
        ``end``, largest first."""
        with self._lock:
            counts = Counter((kind, gateway) for at, kind, gateway in self.stats.answered_by if start <= at <= end)
        totals = Counter[str]()
        for (kind, _), n in counts.items():
            totals[kind] += n
        return {kind: sorted((n / totals[kind] for (k, _), n in counts.items() if k == kind), reverse=True)
                for kind in sorted(totals)}

    def _native(self, kind: str) -> dict[str, object]:
        return {"text": f"Judge answer {kind}-{next(self._ids)}: is 2+2=4?",
                "sampling_params": {"max_new_tokens": self.max_tokens, "temperature": 0}}

    def _httpx_sender(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._record("httpx", started, *httpx_generate(self._httpx, self.base_url, self._native("httpx")))

    def _requests_sender(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.monotonic()
                self._record("requests", started, *requests_generate(session, self.base_url, self._native("requests")))

    def _openai_sender(self) -> None:
        with openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused") as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    completion = client.completions.create(
                        model=self.model, max_tokens=self.max_tokens, temperature=0,
                        prompt=f"Judge answer openai-{next(self._ids)}: is 2+2=4?")
                    failure, answer = None, completion.id
                except openai.OpenAIError as exc:
                    failure, answer = f"{type(exc).__name__}: {exc}", ""
                self._record("openai", started, failure, answer)

    def _aiohttp_senders(self) -> None:
        asyncio.run(self._aiohttp_session())

    async def _aiohttp_session(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as session:
            async def send() -> None:
                while not self._stop.is_set():
                    started = time.monotonic()
                    try:
                        async with session.post(f"{self.base_url}/generate", json=self._native("aiohttp")) as response:
                            text = await response.text()
                            failure = _status_failure(response.status, response.headers, text)
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        failure, text = f"{type(exc).__name__}: {exc}", ""
                    self._record("aiohttp", started, failure, text)
            await asyncio.gather(*(send() for _ in range(self.mix["aiohttp"])))


@dataclass(frozen=True)
class Reading:
    """What one sidecar's `/metrics` said of its traffic at one moment."""

    requests: float
    """`genrm_gateway_requests_total`, summed over routes and codes."""
    durations: tuple[tuple[float, float], ...]
    """`genrm_gateway_request_duration_seconds` buckets (upper bound, cumulative count), summed over routes."""
    handed_back: float
    """`genrm_gateway_connections_handed_back_total`, summed over reasons."""
    opened: float
    """`genrm_gateway_connections_opened_total`: every connect, the client's own reconnects included."""
    connections: float


def reading(metrics_text: str) -> Reading:
    requests = handed_back = opened = connections = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{Series.REQUESTS}_total":
                requests += sample.value
            elif sample.name == f"{Series.REQUEST_DURATION}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{Series.HANDED_BACK}_total":
                handed_back += sample.value
            elif sample.name == f"{Series.OPENED_CONNECTIONS}_total":
                opened += sample.value
            elif sample.name == Series.OPEN_CONNECTIONS:
                connections = sample.value
    return Reading(requests, tuple(sorted(buckets.items())), handed_back, opened, connections)


def quantile(q: float, before: Reading, after: Reading) -> float:
    """The ``q`` quantile of the request durations observed between two readings (a bucket's upper
    bound, as Prometheus' histogram_quantile reads it without interpolation)."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after.durations, before.durations, strict=True)]
    total = counts[-1][1] if counts else 0.0
    return next((le for le, n in counts if n >= q * total), math.inf) if total else math.nan


class ShareMeter:
    """Each replica's served-request counter over time, for shares over any window; a context manager.

    `addresses` gives the replicas to read (pod name -> pod IP) and is called at every reading, so
    replicas that appear later are followed from then on."""

    def __init__(self, addresses: Callable[[], dict[str, str]], every: float = 0.5) -> None:
        self.addresses, self.every = addresses, every
        self.readings: list[tuple[float, dict[str, Reading]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="share-meter")

    def __enter__(self) -> ShareMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                readings: dict[str, Reading] = {}
                for pod, ip in self.addresses().items():
                    try:
                        readings[pod] = reading(client.get(f"http://{ip}:{CONTROL_PORT}/metrics").text)
                    except httpx.HTTPError:
                        continue
                self.readings.append((time.monotonic(), readings))
                self._stop.wait(self.every)

    def between(self, start: float, end: float) -> tuple[float, dict[str, tuple[Reading, Reading]]]:
        """Seconds between the readings nearest after ``start`` and before ``end``, and each replica's
        reading at both (replicas read at both ends only)."""
        first = next((r for r in self.readings if r[0] >= start), None)
        last = next((r for r in reversed(self.readings) if r[0] <= end), None)
        if first is None or last is None or last[0] <= first[0]:
            return 0.0, {}
        return last[0] - first[0], {pod: (first[1][pod], last[1][pod]) for pod in last[1] if pod in first[1]}

    def served(self, start: float, end: float) -> dict[str, float]:
        """Requests each replica served between ``start`` and ``end`` (see `between`)."""
        return {pod: after.requests - before.requests for pod, (before, after) in self.between(start, end)[1].items()}

    def wait_until(self, at: float) -> None:
        """Block until a reading at or after ``at`` (monotonic) exists."""
        while not (self.readings and self.readings[-1][0] >= at):
            if not self._thread.is_alive():
                raise RuntimeError("the share meter stopped")
            time.sleep(0.1)

    def first_even_window(self, since: float, replicas: list[str], within: float
                          ) -> tuple[float | None, dict[str, float]]:
        """The end of the first `WINDOW_SECONDS` window ending within ``within`` seconds of ``since`` in which
        each of ``replicas`` served at least `EVEN_FLOOR` of an even share, and its shares; None and the
        last window's shares when no window did (windows start every half second)."""
        floor = EVEN_FLOOR / len(replicas)
        end, shares = since + WINDOW_SECONDS, {}
        while end <= since + within:
            self.wait_until(end)
            shares = self.shares(end - WINDOW_SECONDS, end)
            if all(shares.get(r, 0.0) >= floor for r in replicas):
                return end, shares
            end += 0.5
        return None, shares

    def shares(self, start: float, end: float) -> dict[str, float]:
        served = self.served(start, end)
        total = sum(served.values())
        return {pod: n / total for pod, n in served.items()} if total else {}

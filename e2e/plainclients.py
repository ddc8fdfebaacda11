"""Unmodified judge clients sending through a pool's Service ClusterIP, as RL trainers do.

Unlike `loadclient.py` these know nothing about the pool: no endpoint lists, no special handling
of `503 draining`. kube-proxy (in the local cluster's router namespace) picks a replica per
connection. Each kind runs with its library's defaults:

* ``openai`` — `openai.OpenAI` (sync) with default settings, including its own retries;
* ``openai-async`` — `openai.AsyncOpenAI` with default settings, on its own event loop;
* ``httpx`` — one `httpx.Client` keep-alive pool, no retries;
* ``requests`` — one `requests.Session`, no retries.

Every request that does not end in a 2xx is a failure and is kept verbatim (client, what the
library raised or the status and body), so a failing test shows exactly what a user would.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import openai
import requests

KINDS = ("openai", "openai-async", "httpx", "requests")
TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Failure:
    """One request that did not end in a 2xx, as the client library reported it."""

    started: float
    """time.monotonic() when the client sent it (openai's own retries included in its span)."""
    at: float
    """time.monotonic() when it ended. The soak attributes a failure to an engine crash it was in
    flight at, or to a moment the Service had no ready endpoint, by this span."""
    kind: str
    text: str
    replica: str | None = None
    """The replica (``ip:port``) it went to, when the client knows: one that picks endpoints itself
    does (loadclient.py); one sending to a ClusterIP does not (kube-proxy picks the replica, the
    gateway's refusals name none, and a refused connection reached none)."""

    def __str__(self) -> str:
        where = f" at {self.replica}" if self.replica else ""
        return f"{self.kind}{where} ({self.at - self.started:.1f}s): {self.text}"


@dataclass
class PlainStats:
    """Outcome counters per client kind, safe to read while the clients run."""

    sent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    ok: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    failures: list[Failure] = field(default_factory=list)

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def failed(self) -> int:
        return len(self.failures)


class Senders:
    """Sender threads that run until stopped, and the lock their outcome counters share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _start(self, targets: Sequence[tuple[str, Callable[[], None]]]) -> None:
        self._threads = [threading.Thread(target=t, name=name, daemon=True) for name, t in targets]
        for thread in self._threads:
            thread.start()

    def _join(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * TIMEOUT_SECONDS)

    def _each_at_least(self, ok: Mapping[str, int], at_least: int) -> bool:
        with self._lock:
            return all(n >= at_least for n in ok.values())


class PlainClients(Senders):
    """Continuous load from each kind in `KINDS` against `base_url` (http://<ClusterIP>:<port>).

    Use as a context manager; `stats` can be read at any time. `model` is the pool's served model
    name (what `/v1/models` lists), needed by the OpenAI API.
    """

    def __init__(self, base_url: str, model: str, max_tokens: int = 16) -> None:
        super().__init__()
        self.base_url, self.model, self.max_tokens = base_url, model, max_tokens
        self.stats = PlainStats()
        self._ids = itertools.count()

    def __enter__(self) -> PlainClients:
        targets = (self._openai_sync, self._openai_async, self._httpx, self._requests)
        self._start([(f"plain-{kind}", t) for kind, t in zip(KINDS, targets, strict=True)])
        return self

    def __exit__(self, *exc: object) -> None:
        self._join()

    def ok_everywhere(self, at_least: int) -> bool:
        """Whether every kind has at least `at_least` successful requests (a wait_for probe)."""
        return self._each_at_least(self.stats.ok, at_least)

    def _prompt(self, kind: str) -> str:
        return f"Judge answer {kind}-{next(self._ids)}: is 2+2=4?"

    def _record(self, kind: str, started: float, failure: str | None) -> None:
        with self._lock:
            self.stats.sent[kind] += 1
            if failure is None:
                self.stats.ok[kind] += 1
            else:
                self.stats.failures.append(Failure(started, time.monotonic(), kind, failure))

    def _openai_sync(self) -> None:
        with openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused") as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    client.chat.completions.create(
                        model=self.model, max_tokens=self.max_tokens, temperature=0,
                        messages=[{"role": "user", "content": self._prompt("openai")}])
                    failure = None
                except openai.OpenAIError as exc:
                    failure = openai_failure(exc)
                self._record("openai", started, failure)

    def _openai_async(self) -> None:
        asyncio.run(self._openai_async_loop())

    async def _openai_async_loop(self) -> None:
        async with openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused") as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    await client.completions.create(model=self.model, max_tokens=self.max_tokens,
                                                    temperature=0, prompt=self._prompt("openai-async"))
                    failure = None
                except openai.OpenAIError as exc:
                    failure = openai_failure(exc)
                self._record("openai-async", started, failure)

    def _httpx(self) -> None:
        with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                self._record("httpx", started, httpx_generate(client, self.base_url, self._native("httpx"))[0])

    def _requests(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.monotonic()
                self._record("requests", started,
                             requests_generate(session, self.base_url, self._native("requests"))[0])

    def _native(self, kind: str) -> dict[str, object]:
        """SGLang's native /generate body."""
        return {"text": self._prompt(kind),
                "sampling_params": {"max_new_tokens": self.max_tokens, "temperature": 0}}


def httpx_generate(client: httpx.Client, base_url: str, body: dict[str, object]) -> tuple[str | None, str]:
    """One native /generate on an httpx client: the failure (None on a 2xx) and the answer's text."""
    try:
        response = client.post(f"{base_url}/generate", json=body)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}", ""
    return _status_failure(response.status_code, response.headers, response.text), response.text


def requests_generate(session: requests.Session, base_url: str, body: dict[str, object],
                      timeout: float = TIMEOUT_SECONDS) -> tuple[str | None, str]:
    """One native /generate on a requests session: the failure (None on a 2xx) and the answer's text."""
    try:
        response = session.post(f"{base_url}/generate", json=body, timeout=timeout)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}", ""
    return _status_failure(response.status_code, response.headers, response.text), response.text


def openai_failure(exc: openai.OpenAIError) -> str:
    """An openai client's failure, in the other clients' words when the pool answered (``HTTP 502
    (engineDisconnected): ...``), so a loss is attributed by the pool's reason whichever client met it:
    the client obeys ``x-should-retry``, so a refusal marked not retryable reaches it as an error."""
    if isinstance(exc, openai.APIStatusError):
        return f"{type(exc).__name__}: {_status_failure(exc.status_code, exc.response.headers, exc.response.text)}"
    return f"{type(exc).__name__}: {exc}"


def _status_failure(code: int, headers: Mapping[str, str], body: str) -> str | None:
    if 200 <= code < 300:
        return None
    reason = headers.get("X-GenRM-Reason", "")
    return f"HTTP {code}{f' ({reason})' if reason else ''}: {body[:200]}"

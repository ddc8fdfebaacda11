"""The trainer's judge client (`genrm_client`) through the pool's ClusterIP, across every change a pool
goes through, beside a client that behaves as verl's reward-loop router does.

One simulator pool serves, in sequence and under continuous load from both clients: a scale-out
(1 -> 2), a rollout (a change of the engine's environment) during which the operator is SIGKILLed
and restarted, the SIGKILL of one serving engine, a scale-in (2 -> 1), an overload burst, and
scale to zero and back (the autoscaler empties the idle pool, then the clients send again: the
activator holds their requests and wakes it). The load pauses only for the idle period that scale
to zero needs. The overload burst: each client sends `BURST` more calls at once (an eval step: the
burst that overwhelms a reward model, THUDM/slime#1582) to the one replica, whose connection limit
(`MAX_CONNECTIONS`) refuses the connections beyond it with the retryable ``503 tooManyConnections``.

* **The trainer's client**: one ``AsyncJudgeClient``, as verl's, slime's and Relax's async hooks
  hold one, with `WORKERS` calls in flight (SGLang's native ``/generate``, greedy). Every verdict's
  text must be what the simulator answers for that prompt (its answer is a pure function of the
  model and the prompt when greedy, `genrm_sim.answers.judge_answer`), and the reward read from it
  must be that answer's score: nothing is returned as a number that is not a verdict. Every attempt
  is recorded on the wire (a wrapping transport): a request is sent again only after an attempt
  the pool did not judge (no connection, a connection closed before any answer byte, or an answer
  marked ``x-should-retry: true``), and the retries the client reports equal the resends seen on
  the wire. The only errors allowed are typed ones (`genrm_client.JudgeError`) at the engine
  crash: ``502 engineDisconnected`` (only the crashed replica's gateway answers that: the request
  was running inside that engine) on a call in flight when the engine died. In the overload burst
  the client must have retried (cause ``overload``: the refused connections), and no call ending
  outside the burst may have been retried for ``overload`` (the limit is sized to refuse only it).
* **verl-like**: verl's ``NaiveRouter._make_async_request`` (read at verl-project/verl
  ``34ae9879``, ``verl/experimental/reward_loop/router/naive_router.py``) in front of the pool's
  Service: no total timeout, ``raise_for_status`` raises any HTTP error at once, and transport
  errors are retried, 3 attempts with 2 s * 2^attempt between them, then raised. Its
  reward function posts OpenAI chat completions. Its failures are counted, not asserted: they are
  what the trainer's client saves (in the burst, each refused connection is an
  ``HTTPStatusError: 503``).

The closing ``trainer-client-e2e:`` line (printed by the e2e's terminal summary) gives both.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from genrm_client import AsyncJudgeClient, JudgeError
from genrm_operator.core.names import JUDGE_REVISION_LABEL
from genrm_sim.answers import AnswerKey, SamplingParams, judge_answer

from .harness import TALLY, Cluster, OperatorProcess, pool_manifest, served_model, wait_for
from .test_soak import dead_by, engine_pid, published

POOL = "trainer"
WORKERS = 3
"""Calls in flight per client: a trainer's judge concurrency, kept small on a 2-core machine."""
MAX_TOKENS = 64
"""Enough for every simulated answer to end with its score (2-4 sentences of at most 11 words, "Score: n")."""
SCORE = re.compile(r"\nScore: (\d+)$")
ENGINE_DIED = "engineDisconnected"
AUTOSCALING: dict[str, Any] = {
    "mode": "Auto", "minReplicas": 1, "maxReplicas": 1, "intervalSeconds": 2,
    "metrics": [{"type": "InFlight", "target": {"averageValue": "50"}}],
    "scaleToZero": {"idleSeconds": 30},
}
"""Set once the other scenarios are done: 30 s is the shortest idle period a pool accepts."""
VERL_ATTEMPTS = 3
VERL_RETRY_DELAY_S = 2.0
MAX_CONNECTIONS = 16
"""The pool's ``spec.gateway.limits.maxConnections`` (per replica; beyond it a connection is answered
``503 tooManyConnections``, ``x-should-retry: true``, ``Retry-After: 1``, and closed): well above
what the other scenarios open to one replica (3 calls of each client in flight, and while the pool
wakes from zero the activator's forwards of those 6 besides them), well below a burst."""
BURST = 32
"""Calls each client sends at once in the overload burst (an eval step's prompts), beside its workers."""


def expected_text(model: str, prompt: str) -> str:
    """What the simulator answers to a greedy ``/generate`` of ``prompt`` (on any replica)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=MAX_TOKENS)
    return "".join(judge_answer(AnswerKey(model, deterministic=True), prompt, params, 0).tokens)


@dataclass(frozen=True)
class Outcome:
    """One call of either client, as the trainer's code saw it."""

    kind: str
    started: float
    ended: float
    reward: float | None = None
    error: str | None = None
    """The exception's type and text, when the call raised."""
    typed: bool = False
    """The error is a `genrm_client.JudgeError` (a typed cause)."""
    reason: str | None = None
    """The pool's reason for the last refusal (``x-genrm-reason``), when it gave one."""
    retries: dict[str, int] = field(default_factory=dict)
    unexpected: str | None = None
    """Why this outcome breaks the client's promise (a number that is not the verdict, an untyped error)."""
    revision: str | None = None
    """The judge revision the verdict named (the client's reading of ``x-genrm-revision``)."""
    held_s: float = 0.0
    """How long the activator held the call while the pool was at zero (``x-genrm-held-seconds``)."""


@dataclass
class Outcomes:
    items: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.items.append(outcome)

    def of(self, kind: str) -> list[Outcome]:
        with self.lock:
            return [o for o in self.items if o.kind == kind]

    def rewards(self, kind: str) -> int:
        return sum(1 for o in self.of(kind) if o.reward is not None)


class WireLog(httpx.AsyncBaseTransport):
    """httpx's transport, recording what each attempt of each request id met before its answer's body."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=64))
        self.attempts: defaultdict[str, list[str]] = defaultdict(list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        rid = request.headers.get("x-request-id", "")
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            self.attempts[rid].append(type(exc).__name__)
            raise
        marker = response.headers.get("x-should-retry")
        self.attempts[rid].append(f"{response.status_code} {response.headers.get('x-genrm-reason', '')} "
                                  f"x-should-retry={marker}")
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


RESENDABLE = re.compile(r"^(ConnectError|ConnectTimeout|RemoteProtocolError|WriteError|\d{3} \S* x-should-retry=true)$")
"""What an attempt may have met for its request to be sent again: nothing judged it."""


class Load:
    """Both clients, `WORKERS` calls each in flight, on one event loop in a thread, until stopped;
    ``pause`` lets the calls in flight end and sends nothing more until ``resume``; ``burst`` sends
    more calls of each client at once, beside the workers."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.outcomes = Outcomes()
        self.wire = WireLog()
        self._ids = itertools.count()
        self._sending = threading.Event()
        self._stop = threading.Event()
        self._inflight = 0
        self._clients: tuple[asyncio.AbstractEventLoop, AsyncJudgeClient, httpx.AsyncClient] | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="trainer-load", daemon=True)

    def __enter__(self) -> Load:
        self._sending.set()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sending.set()
        self._thread.join(60)

    def pause(self) -> None:
        self._sending.clear()
        wait_for("the calls in flight to end", lambda: self._inflight == 0, 60, interval=0.05)

    def resume(self) -> None:
        self._sending.set()

    def burst(self, calls: int) -> None:
        """``calls`` more calls of each client, all at once on the load's clients (an eval step's prompts,
        as a trainer gathers them), the two clients' calls interleaved so neither takes the free
        connections first; returns when every one has ended."""
        assert self._clients is not None, "the load is not running"
        loop, judge, router = self._clients

        async def burst() -> None:
            ended = await asyncio.gather(*(call for _ in range(calls)
                                           for call in (self._trainer(judge), self._verl_like(router))))
            for outcome in ended:
                self.outcomes.add(outcome)

        asyncio.run_coroutine_threadsafe(burst(), loop).result(timeout=120)

    async def _run(self) -> None:
        async with AsyncJudgeClient(self.url, http_transport=self.wire) as judge, \
                httpx.AsyncClient(timeout=httpx.Timeout(None)) as router:
            self._clients = (asyncio.get_running_loop(), judge, router)
            workers = [self._worker(lambda: self._trainer(judge)) for _ in range(WORKERS)]
            workers += [self._worker(lambda: self._verl_like(router)) for _ in range(WORKERS)]
            await asyncio.gather(*workers)

    async def _worker(self, call: Callable[[], Awaitable[Outcome]]) -> None:
        while not self._stop.is_set():
            if not self._sending.is_set():
                await asyncio.sleep(0.05)
                continue
            self._inflight += 1
            try:
                self.outcomes.add(await call())
            finally:
                self._inflight -= 1

    def _prompt(self) -> str:
        return f"Judge answer {next(self._ids)}: is 2+2=4?"

    async def _trainer(self, judge: AsyncJudgeClient) -> Outcome:
        """A reward function on the trainer's client: the score of the verdict, or the typed error."""
        prompt, started = self._prompt(), time.monotonic()
        try:
            verdict = await judge.generate(prompt, sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0})
        except JudgeError as error:
            return Outcome("client", started, time.monotonic(), error=f"{type(error).__name__}: {error}",
                           typed=True, reason=error.reason, retries=dict(error.retries))
        except Exception as error:  # anything untyped breaks the promise, kept verbatim
            text = f"{type(error).__name__}: {error}"
            return Outcome("client", started, time.monotonic(), error=text, unexpected=f"untyped error {text}")
        ended, want = time.monotonic(), expected_text(self.model, prompt)
        found = SCORE.search(verdict.text)
        reward = float(found.group(1)) if found else None
        unexpected = None
        if verdict.text != want or reward is None:
            unexpected = f"verdict {verdict.text!r} for {prompt!r}, the simulator answers {want!r}"
        return Outcome("client", started, ended, reward=reward, retries=dict(verdict.retries),
                       unexpected=unexpected, revision=verdict.revision, held_s=verdict.held_s)

    async def _verl_like(self, router: httpx.AsyncClient) -> Outcome:
        """verl's reward-loop router in front of the pool, and a reward read from its chat answer."""
        prompt, started = self._prompt(), time.monotonic()
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS, "temperature": 0}
        try:
            answer = await verl_router_post(router, f"{self.url}/v1/chat/completions", body)
            found = SCORE.search(answer["choices"][0]["message"]["content"])
            if found is None:
                raise ValueError(f"no score in {answer}")
        except Exception as error:  # in verl, what the reward function raises
            return Outcome("verl-like", started, time.monotonic(), error=f"{type(error).__name__}: {error}")
        return Outcome("verl-like", started, time.monotonic(), reward=float(found.group(1)))


async def verl_router_post(router: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
    """verl's ``NaiveRouter._make_async_request``, on httpx: an HTTP error is raised at once; a timeout,
    a connection error or any other exception is retried after 2 s * 2^attempt, up to 3 attempts."""
    for attempt in range(VERL_ATTEMPTS):
        try:
            response = await router.post(url, json=body)
            response.raise_for_status()
            return response.json()
        except httpx.HTTPStatusError:
            raise
        except (httpx.TimeoutException, httpx.ConnectError):
            pass
        except Exception:
            if attempt == VERL_ATTEMPTS - 1:
                raise
        if attempt < VERL_ATTEMPTS - 1:
            await asyncio.sleep(VERL_RETRY_DELAY_S * 2 ** attempt)
    raise RuntimeError(f"Failed to complete async request to {url} after {VERL_ATTEMPTS} attempts")


@dataclass(frozen=True)
class Crash:
    pod: str
    at: float
    """time.monotonic() just before the SIGKILL."""
    done: float
    """time.monotonic() once the engine is seen dead."""


def _crash_an_engine(cluster: Cluster, namespace: str) -> Crash:
    """SIGKILL the engine of the first published replica (another one serves)."""
    serving = published(cluster.pods(namespace, POOL))
    assert len(serving) >= 2, [p["metadata"]["name"] for p in serving]
    pod = serving[0]
    pid = engine_pid(pod)
    assert pid is not None, pod["status"]
    at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    return Crash(pod["metadata"]["name"], at, dead_by(pid))


def _at_crash(outcome: Outcome, crash: Crash) -> bool:
    """A typed error of a call that was running inside the crashed engine when it died."""
    return (outcome.typed and outcome.reason == ENGINE_DIED and outcome.started <= crash.done
            and outcome.ended >= crash.at)


def _since(moment: float, crash: Crash | None) -> str:
    """``moment`` against the crash's kill and death, so a failure says which side of it it fell on."""
    if crash is None:
        return "with no crash"
    return f"{moment - crash.at:+.3f}s from the kill, {moment - crash.done:+.3f}s from the death"


def _wire_problems(load: Load, outcomes: list[Outcome]) -> list[str]:
    """Resends after an attempt the pool may have judged, and retry counts the wire does not show."""
    problems = []
    for rid, seen in load.wire.attempts.items():
        problems += [f"{rid} sent again after {a!r}: {seen}" for a in seen[:-1] if not RESENDABLE.match(a)]
    resent = sum(len(seen) - 1 for seen in load.wire.attempts.values())
    counted = sum(sum(o.retries.values()) for o in outcomes)
    if resent != counted:
        problems.append(f"the client counted {counted} retries, the wire shows {resent} resends")
    return problems


@contextlib.contextmanager
def _scenario(name: str, marks: list[tuple[str, float, float]]) -> Iterator[None]:
    started = time.monotonic()
    yield
    marks.append((name, started, time.monotonic()))
    print(f"trainer-client-e2e: {name} done in {marks[-1][2] - started:.1f}s", flush=True)


def _failure(outcome: Outcome) -> str:
    """A failed call's exception type, and the HTTP status it raised for (``HTTPStatusError 503``)."""
    kind, _, text = (outcome.error or "").partition(":")
    status = re.search(r"'(\d{3}) ", text) if kind == "HTTPStatusError" else None
    return f"{kind} {status.group(1)}" if status else kind


def _patch(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "genrmpool", POOL, "-n", namespace, "--type", "merge", "-p", json.dumps({"spec": spec}))


def _operation(cluster: Cluster, namespace: str) -> str:
    return str(((cluster.pool(namespace, POOL).get("status") or {}).get("operation") or {}).get("type") or "")


def test_trainer_client_across_every_change_and_verl_like_beside_it(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    began = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(
        POOL, namespace, replicas=1, gateway={"limits": {"maxConnections": MAX_CONNECTIONS}}))
    pool = cluster.wait_serving(namespace, POOL, 1)
    url, model = cluster.service_answering(namespace, POOL), served_model(pool)
    [judge_revision] = {p["metadata"]["labels"][JUDGE_REVISION_LABEL] for p in cluster.pods(namespace, POOL)}
    marks: list[tuple[str, float, float]] = []
    crash: Crash | None = None

    def answered(at_least: int) -> None:
        """Both clients have that many more rewards than now (the pool serves them again)."""
        base = {k: load.outcomes.rewards(k) for k in ("client", "verl-like")}
        wait_for(f"{at_least} more rewards from each client",
                 lambda: all(load.outcomes.rewards(k) >= n + at_least for k, n in base.items()), 90, interval=0.1)

    with Load(url, model) as load:
        answered(5)
        with _scenario("scale-out", marks):
            cluster.scale(namespace, POOL, 2)
            cluster.wait_serving(namespace, POOL, 2)
            answered(5)
        with _scenario("rollout+operator-kill", marks):
            old = cluster.pool(namespace, POOL)["status"]["updateRevision"]
            _patch(cluster, namespace, {"engine": {"env": [{"name": "TRAINER_E2E", "value": "1"}]}})
            wait_for("the rollout to start", lambda: _operation(cluster, namespace) == "Rollout", 30, interval=0.2)
            operator.kill()
            time.sleep(1)
            operator.start()
            wait_for("every replica on the new revision", lambda: (
                (s := cluster.pool(namespace, POOL).get("status") or {}).get("currentRevision") not in (None, old)
                and s.get("updatedReplicas") == 2), 120)
            cluster.wait_serving(namespace, POOL, 2)
            answered(5)
        with _scenario("engine-crash", marks):
            crash = _crash_an_engine(cluster, namespace)
            wait_for(f"{crash.pod} replaced", lambda: crash is not None and crash.pod not in {
                p["metadata"]["name"] for p in cluster.pods(namespace, POOL)}, 90)
            cluster.wait_serving(namespace, POOL, 2)
            answered(5)
        with _scenario("scale-in", marks):
            cluster.scale(namespace, POOL, 1)
            cluster.wait_serving(namespace, POOL, 1)
            answered(5)
        with _scenario("overload-burst", marks):
            load.burst(BURST)
            answered(5)
        with _scenario("scale-to-zero-and-back", marks):
            load.pause()
            _patch(cluster, namespace, {"autoscaling": AUTOSCALING})
            wait_for("the idle pool at zero", lambda: int(cluster.pool(namespace, POOL)["spec"]["replicas"]) == 0
                     and not cluster.pods(namespace, POOL), 90)
            load.resume()
            answered(5)
            cluster.wait_serving(namespace, POOL, 1, timeout=60)
            answered(5)

    client, verl = load.outcomes.of("client"), load.outcomes.of("verl-like")
    typed = [o for o in client if o.typed]
    at_crash = [o for o in typed if crash is not None and _at_crash(o, crash)]
    unexpected = [o.unexpected for o in client if o.unexpected]
    unexpected += [f"typed error not in flight at the engine crash: {o.error} (started {_since(o.started, crash)}, "
                   f"ended {_since(o.ended, crash)})" for o in typed if o not in at_crash]
    wire = _wire_problems(load, client)
    retries = Counter(cause for o in client for cause, n in o.retries.items() for _ in range(n))
    verl_failed = [o for o in verl if o.error]
    verl_causes = Counter(o.error.split(":")[0] for o in verl_failed if o.error)
    verdicts = sum(1 for o in client if o.reward is not None)
    held = [o.held_s for o in client if o.held_s > 0]
    revisions = Counter(o.revision for o in client if o.reward is not None)
    TALLY.trainer_client = (
        f"trainer-client-e2e: verdicts={verdicts} retries={sum(retries.values())} typed_errors={len(typed)} "
        f"unexpected={len(unexpected) + len(wire)} verl_like_failures={len(verl_failed)} "
        f"verl_like_requests={len(verl)} at_crash={len(at_crash)} "
        f"retry_causes={','.join(f'{c}:{n}' for c, n in sorted(retries.items())) or '-'} "
        f"verl_like_causes={','.join(f'{c}:{n}' for c, n in sorted(verl_causes.items())) or '-'} "
        f"held_calls={len(held)} held_max_s={max(held, default=0.0):.2f} revisions={len(revisions)} "
        f"seconds={time.monotonic() - began:.0f}")
    print(f"\n{TALLY.trainer_client}", flush=True)
    by_scenario: dict[str, Counter[str]] = {}
    for name, start, end in marks:
        failed = Counter(_failure(o) for o in verl_failed if start <= o.ended <= end)
        by_scenario[name] = Counter(cause for o in client if start <= o.ended <= end
                                    for cause, n in o.retries.items() for _ in range(n))
        print(f"trainer-client-e2e: {name}: verl-like failures {failed.total()}"
              f"{' (' + ', '.join(f'{c}: {n}' for c, n in sorted(failed.items())) + ')' if failed else ''}, "
              f"client retries {','.join(f'{c}:{n}' for c, n in sorted(by_scenario[name].items())) or '0'}",
              flush=True)
    burst = next((start, end) for name, start, end in marks if name == "overload-burst")
    waking = next((start, end) for name, start, end in marks if name == "scale-to-zero-and-back")
    overloaded_elsewhere = [o for o in client if o.retries.get("overload") and not burst[0] <= o.ended <= burst[1]]
    assert not unexpected, "\n".join(str(u) for u in unexpected[:50])
    assert not wire, "\n".join(wire[:50])
    assert verdicts > 200, f"only {verdicts} verdicts"
    assert all(cause in ("connect", "closed", "unavailable", "overload") for cause in retries), retries
    assert len(at_crash) <= WORKERS, "more calls failed at the crash than the client had in flight"
    assert by_scenario["overload-burst"]["overload"] >= 1, f"no overload retry in the burst: {by_scenario}"
    assert not overloaded_elsewhere, f"overload retries outside the burst: {overloaded_elsewhere[:10]}"
    # A rollout of what does not change answers (the engine's env) keeps the judge revision: every
    # verdict of the run names the one the pods carry.
    assert set(revisions) == {judge_revision}, revisions
    assert held and all(waking[0] <= o.ended <= waking[1] for o in client if o.held_s > 0), \
        "only the calls the activator held while the pool woke say they were held"

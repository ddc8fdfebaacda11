"""The requests the differential test sends to both engines, and what it notes of each answer.

Why a corpus of scenarios: most cases are one request, but a duplicate request id, an abort and a
SIGTERM need a long generation in flight, and the request-series of ``/metrics`` need the traffic
before them; a scenario runs such a sequence once and yields one observation per case. Every case
observes the answer's status, content type and shape (``shapes``), never its timing or text; a few
state a fact both engines must agree on (greedy answers repeat, ``ignore_eos`` yields exactly the
output length asked for).

The engines run one after the other (one real engine is 3.3 GB), each through the whole corpus; the
SIGTERM scenario is last, since it ends the engine. Start-up is not compared: both keep their port
closed while loading, and SGLang's warm-up request after it opens is a known difference of the
simulator's (engine/genrm_sim/README.md, "Timing").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .shapes import fact, shape, stream_shape

Observation = dict[str, Any]

API_KEY = "differential-key"
"""Both engines run with ``--api-key``: one engine start covers the authorised cases and the refusals."""
SERVED = "tiny-judge"
CONTEXT_LENGTH = 2048
"""The tiny model's ``max_position_embeddings``: the real engine's context length, the simulator's flag."""
LONG = 1500
"""Output tokens of a generation that is still in flight when the scenario acts on it (``ignore_eos``)."""
DRAINED = 300
"""Output tokens of the generation a SIGTERMed engine finishes (seconds on either engine: the probes fit)."""
IN_FLIGHT_SECONDS = 60.0
"""How long a long generation may take to show up in ``/v1/loads``, or an aborted one to answer."""
EXIT_SECONDS = 60.0
"""How long a SIGTERMed engine may take to finish its requests and exit (SGLang's watchdog looks every 5 s)."""


@dataclass(frozen=True)
class Engine:
    """One engine under test: where it listens, and its process (for SIGTERM)."""

    url: str
    process: subprocess.Popen[bytes]

    @contextmanager
    def client(self, key: str | None = API_KEY) -> Iterator[httpx.Client]:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=120) as client:
            yield client


SHORT_TEXT = 200
"""A plain-text body up to this long is a fixed message, compared whole; a longer one (an exposition) is not."""


def answer(response: httpx.Response) -> Observation:
    """Status, content type and the body's shape."""
    media = response.headers.get("content-type")
    if media is not None and media.startswith("application/json"):
        body = shape(response.json())
    else:
        body = fact(response.text) if len(response.text) <= SHORT_TEXT else "str"
    return {"status": fact(response.status_code), "content_type": fact(media), "body": body}


def streamed(client: httpx.Client, path: str, body: dict[str, Any]) -> Observation:
    """Status, content type and frame sequence of a streamed request."""
    with client.stream("POST", path, json=body) as response:
        lines = list(response.iter_lines())
        return {"status": fact(response.status_code), "content_type": fact(response.headers.get("content-type")),
                "frames": stream_shape(lines)}


def chat(content: str = "Is 2+2=4? Answer yes or no.", **fields: Any) -> dict[str, Any]:
    """A greedy chat request (as every generation of the corpus: a sampled one may meet the end of
    sequence or not, run by run, and its finish reason is compared)."""
    return {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "Grade:", "max_tokens": 8, "temperature": 0, **fields}


def native(text: object = "Is 2+2=4? Answer yes or no.", **sampling: Any) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0, **sampling}}


@dataclass(frozen=True)
class Ask:
    """A one-request case: method, path and either a JSON body or raw bytes with their headers."""

    method: str
    path: str
    json: Any = None
    raw: bytes | None = None
    headers: dict[str, str] | None = None
    key: str | None = API_KEY

    def observe(self, engine: Engine) -> Observation:
        with engine.client(self.key) as client:
            if self.raw is not None:
                return answer(client.request(self.method, self.path, content=self.raw, headers=self.headers))
            return answer(client.request(self.method, self.path, json=self.json, headers=self.headers))


JSON_TYPE = {"content-type": "application/json"}
ASKS: dict[str, Ask] = {
    # every route the gateway proxies, polls or blocks, and what SGLang answers off its routes
    "route /": Ask("GET", "/"),
    "route /v1/models": Ask("GET", "/v1/models"),
    "route /v1/models/{served}": Ask("GET", f"/v1/models/{SERVED}"),
    "route /v1/models/{unknown}": Ask("GET", "/v1/models/no-such-model"),
    "route /model_info": Ask("GET", "/model_info"),
    "route /get_model_info": Ask("GET", "/get_model_info"),
    "route /server_info": Ask("GET", "/server_info"),
    "route /get_server_info": Ask("GET", "/get_server_info"),
    "route /health": Ask("GET", "/health"),
    "route /health_generate": Ask("GET", "/health_generate"),
    "route /ready": Ask("GET", "/ready"),
    "route /ping": Ask("GET", "/ping"),
    "route /v1/loads": Ask("GET", "/v1/loads"),
    "route /v1/loads?include=core": Ask("GET", "/v1/loads?include=core"),
    "route /v1/loads?include=unknown": Ask("GET", "/v1/loads?include=everything"),
    "route GET /flush_cache": Ask("GET", "/flush_cache"),
    "route POST /flush_cache": Ask("POST", "/flush_cache"),
    "route /metrics": Ask("GET", "/metrics"),
    "route unknown path": Ask("GET", "/no-such-route"),
    "route POST /health": Ask("POST", "/health"),
    "route GET /generate": Ask("GET", "/generate"),
    # generation on each API
    "generate text": Ask("POST", "/generate", native()),
    "generate input_ids": Ask("POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}),
    "generate batch": Ask("POST", "/generate", native(["first prompt", "second prompt"])),
    "generate default length": Ask("POST", "/generate", {"text": "Grade this answer.",
                                                         "sampling_params": {"temperature": 0}}),
    "chat": Ask("POST", "/v1/chat/completions", chat()),
    "chat unknown model": Ask("POST", "/v1/chat/completions", chat(model="no-such-model")),
    "completions": Ask("POST", "/v1/completions", completion()),
    "completions unknown model": Ask("POST", "/v1/completions", completion(model="no-such-model")),
    "classify on a generative model": Ask("POST", "/classify", {"text": "x"}),
    "v1/classify on a generative model": Ask("POST", "/v1/classify", {"model": SERVED, "input": "x"}),
    # what /generate refuses
    "generate malformed JSON": Ask("POST", "/generate", raw=b'{"text": ', headers=JSON_TYPE),
    "generate empty body": Ask("POST", "/generate", raw=b"", headers=JSON_TYPE),
    "generate body not an object": Ask("POST", "/generate", [1, 2]),
    "generate with a form content type": Ask("POST", "/generate", raw=b'{"text": "x"}',
                                             headers={"content-type": "application/x-www-form-urlencoded"}),
    "generate without a content type": Ask("POST", "/generate", raw=b'{"text": "x"}', headers={}),
    "chat with a spaced content type": Ask("POST", "/v1/chat/completions", raw=json.dumps(chat()).encode(),
                                           headers={"content-type": "application/json ;charset=utf-8"}),
    "generate missing prompt": Ask("POST", "/generate", {"sampling_params": {"max_new_tokens": 2}}),
    "generate text of a wrong type": Ask("POST", "/generate", {"text": 5}),
    "generate input_ids of a wrong type": Ask("POST", "/generate", {"input_ids": "1 2 3"}),
    "generate rid of a wrong type": Ask("POST", "/generate", {"text": "x", "rid": 7}),
    "generate sampling_params not an object": Ask("POST", "/generate", {"text": "x", "sampling_params": "greedy"}),
    "generate unknown sampling key": Ask("POST", "/generate", native(top_q=0.5)),
    "generate sampling value of a wrong type": Ask("POST", "/generate", native(max_new_tokens=1.5)),
    "generate temperature out of range": Ask("POST", "/generate", native(temperature=-1)),
    "generate top_p out of range": Ask("POST", "/generate", native(top_p=0)),
    "generate top_k out of range": Ask("POST", "/generate", native(top_k=0)),
    "generate max_new_tokens out of range": Ask("POST", "/generate", native(max_new_tokens=-1)),
    "generate prompt beyond the context": Ask("POST", "/generate", native(" ".join(["word"] * CONTEXT_LENGTH))),
    "generate output beyond the context": Ask("POST", "/generate", native(max_new_tokens=CONTEXT_LENGTH * 2)),
    # what the OpenAI routes refuse
    "chat without JSON content type": Ask("POST", "/v1/chat/completions", raw=json.dumps(chat()).encode(),
                                          headers={"content-type": "text/plain"}),
    "completions without JSON content type": Ask("POST", "/v1/completions", raw=b'{"prompt": "x"}',
                                                 headers={"content-type": "text/plain"}),
    "chat malformed JSON": Ask("POST", "/v1/chat/completions", raw=b'{"model": ', headers=JSON_TYPE),
    "chat missing messages": Ask("POST", "/v1/chat/completions", {"model": SERVED}),
    "chat empty messages": Ask("POST", "/v1/chat/completions", {"model": SERVED, "messages": []}),
    "chat temperature out of range": Ask("POST", "/v1/chat/completions", chat(temperature=-1)),
    "chat top_p out of range": Ask("POST", "/v1/chat/completions", chat(top_p=0)),
    "chat max_tokens of a wrong type": Ask("POST", "/v1/chat/completions", chat(max_tokens="many")),
    "chat output beyond the context": Ask("POST", "/v1/chat/completions", chat(max_tokens=CONTEXT_LENGTH * 2)),
    "completions missing prompt": Ask("POST", "/v1/completions", {"model": SERVED}),
    # /abort_request's own refusals
    "abort empty body": Ask("POST", "/abort_request", raw=b"", headers=JSON_TYPE),
    "abort malformed JSON": Ask("POST", "/abort_request", raw=b"{", headers=JSON_TYPE),
    "abort unknown rid": Ask("POST", "/abort_request", {"rid": "no-such-request"}),
    # --api-key: what needs the key and how a request without it is refused
    "api key missing": Ask("POST", "/generate", native(), key=None),
    "api key wrong": Ask("POST", "/generate", native(), key="not-the-key"),
    "api key missing on /v1/models": Ask("GET", "/v1/models", key=None),
    "api key missing on /health": Ask("GET", "/health", key=None),
    "api key missing on /ready": Ask("GET", "/ready", key=None),
    "api key missing on /metrics": Ask("GET", "/metrics", key=None),
}

STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "stream generate": ("/generate", {**native(), "stream": True}),
    "stream generate batch": ("/generate", {**native(["first prompt", "second prompt"]), "stream": True}),
    "stream generate refused": ("/generate", {**native(top_p=0), "stream": True}),
    "stream chat": ("/v1/chat/completions", chat(stream=True)),
    "stream chat refused": ("/v1/chat/completions", chat(stream=True, top_p=0)),
    "stream chat with usage": ("/v1/chat/completions", chat(stream=True, stream_options={"include_usage": True})),
    "stream completions": ("/v1/completions", completion(stream=True)),
    "stream completions with usage": ("/v1/completions", completion(stream=True,
                                                                    stream_options={"include_usage": True})),
}


def greedy_repeats(engine: Engine) -> dict[str, Observation]:
    """Greedy decoding is a function of the prompt: two identical requests get identical token ids
    (on the real engine bit for bit; a property, and the simulator must keep it)."""
    body = native("Which answer is better, A or B?", max_new_tokens=24)
    with engine.client() as client:
        first, second = (client.post("/generate", json=body).json() for _ in range(2))
    return {"greedy answers repeat": {"output_ids": fact(first.get("output_ids") == second.get("output_ids")),
                                      "text": fact(first["text"] == second["text"])}}


def exact_lengths(engine: Engine) -> dict[str, Observation]:
    """With ``ignore_eos`` the output is exactly ``max_new_tokens`` long, on every API."""
    with engine.client() as client:
        gen = client.post("/generate", json=native(max_new_tokens=16, ignore_eos=True)).json()
        openai = client.post("/v1/chat/completions", json=chat(max_tokens=16, ignore_eos=True)).json()
    return {"ignore_eos gives the length asked for": {
        "generate": fact(gen["meta_info"]["completion_tokens"]), "output_ids": fact(len(gen.get("output_ids", []))),
        "finish_reason": shape(gen["meta_info"]["finish_reason"]),
        "chat": fact(openai["usage"]["completion_tokens"]), "chat_finish_reason": fact(openai["choices"][0][
            "finish_reason"])}}


def _running(client: httpx.Client) -> int:
    load = client.get("/v1/loads").json()["loads"][0]
    return int(load["num_running_reqs"]) + int(load["num_waiting_reqs"])


def _wait_in_flight(client: httpx.Client) -> None:
    deadline = time.monotonic() + IN_FLIGHT_SECONDS
    while _running(client) == 0:
        if time.monotonic() > deadline:
            raise AssertionError("the long generation never showed up in /v1/loads")
        time.sleep(0.05)


@contextmanager
def in_flight(client: httpx.Client, rid: str, path: str = "/generate") -> Iterator[Future[httpx.Response]]:
    """A long non-streamed generation under ``rid`` while the block runs; aborted at its end if the
    block did not abort it, so it never outlives the scenario."""
    body = native(max_new_tokens=LONG, ignore_eos=True) if path == "/generate" else chat(max_tokens=LONG,
                                                                                           ignore_eos=True)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.post, path, json={**body, "rid": rid})
        _wait_in_flight(client)
        try:
            yield future
        finally:
            client.post("/abort_request", json={"rid": rid})


def in_flight_requests(engine: Engine) -> dict[str, Observation]:
    """A request id still in flight is refused on each API; ``/flush_cache`` refuses a busy engine;
    an aborted request answers 200 with what it had, finish reason ``abort``."""
    seen: dict[str, Observation] = {}
    with engine.client() as client:
        with in_flight(client, "diff-inflight") as long:
            seen["duplicate rid generate"] = answer(client.post("/generate", json={**native(), "rid": "diff-inflight"}))
            seen["duplicate rid stream generate"] = streamed(client, "/generate", {
                **native(), "rid": "diff-inflight", "stream": True})
            seen["duplicate rid chat"] = answer(client.post("/v1/chat/completions", json={
                **chat(), "rid": "diff-inflight"}))
            seen["route /flush_cache while busy"] = answer(client.post("/flush_cache"))
            seen["route /v1/loads while busy"] = answer(client.get("/v1/loads"))
            seen["abort in-flight rid"] = answer(client.post("/abort_request", json={"rid": "diff-inflight"}))
            seen["aborted generate"] = answer(long.result(IN_FLIGHT_SECONDS))
        with in_flight(client, "diff-chat", "/v1/chat/completions") as long:
            client.post("/abort_request", json={"rid": "diff-chat"})
            seen["aborted chat"] = answer(long.result(IN_FLIGHT_SECONDS))
        seen["aborted stream generate"] = _aborted_stream(client)
    return seen


def _aborted_stream(client: httpx.Client) -> Observation:
    """A streamed generation aborted after its second chunk (it has decoded then): how its stream ends."""
    body = {**native(max_new_tokens=LONG, ignore_eos=True), "rid": "diff-stream", "stream": True}
    with client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        first = _frames(lines, 2)
        client.post("/abort_request", json={"rid": "diff-stream"})
        return {"status": fact(response.status_code), "frames": stream_shape([*first, *lines])}


def _frames(lines: Iterator[str], count: int) -> list[str]:
    """The next ``count`` data frames of a stream (the others skipped)."""
    return [next(line for line in lines if line.startswith("data:")) for _ in range(count)]


def metrics(engine: Engine) -> dict[str, Observation]:
    """The ``sglang:`` families (after the traffic before), each with its type and label names."""
    with engine.client() as client:
        text = client.get("/metrics").text
    families: dict[str, Observation] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("sglang:") and not family.name.endswith("_created"):
            labels = sorted({label for sample in family.samples for label in sample.labels} - {"le"})
            families[family.name] = {"type": fact(family.type), "labels": fact(labels)}
    return {"metrics series": families}


def sigterm(engine: Engine) -> dict[str, Observation]:
    """SIGTERM to the engine's first process (as a kubelet sends it) with a generation streaming: what
    the probes and a new request get while it drains, how the stream ends, and that it exits."""
    body = {**native(max_new_tokens=DRAINED, ignore_eos=True), "stream": True}
    with engine.client() as client, client.stream("POST", "/generate", json=body) as response:
        lines = response.iter_lines()
        first = _frames(lines, 1)
        os.kill(engine.process.pid, signal.SIGTERM)
        draining = {path: fact(client.get(path).status_code) for path in ("/health", "/ready", "/v1/models")}
        draining["/generate"] = fact(client.post("/generate", json=native()).status_code)
        frames = stream_shape([*first, *lines])
    returncode = engine.process.wait(EXIT_SECONDS)
    return {"sigterm": {"while draining": draining, "in-flight stream": frames, "exit status": fact(returncode)}}


def _streams(engine: Engine) -> dict[str, Observation]:
    with engine.client() as client:
        return {case: streamed(client, path, body) for case, (path, body) in STREAMS.items()}


Scenario = Callable[[Engine], dict[str, Observation]]
SCENARIOS: tuple[tuple[tuple[str, ...], Scenario], ...] = (
    (tuple(ASKS), lambda engine: {case: ask.observe(engine) for case, ask in ASKS.items()}),
    (tuple(STREAMS), _streams),
    (("greedy answers repeat",), greedy_repeats),
    (("ignore_eos gives the length asked for",), exact_lengths),
    (("duplicate rid generate", "duplicate rid stream generate", "duplicate rid chat",
      "route /flush_cache while busy", "route /v1/loads while busy", "abort in-flight rid", "aborted generate",
      "aborted chat", "aborted stream generate"), in_flight_requests),
    (("metrics series",), metrics),
    (("sigterm",), sigterm),
)
"""In order: ``metrics`` after the traffic, ``sigterm`` last."""
CASES = tuple(case for cases, _ in SCENARIOS for case in cases)



def observe(engine: Engine) -> dict[str, Observation]:
    """Every case's observation of ``engine``, which has exited at the end."""
    seen: dict[str, Observation] = {}
    for cases, scenario in SCENARIOS:
        observed = scenario(engine)
        assert set(observed) == set(cases), f"{scenario}: {sorted(set(observed) ^ set(cases))}"
        seen.update(observed)
    return seen


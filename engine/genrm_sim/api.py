"""The simulator's HTTP surface: SGLang's routes, status codes and JSON shapes.

Why FastAPI with hand-encoded bodies: SGLang itself is a FastAPI app, so connection handling,
keep-alive and streaming framing match; encoding JSON directly keeps the per-request cost low
enough for the gateway benchmark to measure the gateway rather than the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.message
import json
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.background import BackgroundTask

from genrm_sim import contract, info
from genrm_sim.answers import Answer, AnswerKey, SamplingParams, count_prompt_tokens, judge_answer, reward_score
from genrm_sim.auth import ApiKeyMiddleware
from genrm_sim.config import SimConfig
from genrm_sim.dialects import (
    JSON,
    BadRequest,
    Call,
    ChatCompletions,
    Completions,
    Dialect,
    EarlyRefusal,
    NativeGenerate,
    Outcome,
    SchemaError,
    classify_response,
    native_error,
    openai_error,
    parse_classify,
    require,
    token_id,
)
from genrm_sim.metrics import SimMetrics
from genrm_sim.model import DuplicateRequest, Job, Scheduler

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
# SGLang's /health generation: one greedy token for input_ids=[0], left out of the request metrics.
_HEALTH_PROBE = judge_answer(AnswerKey("health", True), [0], SamplingParams(temperature=0.0, max_new_tokens=1), 0)
REQUEST_STATE_WAIT_SECONDS = 4.0
"""SGLang's ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``: how often a waiting non-streamed request looks
for a disconnected client."""
_FORWARD_PASS = Answer((), "stop")
"""A classification: one forward pass (the time to first token), no generated tokens."""
_NOT_JSON = ("[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' "
             "is allowed\", 'type': 'value_error'}]")


def _json(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(body, status, media_type="application/json")


def _error(status: int, message: str, kind: str) -> Response:
    return _json({"error": {"message": message, "type": kind, "code": status}}, status)


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _is_json(request: Request) -> bool:
    """SGLang's ``validate_json_request`` of the OpenAI routes: the media type exactly, unstripped."""
    return request.headers.get("content-type", "").lower().split(";", 1)[0] == "application/json"


def _parsed_as_json(request: Request) -> bool:
    """FastAPI (0.165, strict content type by default, which SGLang keeps) parses a body as JSON only with
    a JSON content type (``application/json``, ``application/*+json``); a body without one, or with
    another, reaches the route's model as bytes, which it refuses."""
    media = request.headers.get("content-type")
    if not media:
        return False
    message = email.message.Message()
    message["content-type"] = media
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


async def json_object(request: Request) -> dict[str, Any]:
    """A request's JSON object, or FastAPI's validation error (no body, malformed JSON, not an object,
    a body without a JSON content type, such as the form type ``curl -d`` sends)."""
    raw = await request.body()
    require(bool(raw), "body", "Field required")
    require(_parsed_as_json(request), "body", "an object (the body's content type is not JSON)")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise SchemaError(f"1 validation error: body: JSON decode error: {exc}") from None
    require(isinstance(body, dict), "body", "an object")
    return dict(body)


class Simulator:
    """Binds the scheduler, the answer function and the dialects to one configuration."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics(config)
        self.scheduler = Scheduler(config, self.metrics)
        self.metrics.watch(self.scheduler)
        # The weights decide an answer, not the name clients use for them: another model path is
        # another judge (a judge switch must show in the verdicts), a new served name is not.
        self._key = AnswerKey(config.model_path, config.enable_deterministic_inference, config.perturb)
        self._failures = random.Random(config.random_seed)
        self.health_timeout = contract.load().health_check_timeout_seconds
        """SGLang's HEALTH_CHECK_TIMEOUT: how long /health waits for output before answering 503."""

    def endpoint(self, dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
        """A route handler that answers in ``dialect``."""

        async def generate(request: Request) -> Response:
            return await self.handle(request, dialect)

        return generate

    async def _body(self, request: Request) -> dict[str, Any]:
        """The JSON object of a request, with FastAPI's refusals before SGLang's route runs
        (``json_only`` routes need the header; an absent, malformed or non-object body)."""
        if contract.load().route(request.url.path).json_only and not _is_json(request):
            raise SchemaError(_NOT_JSON)
        return await json_object(request)

    async def handle(self, request: Request, dialect: Dialect) -> Response:
        body: dict[str, Any] | None = None
        try:
            body = await self._body(request)
            call = dialect.parse(body, self.config.served_model_name, self.config.enable_deterministic_inference)
            if not self.config.is_generation:
                raise BadRequest("This model is not a generation model: it serves /classify (genrm-sim)")
            calls = tuple(self._within_context(c) for c in call.members or (call,))
        except (ValueError, BadRequest) as exc:
            return self._refusal(dialect, exc, body)
        if self.config.error_rate and self._failures.random() < self.config.error_rate:
            return _error(500, "injected engine failure", "InternalServerError")
        priority = self._priority(body)
        jobs = [Job(rid=c.rid or uuid.uuid4().hex, prompt_tokens=count_prompt_tokens(c.prompt),
                    answer=judge_answer(self._key, c.prompt, c.params, secrets.randbits(64)), stream=c.stream,
                    priority=priority)
                for c in calls]
        try:
            self._submit(jobs)
        except DuplicateRequest as exc:
            return self._refusal(dialect, exc, body)
        if call.stream:
            return StreamingResponse(self._stream(dialect, calls, jobs, batch=bool(call.members)),
                                     media_type="text/event-stream", background=BackgroundTask(self._release, jobs))
        texts = await self._answers(request, jobs)
        responses = [dialect.response(c, self._outcome(job, text, finished=True))
                     for c, job, text in zip(calls, jobs, texts, strict=True)]
        return _json(responses if call.members else responses[0])

    @staticmethod
    def _refusal(dialect: Dialect, exc: ValueError, body: dict[str, Any] | None) -> Response:
        """A 400, or where SGLang has already opened the stream when it refuses (its native route
        past the schema check), a 200 stream of one error event, then ``[DONE]``."""
        if dialect.errors_in_stream and body is not None and body.get("stream") is True \
                and not isinstance(exc, EarlyRefusal):
            event = {"error": {"message": str(exc), "type": "invalid_request_error", "code": 400, "retryable": False}}
            return StreamingResponse(iter([_sse(event), b"data: [DONE]\n\n"]), media_type="text/event-stream")
        return _json(dialect.error(exc), 400)

    def _within_context(self, call: Call) -> Call:
        """SGLang's ``_validate_one_request``: a prompt of at least the context length, or (when the
        client asked for an output length) prompt and output longer than it, is refused, or with
        ``--allow-auto-truncate`` the output length is cut to fit."""
        context = self.config.context_length
        prompt = count_prompt_tokens(call.prompt)
        if prompt >= context:
            if not self.config.allow_auto_truncate:
                raise BadRequest(f"The input ({prompt} tokens) is longer than the model's context length "
                                 f"({context} tokens).")
            prompt = context
        requested = call.requested_max_new_tokens
        if requested is None or requested + prompt <= context:
            return call
        if self.config.allow_auto_truncate:
            return dataclasses.replace(call, params=dataclasses.replace(call.params,
                                                                        max_new_tokens=max(0, context - prompt)))
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested "
            f"a total of {requested + prompt} tokens: {prompt} tokens from the input messages and {requested} tokens "
            f"for the completion. Please reduce the number of tokens in the input messages or the completion to fit "
            f"within the limit.")

    def _priority(self, body: dict[str, Any]) -> int | None:
        """The request's priority; SGLang's ``_set_default_priority`` fills in
        ``--default-priority-value`` only under priority scheduling."""
        given = body.get("priority")
        priority = given if isinstance(given, int) and not isinstance(given, bool) else None
        if priority is None and self.config.enable_priority_scheduling:
            return self.config.default_priority_value
        return priority

    def _submit(self, jobs: list[Job]) -> None:
        """Register every job of a request, or none (a duplicate id refuses the whole request)."""
        try:
            for job in jobs:
                self.scheduler.submit(job)
        except DuplicateRequest:
            self._release(jobs)
            raise

    def _release(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.scheduler.release(job)

    async def _answers(self, request: Request, jobs: list[Job]) -> list[str]:
        """The jobs' whole texts. As SGLang's tokenizer manager does for a non-streamed request,
        every ``REQUEST_STATE_WAIT_SECONDS`` without an answer it asks whether the client left, and
        then aborts each job's id (by prefix, as every abort): a client gone without an explicit
        ``/abort_request`` (a batch through the gateway) stops costing the engine within seconds."""
        tasks = [asyncio.ensure_future(self._text(job)) for job in jobs]
        try:
            while True:
                _, pending = await asyncio.wait(tasks, timeout=REQUEST_STATE_WAIT_SECONDS)
                if not pending:
                    return [task.result() for task in tasks]
                if await request.is_disconnected():
                    for job in jobs:
                        self.scheduler.abort(job.rid)
        finally:
            for task in tasks:
                task.cancel()

    async def _text(self, job: Job) -> str:
        return "".join([token async for token in self.scheduler.generate(job)])

    async def classify(self, request: Request, openai: bool) -> Response:
        """SGLang's reward-model route: one forward pass per input, scores instead of text."""
        try:
            body = await self._body(request)
            call = parse_classify(body, self.config.served_model_name, openai)
            if self.config.is_generation:
                raise BadRequest("This model does not appear to be an embedding model by default. Please add "
                                 "`--is-embedding` when launching the server or try another model.")
        except (ValueError, BadRequest) as exc:
            return _json(openai_error(exc) if openai else native_error(exc), 400)
        if call.batch and call.rid is not None:
            # SGLang's EmbeddingReqInput asserts "The rid should be a list." for a batch: an unhandled 500.
            return Response("Internal Server Error", 500, media_type="text/plain")
        rids = list(call.rids) or [call.rid or uuid.uuid4().hex for _ in call.inputs]
        jobs = [Job(rid=rid, prompt_tokens=count_prompt_tokens(item), answer=_FORWARD_PASS)
                for rid, item in zip(rids, call.inputs, strict=True)]
        try:
            for job in jobs:
                self.scheduler.submit(job)
        except DuplicateRequest as exc:
            for job in jobs:
                self.scheduler.release(job)
            return _json({"error": {"message": str(exc)}}, 400)
        await asyncio.gather(*(self._run(job) for job in jobs))
        scores = [reward_score(self._key, item, secrets.randbits(64)) for item in call.inputs]
        return _json(classify_response(call, [j.rid for j in jobs], scores, [j.prompt_tokens for j in jobs], openai))

    async def _run(self, job: Job) -> None:
        async for _ in self.scheduler.generate(job):
            pass

    async def _stream(self, dialect: Dialect, calls: tuple[Call, ...], jobs: list[Job],
                      batch: bool) -> AsyncIterator[bytes]:
        """SSE events, then ``[DONE]``. A batch's members stream interleaved as their chunks come,
        each chunk with its member's ``index`` (SGLang's ``_stream_batch_responses``)."""
        if not batch:
            async for chunk in self._events(dialect, calls[0], jobs[0]):
                yield _sse(chunk)
            yield b"data: [DONE]\n\n"
            return
        queue: asyncio.Queue[JSON | None] = asyncio.Queue()

        async def member(index: int, call: Call, job: Job) -> None:
            try:
                async for chunk in self._events(dialect, call, job):
                    queue.put_nowait(chunk | {"index": index})
            finally:
                queue.put_nowait(None)

        tasks = [asyncio.ensure_future(member(i, c, j)) for i, (c, j) in enumerate(zip(calls, jobs, strict=True))]
        try:
            for _ in tasks:
                while (event := await queue.get()) is not None:
                    yield _sse(event)
            yield b"data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()

    async def _events(self, dialect: Dialect, call: Call, job: Job) -> AsyncIterator[JSON]:
        """One request's stream chunks: the dialect's opening ones, one per token, its closing ones.
        Where the dialect reports the finish in the last token's chunk, that chunk carries it;
        otherwise, and after an abort, a closing chunk does."""
        text, finished, opened = "", False, False
        async for token in self.scheduler.generate(job):
            if not opened:
                for chunk in dialect.opening_chunks(call, self._outcome(job, text, finished=False)):
                    yield chunk
                opened = True
            text += token
            finished = dialect.finish_in_last_token and job.generated == len(job.answer.tokens)
            yield dialect.chunk(call, self._outcome(job, text, finished=finished), token)
        for chunk in dialect.closing_chunks(call, self._outcome(job, text, finished=True), reported=finished):
            yield chunk

    @staticmethod
    def _outcome(job: Job, text: str, finished: bool) -> Outcome:
        reason = ("abort" if job.aborted.is_set() else job.answer.finish_reason) if finished else None
        ids = tuple(token_id(token) for token in job.answer.tokens[:job.generated])
        return Outcome(job.rid, text, reason, job.prompt_tokens, job.generated, ids, job.timeline)

    @property
    def healthy(self) -> bool:
        """SGLang's ``is_healthy``: started, not shutting down, last health check passed."""
        return self.scheduler.warm and not self.scheduler.exiting and not self.scheduler.unhealthy

    async def health(self) -> Response:
        """SGLang's ``/health`` (= ``/health_generate``): 503 while starting or shutting down, else a
        one-token generation through the scheduler, checked once a second until any request produces
        output (200) or the health-check timeout passes (503, and the engine counts as unhealthy)."""
        if self.scheduler.exiting or not self.scheduler.warm:
            return Response(status_code=503)
        tic = time.monotonic()
        probe = Job(rid=f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}", prompt_tokens=1, answer=_HEALTH_PROBE,
                    log_metrics=False)
        self.scheduler.submit(probe)
        task = asyncio.ensure_future(self._run(probe))
        try:
            while time.monotonic() < tic + self.health_timeout:
                await asyncio.sleep(1.0)
                if self.scheduler.last_output > tic:
                    self.scheduler.unhealthy = False
                    return Response(status_code=200)
            self.scheduler.unhealthy = True
            return Response(status_code=503)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.scheduler.release(probe)


def _not_modelled(path: str) -> Callable[[], Awaitable[Response]]:
    async def answer() -> Response:
        return _json({"error": {"message": f"genrm-sim does not model SGLang's {path}"}}, 501)

    return answer


def create_app(config: SimConfig) -> tuple[FastAPI, Simulator]:
    """The ASGI app and the simulator state it serves (the CLI needs the latter for SIGTERM).

    It answers every route of the pinned SGLang's contract: the ones this project uses as SGLang
    does, the rest with 501, so "SGLang has no such route" (404) stays distinguishable.
    """
    sim = Simulator(config)
    app = FastAPI(title="genrm-sim", docs_url=None, redoc_url=None, openapi_url=None)
    served = (config.weight_version, config.enable_metrics)
    dialects: dict[str, tuple[Dialect, list[str]]] = {
        "/generate": (NativeGenerate(*served), ["POST", "PUT"]),
        "/v1/chat/completions": (ChatCompletions(*served), ["POST"]),
        "/v1/completions": (Completions(*served), ["POST"]),
    }
    for path, (dialect, methods) in dialects.items():
        app.add_api_route(path, sim.endpoint(dialect), methods=methods)

    @app.api_route("/classify", methods=["POST", "PUT"])
    async def classify(request: Request) -> Response:
        return await sim.classify(request, openai=False)

    @app.post("/v1/classify")
    async def v1_classify(request: Request) -> Response:
        return await sim.classify(request, openai=True)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return await sim.health()

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if sim.healthy else 503)

    @app.get("/ping")
    async def ping() -> Response:
        return Response(status_code=200 if sim.healthy else 503)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> Response:
        return _json(info.model_info(config))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> Response:
        return _json(info.server_info(config, sim.metrics))

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [info.model_card(config)]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> Response:
        if model != config.served_model_name:
            return _json({"error": {"message": f"The model '{model}' does not exist", "type": "invalid_request_error",
                                    "param": "model", "code": "model_not_found"}}, 404)
        return _json(info.model_card(config))

    @app.get("/v1/loads")
    async def loads(include: str | None = None) -> Response:
        try:
            return _json(info.loads(config, sim.scheduler, sim.metrics, include))
        except ValueError:  # raised past SGLang's handler of it (``to_dict``, out of the ``try``): a plain 500
            return PlainTextResponse("Internal Server Error", 500)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        """SGLang's radix-cache flush, refused while requests run (the simulator has no cache to flush)."""
        if sim.scheduler.pending:
            return Response("Flush cache failed.\n", 400)
        return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                        "waiting requests, the operation will not be performed.)\n", 200)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return _json("SGLang is running")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """SGLang's ``AbortReq`` body (a validation error unless it is one), then the abort."""
        try:
            body = await json_object(request)
            rid, abort_all = body.get("rid"), body.get("abort_all", False)
            require(rid is None or isinstance(rid, str), "rid", "a string")
            require(isinstance(abort_all, bool), "abort_all", "a boolean")
        except SchemaError as exc:
            return _json(openai_error(exc), 400)
        sim.scheduler.abort(rid, abort_all)
        return Response(status_code=200)

    if config.enable_metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(sim.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)

    modelled = {(route.path, method) for route in app.routes if isinstance(route, APIRoute)
                for method in route.methods or ()}
    for route in contract.load().routes:
        methods = [m for m in route.methods if (route.path, m) not in modelled and m != "WEBSOCKET"]
        if methods and not route.conditional:
            app.add_api_route(route.path, _not_modelled(route.path), methods=methods)
    return app, sim

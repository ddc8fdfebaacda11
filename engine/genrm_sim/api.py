"""The simulator's HTTP surface: SGLang's routes, status codes and JSON shapes.

Why FastAPI with hand-encoded bodies: SGLang itself is a FastAPI app, so connection handling,
keep-alive and streaming framing match; encoding JSON directly keeps the per-request cost low
enough for the gateway benchmark to measure the gateway rather than the simulator.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from genrm_sim.answers import AnswerKey, SamplingParams, count_prompt_tokens, judge_answer
from genrm_sim.config import SimConfig
from genrm_sim.dialects import (
    BadRequest,
    Call,
    ChatCompletions,
    Completions,
    Dialect,
    NativeGenerate,
    Outcome,
)
from genrm_sim.metrics import SimMetrics
from genrm_sim.model import Job, Scheduler

SIM_VERSION = "0.1.0-genrm-sim"
# SGLang's /health_generate probe: one greedy token for input_ids=[0].
_HEALTH_PROBE = judge_answer(AnswerKey("health", 0), [0], SamplingParams(temperature=0.0, max_new_tokens=1))


def _json(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(body, status, media_type="application/json")


def _error(status: int, message: str, kind: str) -> Response:
    return _json({"error": {"message": message, "type": kind, "code": status}}, status)


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class Simulator:
    """Binds the scheduler, the answer function and the dialects to one configuration."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics(config)
        self.scheduler = Scheduler(config, self.metrics)
        self.metrics.watch(self.scheduler)
        self._key = AnswerKey(config.served_model_name, config.random_seed, config.perturb)
        self._failures = random.Random(config.random_seed)

    def endpoint(self, dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
        """A route handler that answers in ``dialect``."""

        async def generate(request: Request) -> Response:
            return await self.handle(request, dialect)

        return generate

    async def handle(self, request: Request, dialect: Dialect) -> Response:
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            call = dialect.parse(body, self.config.served_model_name,
                                 self.config.enable_deterministic_inference)
        except (ValueError, BadRequest) as exc:
            return _error(400, str(exc), "BadRequestError")
        if self.config.error_rate and self._failures.random() < self.config.error_rate:
            return _error(500, "injected engine failure", "InternalServerError")
        job = Job(
            rid=call.rid or secrets.token_hex(16),
            prompt_tokens=count_prompt_tokens(call.prompt),
            answer=judge_answer(self._key, call.prompt, call.params),
        )
        if call.stream:
            return StreamingResponse(self._stream(dialect, call, job), media_type="text/event-stream")
        tokens = [token async for token in self.scheduler.generate(job)]
        return _json(dialect.response(call, self._outcome(job, "".join(tokens), finished=True)))

    async def _stream(self, dialect: Dialect, call: Call, job: Job) -> AsyncIterator[bytes]:
        text = ""
        async for token in self.scheduler.generate(job):
            text += token
            yield _sse(dialect.chunk(call, self._outcome(job, text, finished=False), token))
        for chunk in dialect.closing_chunks(call, self._outcome(job, text, finished=True)):
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _outcome(job: Job, text: str, finished: bool) -> Outcome:
        reason = ("abort" if job.aborted.is_set() else job.answer.finish_reason) if finished else None
        return Outcome(job.rid, text, reason, job.prompt_tokens, job.generated)

    def health(self) -> Response:
        if self.scheduler.exiting or not self.scheduler.warm:
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.config.model_path,
            "tokenizer_path": self.config.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.config.revision or "default",
        }

    def server_info(self) -> dict[str, Any]:
        return self.config.server_args() | {
            "internal_states": [{"dp_rank": 0, "num_running_reqs": self.scheduler.running}],
            "version": SIM_VERSION,
        }

    def load(self) -> list[dict[str, int]]:
        """SGLang's per-DP-rank load; ``num_reqs`` counts running and waiting requests."""
        scheduler = self.scheduler
        return [{
            "dp_rank": 0,
            "num_reqs": scheduler.running + scheduler.queued,
            "num_waiting_reqs": scheduler.queued,
            "num_tokens": scheduler.used_tokens,
        }]


def create_app(config: SimConfig) -> tuple[FastAPI, Simulator]:
    """The ASGI app and the simulator state it serves (the CLI needs the latter for SIGTERM)."""
    sim = Simulator(config)
    app = FastAPI(title="genrm-sim", docs_url=None, redoc_url=None, openapi_url=None)
    dialects: dict[str, Dialect] = {
        "/generate": NativeGenerate(),
        "/v1/chat/completions": ChatCompletions(),
        "/v1/completions": Completions(),
    }
    for path, dialect in dialects.items():
        app.add_api_route(path, sim.endpoint(dialect), methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        return sim.health()

    @app.get("/health_generate")
    async def health_generate() -> Response:
        response = sim.health()
        if response.status_code == 200:
            probe = Job(rid=f"health-{secrets.token_hex(8)}", prompt_tokens=1, answer=_HEALTH_PROBE)
            async for _ in sim.scheduler.generate(probe):
                pass
        return response

    @app.get("/get_model_info")
    async def get_model_info() -> Response:
        return _json(sim.model_info())

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> Response:
        return _json(sim.server_info())

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [{
            "id": config.served_model_name, "object": "model", "created": 0,
            "owned_by": "sglang", "root": config.model_path, "max_model_len": config.max_total_tokens}]})

    @app.get("/get_load")
    async def get_load() -> Response:
        return _json(sim.load())

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return _error(400, "the body must be JSON", "BadRequestError")
        rid = body.get("rid") if isinstance(body, dict) else None
        abort_all = bool(body.get("abort_all")) if isinstance(body, dict) else False
        sim.scheduler.abort(rid if isinstance(rid, str) else None, abort_all)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        if not config.enable_metrics:
            return _error(404, "metrics are disabled; pass --enable-metrics", "NotFoundError")
        return Response(sim.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app, sim

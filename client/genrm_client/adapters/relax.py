"""Relax: ``--custom-rm-path genrm_client.adapters.relax.rm``, and a stand-in for its ``GenRMClient``.

Read at redai-infra/Relax 01a34ea5 (``relax/engine/rewards/__init__.py``): ``RewardExecutor``
awaits an async custom reward as ``rm_function(args, sample, **kwargs)`` in the event loop, as slime
does (Relax descends from it), so the hook is slime's (`genrm_client.adapters.slime`).

Relax's own ``relax/utils/genrm_client.py`` (467cfa1f) posts ``{"messages", "sampling_params"}`` to
its GenRM service's ``/generate`` and reads ``{"response"}``: not SGLang's ``/generate``.
:class:`PoolGenRMClient` has its methods (``await generate(messages, sampling_params) -> str``,
``health_check()``, ``close()``) over the pool's chat completions, and :func:`get_genrm_client` is
the module's singleton accessor, so Relax's reward code works unchanged once
``relax.utils.genrm_client.get_genrm_client`` is this one (see docs/trainers.md). Its retries are
the client's: 5xx are not blindly retried three times over 1.5 s, retryable refusals are retried
after their ``Retry-After`` until the deadline.

For a job whose code stays as it is, :class:`RelaxService` is Relax's GenRM service in front of the
pool (``python -m genrm_client.adapters.relax --pool URL``): Relax's own client, pointed at it by its
URL alone, posts ``/generate`` as it always does, and each call is the client's chat completion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from weakref import WeakKeyDictionary

import httpx

from genrm_client import wire
from genrm_client.adapters.slime import batched_rm, rm
from genrm_client.aio import AsyncJudgeClient
from genrm_client.calls import chat
from genrm_client.config import URL_ENV, PoolConfig
from genrm_client.errors import BadAnswer, EngineFailed, JudgeError, JudgeTimeout, JudgeUnavailable, Refused
from genrm_client.retry import RetryPolicy
from genrm_client.sync import JudgeClient

__all__ = ["PoolGenRMClient", "RelaxService", "batched_rm", "get_genrm_client", "rm"]

_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_new_tokens": "max_tokens"}
"""Relax's sampling keys, as the chat completions route names them."""


class PoolGenRMClient:
    """Relax's ``GenRMClient`` methods, served by the pool."""

    def __init__(self, service_url: str | None = None, timeout: float = 1800.0) -> None:
        config = PoolConfig.from_env(os.environ if service_url is None else {**os.environ, URL_ENV: service_url})
        self._config = PoolConfig(config.url, config.api_key, config.model, RetryPolicy(deadline_s=timeout))
        self._clients: WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncJudgeClient] = WeakKeyDictionary()

    async def generate(self, messages: Sequence[Mapping[str, Any]], sampling_params: Mapping[str, Any] | None = None,
                       ) -> str:
        """The judge's answer to ``messages`` (Relax's sampling keys: temperature, top_p, top_k,
        max_new_tokens)."""
        params = {_SAMPLING[k]: v for k, v in (sampling_params or {}).items() if k in _SAMPLING}
        verdict = await self._client().call(chat(messages, self._config.model, **params))
        return verdict.text

    def health_check(self) -> dict[str, str]:
        """Relax calls it at start; the pool's Service has no health route for clients (its
        readiness is per replica), so this says only where the judge is."""
        return {"status": "pool", "url": self._config.url}

    def close(self) -> None:
        """Nothing to close synchronously: each loop's client closes with its loop's process."""

    def _client(self) -> AsyncJudgeClient:
        """The running loop's client (an httpx async client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = AsyncJudgeClient(self._config)
        return client


_client: PoolGenRMClient | None = None


def get_genrm_client(service_url: str | None = None, timeout: float = 1800.0) -> PoolGenRMClient:
    """Relax's ``get_genrm_client``: one client per process."""
    global _client
    if _client is None:
        _client = PoolGenRMClient(service_url, timeout)
    return _client


MODELS_PATH = "/v1/models"
"""What the health check asks the pool: any replica's answer means the pool serves."""
MAX_BODY_BYTES = 8 * 1024 * 1024
"""A Relax request larger than this is refused (413): the pool's own default limit."""
_STATUS: tuple[tuple[type[JudgeError], int], ...] = (
    (JudgeUnavailable, 503), (JudgeTimeout, 504), (EngineFailed, 502), (BadAnswer, 502))
"""How a failed call is told to Relax's client, which raises on any error status: a status of the
same class as the cause (a refusal keeps the pool's 4xx), never a 200 that could become a reward."""


def relax_status(error: JudgeError) -> int:
    """The status Relax's client gets for a call that gave no verdict (see `_STATUS`)."""
    if isinstance(error, Refused):
        return error.status if error.status is not None and 400 <= error.status < 500 else 400
    return next((code for kind, code in _STATUS if isinstance(error, kind)), 502)


class RelaxError(ValueError):
    """A Relax request this service cannot read; answered with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def relax_request(body: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and the chat completion's parameters of a Relax ``/generate`` body
    (``{"messages": [...], "sampling_params": {...}}``), or `RelaxError` (400): unknown sampling
    keys are refused rather than dropped, so no request is judged otherwise than its sender asked."""
    try:
        document = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # not UTF-8 or not JSON, NaN, a 5,000-digit number, nesting
        raise RelaxError(400, f"the body is not JSON a judge call can carry: {type(exc).__name__}") from exc
    if not isinstance(document, dict) or set(document) - {"messages", "sampling_params"}:
        raise RelaxError(400, 'a JSON object of "messages" and, optionally, "sampling_params" is expected')
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RelaxError(400, '"messages" must be a non-empty list of objects, each with a "role"')
    sampling = document.get("sampling_params", {})
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, dict) or set(sampling) - set(_SAMPLING):
        raise RelaxError(400, f'"sampling_params" may hold only {sorted(_SAMPLING)}')
    return messages, {_SAMPLING[k]: v for k, v in sampling.items()}


def _no_constant(name: str) -> None:
    """``NaN`` and ``Infinity`` are not JSON, and no sampling parameter can be one."""
    raise ValueError(f"{name} is not a JSON number")


_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A revision fit to go into a header as it is (an engine reached directly may report anything as its
weight version; ``http.server`` writes header values unchecked)."""


class _RelaxHandler(BaseHTTPRequestHandler):
    """Relax's three routes: ``POST /generate``, ``GET /health``, ``GET /metrics``."""

    protocol_version = "HTTP/1.1"
    timeout = 120
    """Seconds a connection may stay silent (a slow or stalled sender, an idle keep-alive) before its
    thread lets it go; a judge call's own wait is the client's, not this."""
    server: RelaxService

    def do_POST(self) -> None:
        if self.path != "/generate":  # its body is not read: the connection ends with the answer
            self._answer(404, {"error": f"no route {self.path!r}: Relax posts /generate"}, close=True)
            return
        try:
            messages, params = relax_request(self._body())
        except RelaxError as exc:
            self._answer(exc.status, {"error": str(exc)}, close=True)
            return
        try:
            verdict = self.server.judge.chat(messages, **params)
            response = verdict.text
            if not response:  # nothing to score (a chat answer whose content is null): not a verdict
                raise BadAnswer(f"the judge's answer has no text (request {verdict.request_id})")
        except (JudgeError, ValueError) as exc:  # ValueError: parameters the client cannot send
            self.server.count("errors")
            status = relax_status(exc) if isinstance(exc, JudgeError) else 400
            self._answer(status, {"error": str(exc), "type": type(exc).__name__,
                                  "reason": getattr(exc, "reason", None)})
            return
        self.server.count("verdicts")
        self.server.count("retries", sum(verdict.retries.values()))
        revision = verdict.revision if verdict.revision and _TOKEN.fullmatch(verdict.revision) else None
        headers = {wire.REVISION_HEADER: revision} if revision else {}
        self._answer(200, {"response": response, "revision": revision}, headers)

    def do_GET(self) -> None:
        if self.headers.get("content-length") not in (None, "0") or self.headers.get("transfer-encoding"):
            self._answer(400, {"error": "a GET carries no body"}, close=True)
            return
        if self.path == "/health":
            healthy, detail = self.server.pool_answers()
            self._answer(200 if healthy else 503, {"status": "healthy" if healthy else "unhealthy", **detail})
        elif self.path == "/metrics":
            self._answer(200, self.server.figures())
        else:
            self._answer(404, {"error": f"no route {self.path!r}"})

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding"):
            raise RelaxError(411, "a Content-Length is required (Relax's client sends one)")
        try:
            length = int(self.headers.get("content-length", ""))
        except ValueError as exc:
            raise RelaxError(411, "a Content-Length is required") from exc
        if not 0 <= length <= MAX_BODY_BYTES:
            raise RelaxError(413, f"a body of at most {MAX_BODY_BYTES} bytes is accepted")
        return self.rfile.read(length)

    def _answer(self, status: int, document: Mapping[str, Any], headers: Mapping[str, str] | None = None,
                close: bool = False) -> None:
        body = json.dumps(document).encode()
        self.send_response(status, _phrase(status))
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:  # a body left unread: the stream is not in a known place any more
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a judge step is thousands of calls; failures are counted in ``/metrics``."""


def _phrase(status: int) -> str:
    """The reason phrase of ``status`` ('' for a code HTTP does not name, such as nginx's 499)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class RelaxService(ThreadingHTTPServer):
    """Relax's GenRM service, served by the pool: each connection a thread, each call the sync
    client's (retries and typed errors as everywhere in this package)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], judge: JudgeClient) -> None:
        super().__init__(address, _RelaxHandler)
        self.judge = judge
        self._figures = {"verdicts": 0, "errors": 0, "retries": 0}
        self._lock = threading.Lock()

    def count(self, figure: str, by: int = 1) -> None:
        with self._lock:
            self._figures[figure] += by

    def figures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._figures)

    def pool_answers(self) -> tuple[bool, dict[str, str]]:
        """Whether the pool's Service answers ``/v1/models`` (Relax's health check, at its start)."""
        config = self.judge.config
        auth = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        try:
            answer = httpx.get(f"{config.url}{MODELS_PATH}", headers=auth, timeout=10.0)
        except httpx.HTTPError as exc:  # any failure to reach the pool is the answer
            return False, {"pool": config.url, "error": repr(exc)}
        return answer.status_code == 200, {"pool": config.url, "pool_status": str(answer.status_code)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m genrm_client.adapters.relax",
                                     description="Relax's GenRM service in front of a judge pool: point Relax's "
                                                 "GenRM URL here (its code unchanged).")
    parser.add_argument("--pool", help="the pool's Service URL (else $GENRM_URL; key: $GENRM_API_KEY)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (loopback by default: it is the "
                                                              "trainer's own helper, with no authentication)")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--expose", action="store_true",
                        help="listen on a non-loopback --host: anyone who reaches it judges with the pool's key")
    args = parser.parse_args(argv)
    if not args.expose and args.host not in ("localhost", "::1") and not args.host.startswith("127."):
        parser.error(f"--host {args.host} is not loopback: the service has no authentication of its own and "
                     "sends the pool's key; add --expose to mean it")
    config = PoolConfig.from_env(os.environ if args.pool is None else {**os.environ, URL_ENV: args.pool})
    with JudgeClient(config) as judge, RelaxService((args.host, args.port), judge) as service:
        print(f"Relax GenRM service for {config.url} on http://{args.host}:{service.server_address[1]}", flush=True)
        service.serve_forever()


if __name__ == "__main__":
    main()


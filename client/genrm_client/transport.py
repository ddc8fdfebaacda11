"""What an httpx exchange means to the retry law, for both clients.

Why a module: the sync and the async client get the same exceptions from httpx, and what each one
says about the request (was it sent? did any answer arrive?) decides whether it may be sent again,
so the mapping is written once. An answer is read with ``stream=True``: an exception before its
head arrived is "no answer byte" (:attr:`Broken.CLOSED` when the server closed the connection),
one while its body is read is :attr:`Broken.LOST` (an answer began; never resent).
"""

from __future__ import annotations

import httpx

from genrm_client import __version__, wire
from genrm_client.calls import JudgeRequest
from genrm_client.retry import Answer, Broken, Failure

USER_AGENT = f"genrm-client/{__version__}"


def headers(request: JudgeRequest, api_key: str | None, pin: str | None) -> dict[str, str]:
    """The headers of an attempt of ``request``: the same request id each time, and the step's ``pin``
    once it has one (an attempt after the step learnt its revision carries it, an earlier one not)."""
    fields = {"content-type": "application/json", "user-agent": USER_AGENT, wire.REQUEST_ID_HEADER: request.id}
    if api_key:
        fields["authorization"] = f"Bearer {api_key}"
    if pin:
        fields[wire.REVISION_HEADER] = pin
    return fields


def before_answer(exc: httpx.TransportError) -> Failure:
    """An exception raised before the answer's head arrived."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Failure(Broken.CONNECT, _describe(exc))
    if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        return Failure(Broken.TIMEOUT, _describe(exc))
    if isinstance(exc, httpx.RemoteProtocolError | httpx.WriteError):
        # The server closed the connection before any answer byte (h11 says "Server disconnected
        # without sending a response"), or while the request was still being written: the pool
        # never answered it, so it has not judged it either (the gateway reads a whole request
        # before it forwards it).
        return Failure(Broken.CLOSED, _describe(exc))
    return Failure(Broken.LOST, _describe(exc))


def during_answer(exc: httpx.TransportError) -> Failure:
    """An exception raised while the answer's body was read."""
    return Failure(Broken.TIMEOUT if isinstance(exc, httpx.ReadTimeout) else Broken.LOST, _describe(exc))


def answer(response: httpx.Response, body: bytes) -> Answer:
    return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()}, body)


def timeout(read_s: float, connect_s: float) -> httpx.Timeout:
    """A judgement may take minutes (a long generation, a pool waking from zero); a connection
    that takes more than a few seconds goes nowhere."""
    return httpx.Timeout(read_s, connect=connect_s, pool=connect_s)


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

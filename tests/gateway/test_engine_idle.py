"""An engine connection the engine closed while it sat idle is retried, never failed to the client.

SGLang's uvicorn closes a keep-alive connection idle for 5 s (``SGLANG_TIMEOUT_KEEP_ALIVE``), as
the simulator does. The pool drops connections idle for 4 s, but a close can still cross a request
on the wire (a busy event loop sees the close late); the request then goes again on a new
connection, because nothing of it reached the engine's application.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop
from genrm_gateway import upstream
from genrm_gateway.config import EngineAddress
from genrm_gateway.upstream import EnginePool
from genrm_testing import run_sim

pytestmark = pytest.mark.timeout(30)


def block_the_loop(seconds: float) -> None:
    """Sleep without yielding to the event loop, so it learns of the engine's close only after the
    next request was written: the race a busy gateway meets."""
    time.sleep(seconds)


def test_a_connection_closed_while_idle_is_retried_on_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the idle connection past the engine's keep-alive, so the pool reuses one the engine closed.
    monkeypatch.setattr(upstream, "_MAX_IDLE_SECONDS", 60.0)
    with run_sim() as sim:
        async def scenario() -> tuple[int, bool, int, bool]:
            pool = EnginePool(EngineAddress.parse(sim.url))
            try:
                first, _ = await pool.request("GET", "/v1/models")
                block_the_loop(5.8)
                stale = pool._idle[-1]
                seen_closed = stale.closed
                second, _ = await pool.request("GET", "/v1/models")
                return first, seen_closed, second, stale.closed
            finally:
                pool.close()

        first, seen_closed, second, stale_closed = asyncio.run(scenario())
        assert first == 200
        assert not seen_closed  # the pool took the connection the engine had closed
        assert second == 200 and stale_closed  # and the request was answered on a fresh one


def test_a_request_after_the_engine_died_is_unavailable_not_disconnected() -> None:
    """The engine is SIGKILLed while a connection to it sits idle, and the next request comes before
    the loop has seen the close (a busy gateway): the engine was gone before a byte was written, so
    the answer is ``engineUnavailable`` (retryable: nothing was judged), not the ``engineDisconnected``
    of a request the engine died under. The e2e engine crash met this as a request lost that was
    never in flight."""
    with run_sim() as sim:
        async def scenario() -> tuple[int, str]:
            pool = EnginePool(EngineAddress.parse(sim.url))
            try:
                first, _ = await pool.request("GET", "/v1/models")
                sim.process.kill()
                sim.process.wait()
                with pytest.raises(upstream.EngineError) as failed:
                    await pool.request("GET", "/v1/models")
                return first, failed.value.reason
            finally:
                pool.close()

        first, reason = uvloop.run(scenario())  # the gateway's loop, whose sockets are not Python's
        assert (first, reason) == (200, "engineUnavailable")

"""Waiting for a condition that is probed over the network.

Why one wait: a probe that dials a pod, a ClusterIP or a freshly started process meets refused,
reset, unreachable and timed-out connections until its peer is there (a Service's first endpoint
is programmed a moment after the pool reports it, a process listens a moment after it starts).
Each of those is "not yet", never the end of the wait; only the deadline ends it, with the last
error or value seen, so a failure says what the probe last met.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")

NOT_YET: tuple[type[BaseException], ...] = (httpx.TransportError, OSError)
"""What a network probe raises while its peer is not there yet: httpx's transport errors (connect,
read, write, pool, protocol, timeouts) and OSError, which covers sockets, urllib and requests
(whose exceptions derive from it), TimeoutError included."""


class WaitTimeout(AssertionError):
    """The deadline passed; the message says what was awaited and what the probe last gave."""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90.0, interval: float = 0.5,
             done: Callable[[T], bool] = bool) -> T:
    """Poll ``probe`` until ``done`` holds for its answer (by default: the answer is truthy) and
    return that answer; a `NOT_YET` error counts as not done. After ``timeout`` seconds, raise
    `WaitTimeout` with the last answer or error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except NOT_YET as exc:
            last: object = exc
        else:
            if value is not None and done(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}; last={last!r}")
        time.sleep(interval)

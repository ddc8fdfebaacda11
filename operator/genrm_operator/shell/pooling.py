"""HTTP connections to sidecars, pooled per address.

Why not one httpx pool for every sidecar: httpcore's pool walks all of its connections on every
request (to find an idle one and to expire old ones), so with one kept-alive connection per
replica each request cost time proportional to the number of replicas. Profiled at 50 pools x 20
replicas, that walk was over half of the operator's CPU. Here each address has a pool of its own
(a handful of connections), found by a dict lookup, and pools nobody used for a while are closed.
"""

from __future__ import annotations

import ssl
import time

import httpx

PER_ADDRESS = httpx.Limits(max_connections=None, max_keepalive_connections=8, keepalive_expiry=60.0)
"""A sidecar sees the state watch, a drain call and verification probes at once at most; the gateway
keeps idle connections for 75 s, longer than we keep them."""
UNUSED_SECONDS = 120.0
"""A pool unused this long is closed (its replica is most likely gone)."""


class PerAddressTransport(httpx.AsyncBaseTransport):
    """An httpx transport that keeps one connection pool per ``host:port``."""

    def __init__(self, limits: httpx.Limits = PER_ADDRESS, unused_seconds: float = UNUSED_SECONDS) -> None:
        self._limits, self._unused = limits, unused_seconds
        # Sidecars speak plain HTTP; one context for every pool spares each its own CA bundle load.
        self._tls = ssl.create_default_context()
        self._pools: dict[tuple[str, int | None], httpx.AsyncHTTPTransport] = {}
        self._used: dict[tuple[str, int | None], float] = {}
        self._busy: dict[tuple[str, int | None], int] = {}
        self._swept = time.monotonic()

    @property
    def addresses(self) -> int:
        """Pools open now (one per address talked to recently)."""
        return len(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = (request.url.host, request.url.port)
        now = time.monotonic()
        if now - self._swept > self._unused / 2:
            await self._sweep(now)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = httpx.AsyncHTTPTransport(limits=self._limits, verify=self._tls)
        self._used[key] = now
        self._busy[key] = self._busy.get(key, 0) + 1
        try:
            return await pool.handle_async_request(request)
        finally:
            self._busy[key] -= 1

    async def _sweep(self, now: float) -> None:
        """Close the pools of addresses nobody asked for lately and that have nothing in flight."""
        self._swept = now
        stale = [key for key, used in self._used.items()
                 if now - used > self._unused and not self._busy.get(key)]
        for key in stale:
            pool = self._pools.pop(key)
            del self._used[key]
            self._busy.pop(key, None)
            await pool.aclose()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        self._used.clear()
        self._busy.clear()
        for pool in pools:
            await pool.aclose()

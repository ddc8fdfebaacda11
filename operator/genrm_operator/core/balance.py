"""Load spread: which published replicas hand client connections back, and how many.

Why the operator decides this: a Kubernetes Service (kube-proxy) places connections, not requests,
and a busy keep-alive client never reconnects by itself, so replicas added by a scale-out would
get none of the traffic of the clients that were already connected. A replica cannot tell on its
own whether it holds too much (only the pool's total says so); the operator sees every sidecar's
report, decides here, and tells the replicas over the sidecar contract (``POST /v1/shed``). The
gateway closes each handed-back connection gently; its client reconnects and kube-proxy places it
uniformly at random, so repeating the rule converges (see docs/load-spread.md).

Two rules, both pure functions of the samples and time:

* **connections**: a replica holding more than ``ceil(C / P)`` of the pool's ``C`` client
  connections over ``P`` published replicas hands back what it holds above ``floor(C / P)``.
  ``C`` includes connections already being handed back (their clients are about to reconnect
  somewhere in the pool): judge requests can outlast a round, and a total without them would shed
  again for connections still on their way. A pool
  within one connection of even (every replica at most the ceiling) is left alone, so balancing
  stops by itself. Down to the floor rather than the ceiling: a replica left short (the newest one
  after a rollout, say) only gains from reconnects that happen to land on it, one in ``P``, so
  handing back a little more fills it sooner. Client pools that open and close connections on
  their own (an ``httpx.Client`` with more threads than its 20 kept-alive connections does so for
  most requests) keep the counts moving at random, and the rule then chases some of that noise: a
  few percent of the clients' own reconnects (docs/load-spread.md), against balancing seconds
  sooner after every publish;
* **load**: with few connections per replica, random placement leaves some replicas with the
  busier ones. A replica serving more than ``LOAD_FACTOR`` times the pool's mean request rate
  for ``LOAD_HOLD_SECONDS`` hands back the share of its connections above the mean (busiest
  first: the gateway picks them), then waits another ``LOAD_HOLD_SECONDS`` before doing so again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from genrm_contract.sidecar import HandBack

LOAD_FACTOR = 1.5
"""A replica above this multiple of the mean request rate is hot."""
LOAD_HOLD_SECONDS = 10.0
"""How long a replica must stay hot before it sheds for load (and between two such sheds)."""
LOAD_WINDOW_SECONDS = 5.0
"""Request rates are measured over about this long: shorter windows read noise as skew."""
MIN_POOL_RATE = 1.0
"""Requests per second the whole pool must serve before load skew means anything."""


@dataclass(frozen=True)
class Traffic:
    """One published, serving replica's report: its kept client connections and its request counter."""

    connections: int
    """Kept client connections (not being handed back)."""
    requests_total: int
    boot_id: str | None
    """The counter's origin: a restarted gateway counts from zero again."""
    handing_back: int = 0
    """Connections marked for hand-back whose clients have not reconnected yet."""


@dataclass(frozen=True)
class Sample:
    at: float
    """Seconds (any monotonic clock)."""
    replicas: Mapping[str, Traffic]


@dataclass(frozen=True)
class Memory:
    """What the next decision needs from earlier ones: recent samples and since when each replica is hot."""

    samples: tuple[Sample, ...] = ()
    hot_since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Shed:
    name: str
    connections: int
    reason: HandBack


def fair_ceiling(total: int, replicas: int) -> int:
    """The most client connections one of ``replicas`` replicas may hold: ``ceil(total / replicas)``."""
    return -(-total // replicas) if replicas else 0


def connection_sheds(replicas: Mapping[str, Traffic]) -> dict[str, int]:
    """What each replica above the fair ceiling hands back: all it holds above the fair floor."""
    total = sum(t.connections + t.handing_back for t in replicas.values())
    ceiling, floor = fair_ceiling(total, len(replicas)), total // len(replicas)
    return {name: t.connections - floor for name, t in replicas.items() if t.connections > ceiling}


def request_rates(samples: Sequence[Sample], now_sample: Sample) -> dict[str, float]:
    """Requests per second of each replica of ``now_sample`` since the oldest sample at least
    ``LOAD_WINDOW_SECONDS`` back (else the oldest one), for replicas with a comparable counter there."""
    window = [s for s in samples if now_sample.at - s.at >= LOAD_WINDOW_SECONDS]
    base = window[-1] if window else (samples[0] if samples else None)
    if base is None or now_sample.at <= base.at:
        return {}
    seconds = now_sample.at - base.at
    rates = {}
    for name, now in now_sample.replicas.items():
        then = base.replicas.get(name)
        if then is not None and then.boot_id == now.boot_id and now.requests_total >= then.requests_total:
            rates[name] = (now.requests_total - then.requests_total) / seconds
    return rates


def decide(sample: Sample, memory: Memory) -> tuple[list[Shed], Memory]:
    """The sheds this sample calls for, and the memory for the next decision.

    A replica shedding for connections does not also shed for load in the same decision: the
    first rule already moves its excess."""
    replicas = sample.replicas
    sheds = [Shed(name, n, HandBack.BALANCE) for name, n in sorted(connection_sheds(replicas).items())]
    rates = request_rates(memory.samples, sample)
    hot_since: dict[str, float] = {}
    if len(replicas) > 1 and len(rates) == len(replicas) and sum(rates.values()) >= MIN_POOL_RATE:
        mean = sum(rates.values()) / len(replicas)
        shedding = {s.name for s in sheds}
        for name, rate in sorted(rates.items()):
            if rate <= LOAD_FACTOR * mean:
                continue
            since = memory.hot_since.get(name, sample.at)
            connections = replicas[name].connections
            if sample.at - since < LOAD_HOLD_SECONDS or name in shedding or connections < 2:
                hot_since[name] = since
                continue
            # The share of its connections carrying the load above the mean (at least one; one kept).
            excess = min(connections - 1, max(1, math.floor(connections * (1 - mean / rate))))
            sheds.append(Shed(name, excess, HandBack.LOAD))
            hot_since[name] = sample.at
    kept = (*(s for s in memory.samples if sample.at - s.at <= 2 * LOAD_WINDOW_SECONDS), sample)
    return sheds, Memory(kept, hot_since)

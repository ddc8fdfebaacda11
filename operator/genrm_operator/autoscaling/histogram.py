"""Latency from a cumulative histogram: Prometheus' ``histogram_quantile``, and the requests between two looks.

Pure so that a replica's latency means the same whether the operator scraped the
sidecar or Prometheus computed it (the Prometheus source sends the same quantile as
PromQL, see :mod:`.signals`), and so it can be tested without a server.
"""

from __future__ import annotations

import math

Buckets = tuple[tuple[float, float], ...]
"""A cumulative histogram: (upper bound, count) pairs sorted by bound, ending with +Inf."""


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q.

    None when the histogram is empty (no request finished: the latency is unknown, not 0).
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def delta(now: Buckets, before: Buckets) -> Buckets | None:
    """Requests observed between two scrapes; None when the counters went backwards (a restart).

    A bound absent before counts as 0: a route's histogram appears with its first request.
    """
    previous = dict(before)
    out = tuple((bound, count - previous.get(bound, 0.0)) for bound, count in now)
    return None if any(count < 0 for _, count in out) else out

"""The operator's speed guard: a small hollow scale storm beside the ReplicaSet controller, in one run.

`make bench-operator` measures 1,000 replicas and takes minutes; this keeps a clear slowdown of the
operator from landing unnoticed between its runs. It runs the same benchmark (`bench.operator_storm`)
at 10 hollow pools of 5 replicas, 3 rounds out and in, on a cluster of its own, and compares the
operator's reaction to the ReplicaSet controller answering a burst of as many Deployment scales
through the same API server in the same run: a ratio, never an absolute time, so a slower or busier
machine slows both sides alike. The limits are twice the figures three runs of this code gave
(docs/performance.md, "The speed guard"): an operator twice as slow per pool fails it, a run as
noisy as those does not.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

from .harness import REPO, TALLY
from .test_bench_operator import BURST, LINE

P50_LIMIT = 6.5
"""The operator's median reaction over the ReplicaSet controller's median under the burst, at most."""
P99_LIMIT = 5.0
"""The same for the slowest reactions (the benchmark's ``p99_to_burst``), at most."""


def test_the_operator_reacts_within_a_small_multiple_of_the_replicaset_controller() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.operator_storm", "--hollow", "--sizes", "10x5",
                           "--idle-seconds", "5", "--rounds", "3", "--writes", "20"],
                          cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    burst_line, last = done.stdout.strip().splitlines()[-2:]
    burst, figures = BURST.match(burst_line), LINE.match(last)
    assert burst and figures, done.stdout[-3000:]
    p50_ratio = float(figures["react_p50_s"]) / float(burst["p50"])
    p99_ratio = float(figures["p99_to_burst"])
    TALLY.speed_guard = (f"operator-speed-guard: pools=10 replicas=50 react_p50_s={figures['react_p50_s']} "
                         f"rs_burst_p50_s={burst['p50']} p50_to_burst={p50_ratio:.2f} "
                         f"react_p99_s={figures['react_p99_s']} rs_burst_p99_s={burst['p99']} "
                         f"p99_to_burst={p99_ratio:.2f} limits={P50_LIMIT:g}/{P99_LIMIT:g}")
    assert math.isfinite(p50_ratio) and math.isfinite(p99_ratio), TALLY.speed_guard
    assert p50_ratio <= P50_LIMIT and p99_ratio <= P99_LIMIT, TALLY.speed_guard + "\n" + done.stdout[-3000:]

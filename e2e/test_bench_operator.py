"""A smoke of ``make bench-operator``: 2 hollow pools of 2 replicas, the last line parses and is finite.

The benchmark is not a timed test (its figures depend on the machine); this only keeps it working.
It starts a cluster of its own (a second pod-network slot), so it runs beside the suite's cluster.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

from .harness import REPO

LINE = re.compile(
    r"^operator-bench: pools=(?P<pools>\d+) replicas=(?P<replicas>\d+) react_p50_s=(?P<react_p50_s>\S+) "
    r"react_p99_s=(?P<react_p99_s>\S+) rs_react_p50_s=(?P<rs_react_p50_s>\S+) "
    r"publish_overhead_p50_s=(?P<publish_overhead_p50_s>\S+) publish_overhead_p99_s=(?P<publish_overhead_p99_s>\S+) "
    r"cpu_idle_cores=(?P<cpu_idle_cores>\S+) rss_mb=(?P<rss_mb>\S+) api_writes_per_min=(?P<api_writes_per_min>\S+) "
    r"rs_burst_p99_s=(?P<rs_burst_p99_s>\S+) p99_to_burst=(?P<p99_to_burst>\S+)$")
SPLIT = re.compile(r"^operator-bench-split: reactions=(?P<reactions>\d+) (?P<parts>(?:\w+_s=\S+ ?)+)$")
WRITE = re.compile(r"^operator-bench-write: writes=(?P<writes>\d+) put_cpu_ms=(?P<put>\S+) "
                   r"merge_patch_cpu_ms=(?P<patch>\S+) put_to_merge_patch=(?P<ratio>\S+)$")
FLOOR = re.compile(r"^operator-bench-floor: pools=(?P<pools>\d+) scale_cpu_ms=(?P<scale>\S+) "
                   r"status_write_cpu_ms=(?P<status>\S+) pod_create_cpu_ms=(?P<create>\S+) "
                   r"critical_cpu_s=(?P<critical>\S+)$")
BURST = re.compile(r"^operator-bench-burst: deployments=(?P<deployments>\d+) "
                   r"rs_burst_react_p50_s=(?P<p50>\S+) rs_burst_react_p99_s=(?P<p99>\S+)$")


def test_bench_operator_smoke() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.operator_storm", "--hollow", "--sizes", "2x2",
                           "--idle-seconds", "5", "--rounds", "1", "--writes", "20"],
                          cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    split, burst, last = done.stdout.strip().splitlines()[-3:]
    # Two pools, out and in once: four reactions, each cut into parts that add up to it.
    cut = SPLIT.match(split)
    assert cut and cut["reactions"] == "4", split
    parts = {k: float(v) for k, v in (p.split("=") for p in cut["parts"].split())}
    assert all(math.isfinite(v) for v in parts.values()), split
    assert parts["api_p50_s"] > 0 and parts["delivery_p50_s"] >= 0 and parts["slowest_tenth_react_s"] > 0, split
    slowest = sum(parts[f"slowest_tenth_{p}_s"] for p in ("api", "delivery", "operator", "write"))
    assert abs(slowest - parts["slowest_tenth_react_s"]) < 0.005, split
    found = BURST.match(burst)
    assert found, burst
    assert found["deployments"] == "2" and 0 < float(found["p50"]) <= float(found["p99"]) < math.inf, burst
    match = LINE.match(last)
    assert match, last
    figures = {k: float(v) for k, v in match.groupdict().items()}
    assert figures["pools"] == 2 and figures["replicas"] == 4, last
    assert all(math.isfinite(v) and v >= 0 for v in figures.values()), last
    # Publish overhead may be 0 at the watch's resolution: the operator follows each replica's own
    # sidecar, so it can publish in the same instant the kubelet's Ready reaches the API server.
    for positive in ("react_p50_s", "react_p99_s", "rs_react_p50_s", "rss_mb", "rs_burst_p99_s"):
        assert figures[positive] > 0, last
    assert figures["rs_burst_p99_s"] == float(found["p99"]), "the last line repeats the burst's p99"
    assert math.isclose(figures["p99_to_burst"], figures["react_p99_s"] / figures["rs_burst_p99_s"],
                        rel_tol=0.05, abs_tol=0.01), last
    # The API server's CPU per request, 6 rounds of 20 of each kind: status writes both ways, and
    # the API server's work before the last pool can act: a scale, a status write and a create each.
    lines = done.stdout.splitlines()
    cost = next(WRITE.match(line) for line in lines if line.startswith("operator-bench-write:"))
    assert cost and cost["writes"] == "240", done.stdout[-3000:]
    assert all(0 < float(cost[k]) < math.inf for k in ("put", "patch", "ratio")), cost.string
    floor = next(FLOOR.match(line) for line in lines if line.startswith("operator-bench-floor:"))
    assert floor and floor["pools"] == "2", done.stdout[-3000:]
    ms = {k: float(floor[k]) for k in ("scale", "status", "create", "critical")}
    assert all(0 < v < math.inf for v in ms.values()), floor.string
    assert ms["status"] == float(cost["put"]), "both lines give the operator's status write"
    assert math.isclose(ms["critical"], 2 * (ms["scale"] + ms["status"] + ms["create"]) / 1000,
                        abs_tol=0.001), floor.string
    # The table's sidecar calls come from the operator's own counter: a storm drains, probes and polls.
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mode"])
    row = dict(zip(lines[header].split(), lines[header + 1].split(), strict=True))
    assert row["PxR"] == "2x2" and 0 < float(row["sc/s_storm"]) < math.inf, lines[header:header + 2]
    assert 0 < float(row["api_cpu_storm"]) < math.inf, lines[header:header + 2]

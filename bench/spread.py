"""``make bench-spread``: how evenly keep-alive clients' requests spread after a scale-out, by connection count.

For each client connection count (8, 25 and 64: fewer, about as many and many more connections than
a few per replica), a simulated pool of one replica gets that many senders on one `httpx.Client`
(so that many kept-alive connections) through its Service ClusterIP, and is scaled to 4. Measured
from the replicas' own `/metrics`, read twice a second:

* balance: the 4th publish -> the end of the first 5 s window in which every replica served at
  least 0.6x an even share of the requests;
* over the 30 s after that: the smallest and largest replica share, the largest and smallest
  replica's p99 time from admission to the last byte (engine queueing included), connections
  handed back per minute (balancing and the maximum age both) and connections opened per minute
  (every reconnect, the client pool's own included);
* failed: requests that did not end in a 2xx.

Run from the repository root: ``python -m bench.spread [--connections 8,25,64]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from e2e.harness import Cluster, operated_cluster, pool_manifest, served_model, wait_for
from e2e.spread import KeepAliveClients, ShareMeter, quantile

REPLICAS = 4
HOLD_SECONDS = 30.0
BALANCE_WITHIN_SECONDS = 60.0
# About 0.3 s per request, so 64 senders stay within what two cores can serve and placement, not
# CPU contention, decides the shares.
ENGINE = {"extraArgs": ["--sim-startup-seconds", "1", "--sim-ttft-ms", "10", "--sim-itl-ms", "10"]}
MAX_TOKENS = 32


def measure(cluster: Cluster, connections: int) -> str:
    namespace = name = f"spread-{connections}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(name, namespace, replicas=1, engine=ENGINE))
    cluster.wait_serving(namespace, name, 1)
    url = cluster.service_answering(namespace, name)
    model = served_model(cluster.pool(namespace, name))
    with ShareMeter(lambda: cluster.pod_addresses(namespace, name)) as meter, \
            KeepAliveClients(url, model, MAX_TOKENS, mix={"httpx": connections}) as clients:
        wait_for("first answers", lambda: clients.ok_everywhere(connections), timeout=60)
        cluster.scale(namespace, name, REPLICAS)
        wait_for(f"{REPLICAS} serving", lambda: cluster.serving_replicas(namespace, name) == REPLICAS, timeout=120,
                 interval=0.2)
        published_at = time.monotonic()
        replicas = cluster.published(namespace, name)
        assert len(replicas) == REPLICAS, replicas
        balanced, _ = meter.first_even_window(published_at, replicas, BALANCE_WITHIN_SECONDS)
        start = balanced if balanced is not None else published_at + BALANCE_WITHIN_SECONDS
        meter.wait_until(start + HOLD_SECONDS)
        seconds, pairs = meter.between(start, start + HOLD_SECONDS)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    shares = meter.shares(start, start + HOLD_SECONDS)
    p99 = [quantile(0.99, before, after) for before, after in pairs.values()]
    handed = sum(after.handed_back - before.handed_back for before, after in pairs.values())
    opened = sum(after.opened - before.opened for before, after in pairs.values())
    return (f"spread-bench: connections={connections} replicas={REPLICAS} "
            f"balance_s={-1.0 if balanced is None else balanced - published_at:.1f} "
            f"min_share={min(shares.values()):.3f} max_share={max(shares.values()):.3f} "
            f"p99_max_s={max(p99):.3f} p99_min_s={min(p99):.3f} "
            f"handed_back_per_min={60 * handed / seconds:.1f} connects_per_min={60 * opened / seconds:.1f} "
            f"requests={clients.stats.sent} "
            f"failed={len(clients.stats.failures)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--connections", default="8,25,64", help="client connection counts, comma-separated")
    parser.add_argument("--log-dir", type=Path, help="keep the operator's log here (default: a temporary directory)")
    args = parser.parse_args()
    counts = [int(n) for n in args.connections.split(",")]
    lines = []
    with operated_cluster(args.log_dir) as (cluster, _):
        for connections in counts:
            lines.append(measure(cluster, connections))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

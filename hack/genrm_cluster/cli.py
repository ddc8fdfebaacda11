"""`genrm-cluster up`: a local cluster in the foreground until Ctrl-C (or SIGTERM).

Why a CLI: to poke at the cluster by hand with kubectl while developing, without `make dev`'s
operator and example pool.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path

from genrm_cluster.cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="genrm-cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run control plane and node agent until Ctrl-C")
    up.add_argument("--nodes", type=int, default=1)
    up.add_argument("--gpus-per-node", type=int, default=8)
    up.add_argument("--workdir", type=Path, help="work dir (default: a new dir under /dev/shm)")
    up.add_argument("--keep-workdir", action="store_true", help="keep logs and state after exit")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the rest
    stop = threading.Event()
    # Explicit handlers: a shell starts background jobs with SIGINT ignored, and then Python
    # would never raise KeyboardInterrupt.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started = time.monotonic()
    with LocalCluster(nodes=args.nodes, gpus_per_node=args.gpus_per_node, workdir=args.workdir,
                      keep_workdir=args.keep_workdir or None) as cluster:
        print(f"cluster up in {time.monotonic() - started:.1f}s", flush=True)
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        print(f"export PATH={cluster.bin_dir}:$PATH   # kubectl, helm", flush=True)
        stop.wait()
        print("stopping...", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

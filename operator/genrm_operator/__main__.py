"""``genrm-operator``: run the GenRMPool operator (kopf) with a Prometheus endpoint."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server

from .shell import collector, handlers  # importing handlers registers them with kopf


def main(argv: list[str] | None = None) -> None:
    """Parse flags and run until interrupted."""
    parser = argparse.ArgumentParser(prog="genrm-operator", description=__doc__)
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of the /metrics listener")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--no-gpu-placement", action="store_true",
                        help="do not watch nodes (no RBAC on nodes needed): new replicas of a deterministic or "
                             "verified pool are then not pinned to the GPU product (nvidia.com/gpu.product) of its "
                             "serving replicas")
    parser.add_argument("--activator-service", default=os.environ.get("GENRM_ACTIVATOR_SERVICE"),
                        metavar="NAMESPACE/NAME",
                        help="the activator's Service: pools with scaleToZero route to it while no replica serves "
                             "(needs RBAC on endpointslices); its control token in $GENRM_ACTIVATOR_TOKEN")
    args = parser.parse_args(argv)
    if not args.no_gpu_placement:
        handlers.watch_gpu_products()
    if args.activator_service:
        namespace, _, service = args.activator_service.partition("/")
        token = os.environ.get("GENRM_ACTIVATOR_TOKEN", "")
        if not (namespace and service and token):
            parser.error("--activator-service wants NAMESPACE/NAME and the token in $GENRM_ACTIVATOR_TOKEN")
        handlers.use_activator(namespace, service, token)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # One INFO line per sidecar request (every replica, every step) was most of the log and its CPU.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        # kopf logs every watch event its handlers saw ("Handler 'child_changed' succeeded.") at INFO:
        # with 1,000 pods that was most of the log. Its warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    collector.tune()
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    ))


if __name__ == "__main__":
    main()

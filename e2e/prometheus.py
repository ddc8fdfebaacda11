"""A real Prometheus scraping an end-to-end run, and promtool's exposition-format lint.

Why a real one: the dashboards' PromQL and the chart's scrape setup are only proven when a
Prometheus has scraped the operator and the judge pods of a live pool. The scrape jobs mirror
what the chart's monitors produce: the operator job keeps the series' own ``namespace``/``pool``
labels (``honorLabels: true`` in the ServiceMonitor), and every gateway target carries
``namespace``, ``pod`` and the ``pool`` and ``revision`` labels the PodMonitor copies from the pod
labels ``genrm.io/pool`` and ``genrm.io/judge-revision``. Gateway targets come from a file_sd file
rewritten from the pods' addresses, standing in for Kubernetes service discovery. Debian's
prometheus package (``make tools``) provides both binaries.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from genrm_testing import launched, wait_ready

from .harness import free_port

POOL_LABEL = "genrm.io/pool"
JUDGE_REVISION_LABEL = "genrm.io/judge-revision"
GATEWAY_PORT_NAME = "control"
OPERATOR_NAMESPACE = "genrm-system"
"""The ``namespace`` target label of the operator job: the release namespace in a chart install."""


@dataclass(frozen=True)
class Lint:
    """The verdict of ``promtool check metrics``: exit code 0 clean, 3 lint findings, 1 unparsable."""

    returncode: int
    findings: tuple[str, ...]


def promtool_check_metrics(exposition: str) -> Lint:
    """Lint a scrape body the way ``promtool check metrics`` does (it reads stdin, reports on stderr)."""
    done = subprocess.run(["promtool", "check", "metrics"], input=exposition, text=True,
                          capture_output=True, timeout=60, check=False)
    lines = (done.stdout + done.stderr).splitlines()
    return Lint(done.returncode, tuple(line for line in lines if line.strip()))


def gateway_targets(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """file_sd groups for the gateway port of every pod that has an address, labelled like the PodMonitor."""
    groups = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        port = next((p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
                     if p.get("name") == GATEWAY_PORT_NAME), None)
        if ip and port:
            meta = pod["metadata"]
            groups.append({"targets": [f"{ip}:{port}"],
                           "labels": {"namespace": meta["namespace"], "pod": meta["name"],
                                      "pool": meta["labels"][POOL_LABEL],
                                      "revision": meta["labels"][JUDGE_REVISION_LABEL]}})
    return groups


class Prometheus:
    """A running Prometheus: update its gateway targets, read label values, run instant queries."""

    def __init__(self, url: str, targets_file: Path) -> None:
        self.url = url
        self._targets_file = targets_file

    def scrape_gateways(self, pods: Iterable[dict[str, Any]]) -> None:
        """Replace the gateway targets; written atomically, so file_sd never reads half a file."""
        partial = self._targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(gateway_targets(pods)))
        os.replace(partial, self._targets_file)

    def _api(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus has stored."""
        return set(self._api("label/__name__/values"))

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the current time; the result vector."""
        result: list[dict[str, Any]] = self._api("query", query=expr)["result"]
        return result

    def has_data(self, expr: str) -> bool:
        """Whether ``expr`` yields a sample a graph could draw (not only NaN, e.g. a quantile of no rate)."""
        return any(math.isfinite(float(sample["value"][1])) for sample in self.query(expr))


@contextmanager
def run_prometheus(directory: Path, operator_port: int) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port, scraping every second: the operator on ``operator_port``
    and the gateways later given to :meth:`Prometheus.scrape_gateways`."""
    targets_file = directory / "gateways.json"
    targets_file.write_text("[]")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "genrm-operator", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"],
                                 "labels": {"namespace": OPERATOR_NAMESPACE, "pod": "genrm-operator"}}]},
            {"job_name": "genrm-gateways",
             "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]},
        ],
    }
    config_file = directory / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    command = ["prometheus", f"--config.file={config_file}", f"--storage.tsdb.path={directory / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with launched(command):
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/-/ready", seconds=60)
        yield Prometheus(url, targets_file)

"""One local cluster per test session (starting one costs a few seconds of 2 shared cores)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from genrm_cluster.cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    # A hard failure, not a skip: CI runs as root, and a silently skipped cluster suite proves nothing.
    assert os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nft") is not None, \
        "the local cluster needs root, iproute2 (network namespaces) and nftables (kube-proxy): make tools"
    with LocalCluster(nodes=1, gpus_per_node=8) as c:
        yield c

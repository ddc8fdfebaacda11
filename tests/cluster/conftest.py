"""One local cluster per test session (starting one costs a few seconds of 2 shared cores)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cluster.cluster import LocalCluster

TOOLS_IMAGE = "example.org/tools:1"
"""An image the session's cluster maps to a directory of its own (`tools_image`)."""


@pytest.fixture(scope="session")
def tools_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of ``TOOLS_IMAGE``: its ``bin/copy-file`` copies its first argument to its second."""
    root = tmp_path_factory.mktemp("tools-image")
    tool = root / "bin" / "copy-file"
    tool.parent.mkdir()
    tool.write_text('#!/bin/sh\ncat "$1" > "$2"\nexec sleep 3600\n')
    tool.chmod(0o755)
    return root


@pytest.fixture(scope="session")
def cluster(tools_image: Path) -> Iterator[LocalCluster]:
    # A hard failure, not a skip: CI runs as root, and a silently skipped cluster suite proves nothing.
    assert os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nft") is not None, \
        "the local cluster needs root, iproute2 (network namespaces) and nftables (kube-proxy): make tools"
    with LocalCluster(nodes=1, gpus_per_node=8, images={TOOLS_IMAGE: tools_image}) as c:
        yield c

"""Shared views of the committed SGLang contract for the contract tests (no network: the file is committed)."""

from __future__ import annotations

import pytest
from genrm_sim import contract


@pytest.fixture(scope="session")
def sglang() -> contract.Contract:
    return contract.load()

"""The client's copy of the pool's wire constants is the pool's (`genrm_client.wire` says why a copy),
every refusal the pool writes carries its retry marker, and the client's version is the project's."""

from __future__ import annotations

import random
import subprocess
import sys
import tomllib
from pathlib import Path

from genrm_client import RevisionRetired, __version__, wire
from genrm_client.retry import Answer, Retry, RetryPolicy, decide
from genrm_contract import demand, sidecar
from genrm_gateway.routes import PROXIED

ROOT = Path(__file__).resolve().parents[2]


def test_the_clients_wire_constants_are_the_contracts() -> None:
    assert wire.REASON_HEADER == sidecar.REASON_HEADER
    assert wire.SHOULD_RETRY_HEADER == sidecar.SHOULD_RETRY_HEADER
    assert wire.REVISION_HEADER == sidecar.REVISION_HEADER and wire.HELD_HEADER == sidecar.HELD_HEADER
    assert wire.OVERLOAD_REASONS == {str(reason) for reason in sidecar.OVERLOAD_REASONS}
    assert sidecar.OVERLOAD_REASONS <= set(sidecar.RETRYABLE_REASONS)
    assert wire.DEMAND_PATH == demand.DEMAND_PATH
    assert wire.REVISION_RETIRED == sidecar.RefusalReason.REVISION_RETIRED


def test_the_client_retries_exactly_the_refusals_the_contract_marks_retryable() -> None:
    """Every reason the pool may refuse with, with the headers the pool sends for it: the client's law
    (which reads the marker, not a copy of the set) sends again exactly the contract's retryable ones,
    and a retired revision is its own error."""
    for reason in sidecar.RefusalReason:
        status = 503 if reason in sidecar.RETRYABLE_REASONS else 409
        answer = Answer(status, {sidecar.REASON_HEADER: reason, **dict(sidecar.retry_headers(reason))}, b"{}")
        decision = decide(answer, 1, 0.0, RetryPolicy(), random.Random(1), 0.0)
        assert isinstance(decision, Retry) == (reason in sidecar.RETRYABLE_REASONS), reason
    retired = Answer(409, {sidecar.REASON_HEADER: sidecar.RefusalReason.REVISION_RETIRED,
                           **dict(sidecar.retry_headers(sidecar.RefusalReason.REVISION_RETIRED))}, b"{}")
    assert isinstance(decide(retired, 1, 0.0, RetryPolicy(), random.Random(1), 0.0), RevisionRetired)


def test_the_clients_routes_are_served_by_the_gateway() -> None:
    assert {wire.CHAT_PATH, wire.GENERATE_PATH, wire.CLASSIFY_PATH} <= set(PROXIED)


def test_every_refusal_says_whether_to_retry_and_a_retryable_one_when() -> None:
    for reason in sidecar.RefusalReason:
        headers = dict(sidecar.retry_headers(reason))
        if reason in sidecar.RETRYABLE_REASONS:
            assert headers == {"x-should-retry": "true", "retry-after": str(sidecar.RETRYABLE_REASONS[reason])}
        elif reason in sidecar.UNMARKED_REASONS:
            assert headers == {}, reason
        else:
            assert headers == {"x-should-retry": "false"}, reason
    assert sidecar.RETRYABLE_REASONS[sidecar.RefusalReason.HOLD_TIMEOUT] == 5


def test_the_client_is_versioned_with_the_project() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())
    assert client["project"]["version"] == project == __version__
    assert client["project"]["dependencies"] == ["httpx>=0.27,<1"], "httpx and the standard library only"


def test_the_client_distribution_holds_the_client_and_its_adapters_only() -> None:
    from setuptools import find_packages

    found = find_packages(where=str(ROOT / "client"), include=["genrm_client*"])
    assert sorted(found) == ["genrm_client", "genrm_client.adapters"]
    assert (ROOT / "client" / "genrm_client" / "py.typed").exists()


def test_importing_the_client_and_every_adapter_loads_nothing_of_the_pool() -> None:
    """What a training machine imports: httpx and the standard library (no pydantic, no Kubernetes)."""
    code = ("import sys, genrm_client, genrm_client.adapters.verl, genrm_client.adapters.openrlhf, "
            "genrm_client.adapters.slime, genrm_client.adapters.relax; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'genrm_contract', 'genrm_gateway', "
            "'genrm_operator', 'kubernetes', 'kopf', 'torch', 'aiohttp'}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"

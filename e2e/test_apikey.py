"""A key-protected pool: ``spec.engine.apiKey`` names a Secret, on a real API server.

Aspects: its replicas are verified (the operator's probes go through each gateway's control port,
the operator never reads the key) and published; an unmodified ``openai`` client with the key gets
verdicts through the Service, one without it gets 401, and ``/server_info`` (which shows SGLang's
key) stays blocked; the key is in no process's command line and nowhere in the pods the API server
returns, which only reference the Secret.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import openai
import pytest

from .harness import Cluster, pool_manifest, served_model, wait_for

pytestmark = pytest.mark.timeout(240)


def command_lines() -> list[bytes]:
    """Every process's command line on this host (the local cluster's containers are its processes)."""
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes())
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return lines


def test_a_key_protected_pool_publishes_and_serves_only_clients_with_its_key(cluster: Cluster, namespace: str) -> None:
    key = f"judge-{secrets.token_hex(12)}"
    cluster.kubectl("create", "secret", "generic", "judge-key", "-n", namespace, f"--from-literal=apiKey={key}")
    engine = {"apiKey": {"secretKeyRef": {"name": "judge-key", "key": "apiKey"}}}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("keyed", namespace, replicas=2, engine=engine))
    pool = cluster.wait_serving(namespace, "keyed", 2)  # published only once verified

    url = cluster.service_url(namespace, "keyed")
    bearer = {"authorization": f"Bearer {key}"}
    wait_for(f"Service {namespace}/keyed to answer", lambda: httpx.get(
        f"{url}/v1/models", headers=bearer, timeout=2.0).status_code == 200 or None, timeout=30, interval=0.2)
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key) as judge:
        verdict = judge.chat.completions.create(model=served_model(pool),
                                                messages=[{"role": "user", "content": "Is 2+2=4?"}])
        assert verdict.choices[0].message.content
    with openai.OpenAI(base_url=f"{url}/v1", api_key="none") as stranger, pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model=served_model(pool), messages=[{"role": "user", "content": "2+2?"}])
    blocked = httpx.get(f"{url}/server_info", headers=bearer, timeout=10)
    assert blocked.status_code == 403 and key not in blocked.text

    pods = cluster.kubectl("get", "pods", "-n", namespace, "-l", "genrm.io/pool=keyed", "-o", "json")
    assert key not in pods and '"judge-key"' in pods
    assert all(p["spec"]["initContainers"] for p in json.loads(pods)["items"])
    assert not [line for line in command_lines() if key.encode() in line]

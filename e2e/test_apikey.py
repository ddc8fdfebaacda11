"""A key-protected pool: ``spec.engine.apiKey`` names a Secret, on a real API server.

Aspects: its replicas are verified (the operator's probes go through each gateway's control port,
the operator never reads the key) and published; an unmodified ``openai`` client with the key gets
verdicts through the Service, one without it gets 401, and ``/server_info`` (which shows SGLang's
key) stays blocked; the key is in no process's command line and nowhere in the pods the API server
returns, which only reference the Secret. A pool whose Secret is missing ends its scale-out
``Partial (ReplicaCannotStart)`` naming the Secret (the kubelet's ``CreateContainerConfigError``),
keeps its pod past the startup timeout rather than replacing it, and serves from that same pod
once the Secret is created.
"""

from __future__ import annotations

import json
import secrets
import time
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


def test_a_missing_key_secret_is_named_in_the_status_and_the_same_pod_serves_once_it_exists(
    cluster: Cluster, namespace: str
) -> None:
    startup_timeout = 15
    engine = {"apiKey": {"secretKeyRef": {"name": "late-key", "key": "apiKey"}},
              "startupTimeoutSeconds": startup_timeout}
    cluster.kubectl("apply", "-f", "-", input=pool_manifest("late", namespace, replicas=1, engine=engine))

    def last() -> dict[str, str]:
        history = (cluster.pool(namespace, "late").get("status") or {}).get("history") or []
        return history[-1] if history else {}

    entry = wait_for("Partial(ReplicaCannotStart)", lambda: (e := last()).get("outcome") == "Partial" and e,
                     timeout=90)
    assert entry["reason"] == "ReplicaCannotStart", entry
    assert "CreateContainerConfigError" in entry["message"] and "late-key" in entry["message"], entry

    def uids() -> list[str]:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "genrm.io/pool=late", "-o", "json"))
        return sorted(p["metadata"]["uid"] for p in pods["items"])

    before = uids()
    assert len(before) == 1
    time.sleep(startup_timeout + 5)
    assert uids() == before, "a replacement would wait for the Secret the same way"
    reasons = [h["reason"] for h in (cluster.pool(namespace, "late").get("status") or {}).get("history") or []]
    assert "StartupTimeout" not in reasons, reasons

    cluster.kubectl("create", "secret", "generic", "late-key", "-n", namespace,
                    f"--from-literal=apiKey=judge-{secrets.token_hex(12)}")
    cluster.wait_serving(namespace, "late", 1, timeout=120)
    assert uids() == before, "the pod that waited is the one serving"

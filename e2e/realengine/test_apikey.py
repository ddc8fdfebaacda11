"""A key-protected pool of real SGLang: the key reaches SGLang through its `--config` file (SGLang itself
refuses a call without it, asked inside the pod), the operator's probes and the gateway's calls carry it,
and only clients that have it are served."""

from __future__ import annotations

import secrets
from pathlib import Path

import openai
import pytest

from ..harness import Cluster
from ..test_soak import engine_pid
from .lane import ENGINE, LANE, in_pod, real_pool_manifest

pytestmark = pytest.mark.timeout(400)


def test_a_key_protected_real_pool_serves_only_clients_with_its_key(cluster: Cluster, namespace: str,
                                                                   models: Path) -> None:
    key = f"judge-{secrets.token_hex(12)}"
    cluster.kubectl("create", "secret", "generic", "judge-key", "-n", namespace, f"--from-literal=apiKey={key}")
    engine = {"apiKey": {"secretKeyRef": {"name": "judge-key", "key": "apiKey"}}}
    cluster.kubectl("apply", "-f", "-", input=real_pool_manifest("keyed", namespace, models, engine=engine))
    cluster.wait_serving(namespace, "keyed", 1, timeout=300)
    pod = cluster.pods(namespace, "keyed")[0]
    pid = engine_pid(pod)
    assert pid is not None
    in_pod(pid, f"{ENGINE}/v1/models", status=401)
    in_pod(pid, f"{ENGINE}/v1/models", headers={"Authorization": f"Bearer {key}"})
    url = cluster.service_url(namespace, "keyed")
    messages = [{"role": "user", "content": "Is 2+2=4?"}]
    with LANE.request(), openai.OpenAI(base_url=f"{url}/v1", api_key=key) as judge:
        verdict = judge.chat.completions.create(model="tiny-judge", messages=messages, max_tokens=8)  # type: ignore[arg-type]
        assert verdict.usage is not None and verdict.usage.completion_tokens == 8, verdict
    with LANE.request(), openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model="tiny-judge", messages=messages, max_tokens=8)  # type: ignore[arg-type]

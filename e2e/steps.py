"""Step-structured judge load, as a trainer sends it: a burst of verdicts, then an idle gap.

Each step sends its verdicts from two unmodified clients through the pool's Service at once: the
``openai`` client (chat completions, default settings and retries) and one ``requests`` session
(``/generate``, kept alive across steps, as a trainer's single session is). Every verdict's judge
revision is read twice, from the gateway's ``x-genrm-revision`` and from SGLang's ``weight_version``
in the body, so a step answered by two judges shows. Used by ``e2e/test_judge_switch.py`` and
``make bench-judge-switch``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai
import requests

PER_CLIENT = 12
"""Verdicts per client per step."""
REVISION_HEADER = "x-genrm-revision"


@dataclass
class Step:
    number: int
    started: float = 0.0
    ended: float = 0.0
    revisions: set[str] = field(default_factory=set)
    """Judge revisions of the step's verdicts, from the header and from the body alike."""
    verdicts: int = 0
    failures: list[str] = field(default_factory=list)


def openai_verdict(client: openai.OpenAI, model: str, step: int, i: int) -> set[str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": f"step {step} candidate {i}: is 2+2=4?"}],
        max_tokens=8, temperature=0)
    body = raw.http_response.json()
    return {raw.headers.get(REVISION_HEADER, "-"), str((body.get("metadata") or {}).get("weight_version", "-"))}


def requests_verdict(session: requests.Session, url: str, step: int, i: int) -> set[str]:
    answer = session.post(f"{url}/generate", json={"text": f"step {step} candidate {i}: is 2+2=4?",
                                                   "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
                          timeout=30)
    answer.raise_for_status()
    meta = answer.json().get("meta_info") or {}
    return {answer.headers.get(REVISION_HEADER, "-"), str(meta.get("weight_version", "-"))}


class StepLoad:
    """The trainer's two clients, through the pool's Service at ``url``; `step` runs one step."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")  # default retries and timeouts
        self.session = requests.Session()
        self._session_lock = threading.Lock()
        self._workers = ThreadPoolExecutor(max_workers=8)

    def step(self, number: int) -> Step:
        """One burst: ``PER_CLIENT`` verdicts from each client at once; returns when all have ended."""
        step = Step(number, started=time.time())
        futures = [self._workers.submit(openai_verdict, self.client, self.model, number, i) for i in range(PER_CLIENT)]
        futures += [self._workers.submit(self._one_session_verdict, number, i) for i in range(PER_CLIENT)]
        for future in futures:
            try:
                step.revisions |= future.result()
                step.verdicts += 1
            except Exception as exc:
                step.failures.append(f"{type(exc).__name__}: {exc}")
        step.ended = time.time()
        return step

    def _one_session_verdict(self, number: int, i: int) -> set[str]:
        with self._session_lock:  # one kept-alive connection, as a trainer's single session has
            return requests_verdict(self.session, self.url, number, i)

    def close(self) -> None:
        self._workers.shutdown()
        self.session.close()
        self.client.close()


def mixed(steps: list[Step]) -> list[Step]:
    """The steps whose verdicts name more than one judge revision (or a verdict without one)."""
    return [s for s in steps if len(s.revisions) != 1]

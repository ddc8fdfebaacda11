"""Judge switches on the local cluster, under step-structured load from unmodified clients.

A trainer's judge load comes in steps: a burst of verdicts, then the training step itself, when the
judge is idle. Twenty steps run here, each a burst from the unmodified ``openai`` client (chat
completions, default settings and retries) and from one ``requests`` session (``/generate``, kept
alive across steps), both through the pool's ClusterIP, separated by idle gaps. The judge changes
three times, blue/green:

* mid-step, promoted at the next idle gap (``IdleGap``);
* mid-gap, promoted at a later gap;
* with a ``Manual`` promotion (the annotation), the operator SIGKILLed right after it, then a
  rollback: the previous judge fields again within the scale-down delay, promoted back by annotation.

The simulator's answers depend on the model (each judge revision has its own deterministic verdict
function), every answer carries the revision in ``x-genrm-revision`` and SGLang's ``weight_version``
in its body, so mixing would show. Invariants: every step's verdicts carry exactly one revision, by
both marks; nothing is lost; under ``IdleGap`` no promotion falls inside a step. The last line:
``judge-switch-e2e: steps=S mixed_steps=M lost=L promotions=P rollbacks=R``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import datetime
from typing import Any

import pytest

from .harness import Cluster, OperatorProcess, pool_manifest, wait_for
from .steps import Step, StepLoad, mixed

POOL = "switch"
STEPS = 20
GAP_SECONDS = 8.0
"""The idle gap between two steps: longer than the pool's idleGapSeconds (1) plus the switch itself (the
gateways' idle report, the Service's move, the previous revision's fence: docs/judge-changes.md)."""

pytestmark = pytest.mark.timeout(900)


def _patch(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "genrmpool", POOL, "-n", namespace, "--type", "merge", "-p", json.dumps({"spec": spec}))


def _status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return dict(cluster.pool(namespace, POOL).get("status") or {})


def _active(cluster: Cluster, namespace: str) -> str:
    return str((_status(cluster, namespace).get("judge") or {}).get("active") or "")


def _switches(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [h for h in _status(cluster, namespace).get("history") or [] if h["type"] == "JudgeSwitch"]


def _promotion_events(cluster: Cluster, namespace: str) -> list[tuple[float, str]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={POOL},reason=JudgePromoted", "-o", "json")
    events = json.loads(out)["items"]
    return sorted((datetime.fromisoformat((e.get("eventTime") or e.get("lastTimestamp") or e["firstTimestamp"])
                                          .replace("Z", "+00:00")).timestamp(), e["message"]) for e in events)


def _awaiting(cluster: Cluster, namespace: str, judge_to: str | None = None) -> dict[str, Any] | None:
    """The running switch once it awaits its promotion (toward ``judge_to`` when given)."""
    op = dict(_status(cluster, namespace).get("operation") or {})
    ready = op.get("phase") == "AwaitingPromotion" and judge_to in (None, op.get("judgeTo"))
    return op if ready else None


def _promote(cluster: Cluster, namespace: str, revision: str) -> None:
    cluster.kubectl("annotate", "genrmpool", POOL, "-n", namespace, f"genrm.io/promote={revision}", "--overwrite")


def _manual_promotion_under_an_operator_kill(cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
    _patch(cluster, namespace, {"judgeUpdate": {"blueGreen": {"promotion": "Manual", "scaleDownDelaySeconds": 120}},
                                "model": {"path": "sim/judge-v4"}})
    waiting = wait_for("the preview to await its promotion", lambda: _awaiting(cluster, namespace), 120, interval=0.2)
    _promote(cluster, namespace, waiting["judgeTo"])
    operator.kill()
    time.sleep(1)
    operator.start()
    wait_for("the manual promotion", lambda: _active(cluster, namespace) == waiting["judgeTo"], 60)


def _rollback(cluster: Cluster, namespace: str, previous: str) -> None:
    _patch(cluster, namespace, {"model": {"path": "sim/judge-v3"}})
    back = wait_for("the switch back to await its promotion", lambda: _awaiting(cluster, namespace, previous), 60,
                    interval=0.2)
    _promote(cluster, namespace, back["judgeTo"])
    wait_for("the rollback", lambda: _active(cluster, namespace) == previous, 30)


def test_twenty_steps_three_judge_changes_and_a_rollback_never_mix_a_step(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    judge_update = {"strategy": "BlueGreen",
                    "blueGreen": {"promotion": "IdleGap", "idleGapSeconds": 1, "scaleDownDelaySeconds": 3}}
    # One served name for every judge: clients keep their model name while the weights (the path) change.
    cluster.kubectl("apply", "-f", "-", input=pool_manifest(POOL, namespace, replicas=2, judgeUpdate=judge_update,
                                                            model={"path": "sim/judge", "servedName": "judge"}))
    cluster.wait_serving(namespace, POOL, 2)
    url = cluster.service_answering(namespace, POOL)
    model = "judge"
    first = _active(cluster, namespace)
    load = StepLoad(url, model)
    steps: list[Step] = []
    rollbacks, before = 0, first
    try:
        for n in range(STEPS):
            if n == 3:  # mid-step: promoted at the next idle gap
                changer = threading.Timer(0.2, _patch, (cluster, namespace, {"model": {"path": "sim/judge-v2"}}))
                changer.start()
                steps.append(load.step(n))
                changer.join()
            else:
                steps.append(load.step(n))
            if n == 8:  # mid-gap
                _patch(cluster, namespace, {"model": {"path": "sim/judge-v3"}})
            if n == 13:  # a manual promotion with the operator SIGKILLed under it, then a rollback
                before = _active(cluster, namespace)
                _manual_promotion_under_an_operator_kill(cluster, namespace, operator)
            if n == 16:  # roll back within the scale-down delay: the previous revision, still fenced, comes back
                _rollback(cluster, namespace, before)
                rollbacks += 1
            time.sleep(GAP_SECONDS)
    finally:
        load.close()
    wait_for("the last switch to end", lambda: not _status(cluster, namespace).get("operation"), 180)
    lost = sum(len(s.failures) for s in steps)
    mixed_steps = mixed(steps)
    # Promotions as the trainer sees them: the judge of one step differs from the last one's. (Events are
    # no record: the one of the promotion under the operator's SIGKILL may never be posted.)
    judged = [sorted(s.revisions) for s in steps]
    promotions = sum(1 for a, b in itertools.pairwise(judged) if a != b)
    print(f"\njudge-switch-e2e: steps={len(steps)} mixed_steps={len(mixed_steps)} lost={lost} "
          f"promotions={promotions} rollbacks={rollbacks}", flush=True)
    assert not mixed_steps, [(s.number, sorted(s.revisions)) for s in mixed_steps]
    assert lost == 0, [(s.number, s.failures[:3]) for s in steps if s.failures]
    assert len({next(iter(s.revisions)) for s in steps}) == 4 and next(iter(steps[0].revisions)) == first
    assert promotions == 4, judged
    # Idle-gap promotions (the first two switches) fall between steps, never inside one.
    idle_gap = _promotion_events(cluster, namespace)[:2]
    assert len(idle_gap) == 2, idle_gap
    for at, message in idle_gap:
        inside = [s.number for s in steps if s.started <= at <= s.ended]
        assert not inside, f"{message} at {at:.2f} falls inside step(s) {inside}"
    outcomes = [h["outcome"] for h in _switches(cluster, namespace)]
    assert outcomes.count("Succeeded") >= 3 and "Superseded" in outcomes, outcomes

"""The one write-then-act rule (`core.model.deliver`) that the shell and the core tests' world follow."""

from __future__ import annotations

from genrm_operator.api.pool import GenRMPoolStatus
from genrm_operator.api.status import JudgeStatus, Operation
from genrm_operator.core.model import (
    REPORT_DELAY_SECONDS,
    CreatePod,
    DeletePod,
    Plan,
    SetPublished,
    Verify,
    deliver,
)

BEFORE = GenRMPoolStatus.model_validate({"nextOrdinal": 2, "operationCount": 1})


def test_a_new_decision_is_written_before_the_actions_that_need_its_record() -> None:
    after = BEFORE.evolve(next_ordinal=3)
    actions = (Verify("judge-0", "u0", None), CreatePod("judge-2", 2), SetPublished("judge-1", "u1", True),
               DeletePod("judge-3", "u3"))
    d = deliver(BEFORE, Plan(status=after, actions=actions), None, 0.0)
    assert d.write and d.unwritten_since is None
    assert d.beside == (actions[0], actions[2]), "probes and publishes go beside the write"
    assert d.after == (actions[1], actions[3])
    assert d.sent(True) == actions and d.sent(False) == d.beside, "a refused write sends only those beside it"


def test_a_due_create_writes_even_an_unchanged_status_and_one_held_back_does_not() -> None:
    retry = (CreatePod("judge-2", 2),)
    assert deliver(BEFORE, Plan(status=BEFORE, actions=retry), None, 0.0).write
    held = deliver(BEFORE, Plan(status=BEFORE, actions=retry), None, 0.0, due=())
    assert not held.write and held.beside == retry and not held.after, "no write: nothing waits for one"


def test_nothing_changed_nothing_written() -> None:
    d = deliver(BEFORE, Plan(status=BEFORE, actions=(DeletePod("judge-3", "u3"),)), None, 5.0)
    assert not d.write and d.beside == (DeletePod("judge-3", "u3"),) and d.unwritten_since is None


def test_counts_alone_wait_for_the_operations_next_write_up_to_the_report_delay() -> None:
    op = Operation.model_validate({"id": "op-1", "type": "ScaleIn", "from": 3, "to": 2, "phase": "Draining",
                                   "startedAt": "2026-01-01T00:00:00Z",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"})
    before = BEFORE.evolve(operation=op)
    counted = before.evolve(ready_replicas=2)
    d = deliver(before, Plan(status=counted), None, 100.0)
    assert not d.write and d.unwritten_since == 100.0
    later = deliver(before, Plan(status=counted), d.unwritten_since, 100.0 + REPORT_DELAY_SECONDS)
    assert later.write and later.unwritten_since is None


def test_a_write_gates_when_actions_wait_for_it_now_or_next_step() -> None:
    """What the shell sends before other pools' records (`shell.writeorder`): a write that this step's
    actions wait for, or that records work the next step does (a new operation, victims, creates)."""
    def op(**fields: object) -> Operation:
        return Operation.model_validate({"id": "op-1", "type": "ScaleIn", "from": 3, "to": 2, "phase": "Pending",
                                         "startedAt": "2026-01-01T00:00:00Z",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z", **fields})
    started = BEFORE.evolve(operation=op())
    victims = started.evolve(operation=op(victims=[{"name": "judge-2", "uid": "u2", "needsDrain": True}]))
    assert deliver(BEFORE, Plan(status=started), None, 0.0).gates, "a new operation"
    assert deliver(started, Plan(status=victims), None, 0.0).gates, "its victims: unpublished next step"
    draining = victims.evolve(operation=op(phase="Draining", victims=victims.operation.victims))  # type: ignore[union-attr]
    assert not deliver(victims, Plan(status=draining), None, 0.0).gates, "a phase: nothing waits for it"
    assert not deliver(draining, Plan(status=BEFORE), None, 0.0).gates, "the end: nothing waits for it"
    assert deliver(BEFORE, Plan(status=BEFORE.evolve(next_ordinal=3), actions=(CreatePod("judge-2", 2),)),
                   None, 0.0).gates, "a create waits for it"
    judged = BEFORE.evolve(judge=JudgeStatus(active="aaa"))
    assert deliver(judged, Plan(status=judged.evolve(judge=JudgeStatus(active="bbb"))), None, 0.0).gates, \
        "a promoted judge revision: the Service moves and the fence goes next step"

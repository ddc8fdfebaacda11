"""``genrm_operator.shell.expectations``: done actions the watch has not shown yet are not repeated.

Aspects under test: the same action on the same pod is held back within the window and due again
after it; a different action of the same kind on the pod (publish after unpublish, delete after
create, a newer pod incarnation) is due at once; kinds are independent; actions that are not
remembered (drain calls) are always due; an action never marked done is always due.
"""

from __future__ import annotations

from genrm_operator.core.model import CreatePod, DeletePod, Drain, SetPublished, Verify
from genrm_operator.shell.expectations import Expectations


def test_a_done_action_is_held_back_within_the_window_only() -> None:
    expected = Expectations(seconds=5.0)
    create = CreatePod("judge-3", 3)
    assert expected.due(create, 100.0)
    expected.done(create, 100.0)
    assert not expected.due(create, 101.0) and not expected.due(create, 104.9)
    assert expected.due(create, 105.0)


def test_another_action_on_the_pod_goes_at_once_and_replaces_the_remembered_one() -> None:
    expected = Expectations()
    unpublish, publish = SetPublished("judge-1", "uid-1", False), SetPublished("judge-1", "uid-1", True)
    expected.done(unpublish, 10.0)
    assert expected.due(publish, 10.5)
    expected.done(publish, 10.5)
    assert expected.due(unpublish, 11.0), "the unpublish is no longer the last label change"
    assert expected.due(SetPublished("judge-1", "uid-2", True), 11.0), "a new incarnation of the pod"
    expected.done(CreatePod("judge-1", 1), 11.0)
    assert expected.due(DeletePod("judge-1", "uid-1"), 11.5)
    assert not expected.due(publish, 11.5), "kinds are independent: the publish is still remembered"


def test_unremembered_and_undone_actions_are_always_due() -> None:
    expected = Expectations()
    drain = Drain("judge-1", "d-1", "fence")
    expected.done(drain, 1.0)
    assert expected.due(drain, 1.1)
    assert expected.due(Verify("judge-2", "uid-2", "judge-0"), 1.1)

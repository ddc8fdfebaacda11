"""Actions already done that the watch has not shown yet: not repeated for a while.

Every step decides from the pods as the watch shows them, and the watch lags the operator's own
writes: a step right after a create, a delete or a label patch often still sees the pod as it
was and decides the same action again. Each is idempotent, so repeating it is safe, but each is
an API write, and in a scale storm such repeats (AlreadyExists creates, second deletes, patches to
a label already set) were a large share of the operator's pod writes
(figures: docs/performance.md#measurements-behind-the-code). The ReplicaSet
controller's expectations solve the same problem; here it is simpler, because each action names
its pod: the last action done on each pod (per kind of action) is remembered for
``EXPECT_SECONDS``, and only that same action is held back meanwhile. A different action on the
pod (publish after unpublish, delete after create) goes at once and replaces it; a failed action
is never remembered, so the next step repeats it.
"""

from __future__ import annotations

from ..core.model import Action, CreatePod, DeletePod, SetPublished, Verify

EXPECT_SECONDS = 5.0
"""How long a done action is held back: well past the watch's lag in a storm, short enough that
an action undone by someone else is redone soon."""
KINDS: dict[type, str] = {CreatePod: "pod", DeletePod: "pod", SetPublished: "published", Verify: "verification"}
"""Actions that are remembered, by what they change on the pod: a create and a delete both decide
whether it exists. Drain calls are not: their answers update the sidecar's report at once."""


class Expectations:
    """The actions done lately, one per pod and kind."""

    def __init__(self, seconds: float = EXPECT_SECONDS) -> None:
        self._seconds = seconds
        self._done: dict[tuple[str, str], tuple[Action, float]] = {}

    def due(self, action: Action, now: float) -> bool:
        """Whether ``action`` should be carried out: not when it was done within the window."""
        kind = KINDS.get(type(action))
        if kind is None:
            return True
        done = self._done.get((kind, action.name))
        return done is None or done[0] != action or now - done[1] >= self._seconds

    def done(self, action: Action, now: float) -> None:
        """``action`` succeeded at ``now``."""
        if (kind := KINDS.get(type(action))) is not None:
            self._done[(kind, action.name)] = (action, now)
            self._done = {key: (a, t) for key, (a, t) in self._done.items() if now - t < self._seconds}

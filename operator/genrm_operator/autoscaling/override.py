"""Precedence with other writers of ``spec.replicas``: the autoscaler adopts, never fights.

In mode Auto the autoscaler expects ``spec.replicas`` to equal the last count it
decided (``status.autoscaler.desiredReplicas``). Any other value was written by
someone else (``kubectl scale``, an HPA, KEDA, a GitOps sync), unless it is the
count the autoscaler's own last applied change started from: then that write was
lost (crash or error between the status PUT and the scale write) and the next
decision simply repeats it. On an external write:

* the last writer wins: the external value becomes the autoscaler's current count;
* it enters the recommendation history as if the autoscaler had recommended it,
  so the stabilization windows protect it: an external scale-up is kept for the
  scale-down window (600 s by default) and an external scale-down for the
  scale-up window, unless the load needs more (or less) than that; the bounds
  (min/maxReplicas) still apply at once;
* condition ``AutoscalerOverridden`` turns True (reason ``ExternalWrite``), with a
  Warning Event, and stays True until the autoscaler next changes the count
  itself.

Two controllers that keep writing (say an HPA left on the same pool) therefore
show up as a standing ``AutoscalerOverridden=True`` and Events, and the
autoscaler only moves the pool when its own windows say so, instead of the
two of them flipping it every interval (KEDA #5288, kubeai #67).

Pure, like the rest of the control law: the shell reads the pool, calls these two
functions before :func:`~genrm_operator.autoscaling.decide`, and sets the condition and
posts the Event.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from genrm_operator.api.autoscaling import AutoscalerStatus, AutoscalingSpec

from .stabilize import remember


def external_write(spec: AutoscalingSpec, replicas: int, status: AutoscalerStatus | None) -> bool:
    """True when ``replicas`` (spec.replicas) was written by someone else (see the module docstring)."""
    if spec.mode != "Auto" or status is None or status.desired_replicas in (None, replicas):
        return False
    last = status.decisions[-1] if status.decisions else None
    lost_own_write = (last is not None and last.applied and last.desired_replicas == status.desired_replicas
                      and last.current_replicas == replicas)
    return not lost_own_write


def adopt(spec: AutoscalingSpec, status: AutoscalerStatus, replicas: int, now: datetime) -> AutoscalerStatus:
    """``status`` with an external count recorded as a recommendation, so the windows protect it."""
    behavior = spec.behavior
    longest = timedelta(seconds=max(behavior.scale_up.stabilization_window_seconds,
                                    behavior.scale_down.stabilization_window_seconds))
    return status.evolve(recommendations=remember(status.recommendations, replicas, now, longest),
                         desired_replicas=replicas)

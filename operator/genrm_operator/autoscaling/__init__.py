"""The autoscaler's control law, pure: observations and status in, a decision and the next status out.

No Kubernetes, kopf, HTTP or Prometheus client here (an import-linter contract enforces
it): the operator shell scrapes, builds an :class:`Observation`, calls :func:`decide`
once per ``intervalSeconds`` and persists ``Decision.status`` in ``status.autoscaler``.
What each metric type reads and how is :mod:`.signals` (the table both metric sources
follow); replica counts are computed in integer milli-units (:mod:`.milli`).
"""

from .decide import Decision, decide
from .metrics import MetricOutcome
from .observation import Observation, ReplicaSample, ReplicaState

__all__ = [
    "Decision",
    "MetricOutcome",
    "Observation",
    "ReplicaSample",
    "ReplicaState",
    "decide",
]

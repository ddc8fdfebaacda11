"""Deterministic names and labels of a pool's children.

Why deterministic: a create that is retried after a crash or a lost response
must hit AlreadyExists instead of making a second pod, so every child name is a
pure function of the pool and, for pods, an ordinal that the status remembers.
"""

from __future__ import annotations

from genrm_contract.sidecar import OPERATOR_DRAIN_PREFIX

from ..api.pool import GROUP

POOL_LABEL = f"{GROUP}/pool"
ORDINAL_LABEL = f"{GROUP}/ordinal"
PUBLISHED_LABEL = f"{GROUP}/published"
REVISION_LABEL = f"{GROUP}/revision"
JUDGE_REVISION_LABEL = f"{GROUP}/judge-revision"
"""The pod's judge revision (`core.judge`): what it answers, as opposed to its template revision."""
EVER_PUBLISHED_ANNOTATION = f"{GROUP}/ever-published"
VERIFICATION_ANNOTATION = f"{GROUP}/verification"
VERIFICATION_MESSAGE_ANNOTATION = f"{GROUP}/verification-message"
PROMOTE_ANNOTATION = f"{GROUP}/promote"
"""On the pool: ``kubectl annotate genrmpool <pool> genrm.io/promote=<revision>`` is a Manual promotion
(Argo Rollouts' ``promote``); only the judge revision waiting for promotion is promoted by it."""
TOKEN_KEY = "token"
ENGINE_CONTAINER = "engine"
GATEWAY_CONTAINER = "gateway"
ENGINE_KEY_CONTAINER = "engine-key"
"""The init container of a key-protected pool (``spec.engine.apiKey``) and its volume's name."""


def pod_name(pool: str, ordinal: int) -> str:
    """Name of the replica pod with this ordinal."""
    return f"{pool}-{ordinal}"


def secret_name(pool: str) -> str:
    """Secret holding the pool's sidecar control token."""
    return f"{pool}-control"


def service_name(pool: str) -> str:
    """Service selecting the pool's published replicas."""
    return pool


def activator_slice_name(pool: str) -> str:
    """EndpointSlice that points the pool's Service at the activator while no replica serves."""
    return f"{service_name(pool)}-activator"


def pdb_name(pool: str) -> str:
    """PodDisruptionBudget of the pool."""
    return pool


def selector(pool: str) -> str:
    """Serialised label selector of all replica pods (scale subresource, HPA)."""
    return f"{POOL_LABEL}={pool}"


def drain_id(pod_uid: str) -> str:
    """Drain id bound to one pod incarnation: a stale confirmation can never release another pod."""
    return f"{OPERATOR_DRAIN_PREFIX}{pod_uid}"


def common_labels(pool: str) -> dict[str, str]:
    """Recommended Kubernetes labels plus the pool label, shared by all children."""
    return {
        "app.kubernetes.io/name": "genrm",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": "judge",
        "app.kubernetes.io/managed-by": "genrm-operator",
        POOL_LABEL: pool,
    }

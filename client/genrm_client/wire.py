"""What the client reads and sends on the wire: header names, the retry marker, routes, reasons.

Why a copy here and not an import of ``genrm_contract`` (where the pool defines them): this package
is installed alone on training machines, with httpx and the standard library only, while
``genrm_contract`` ships inside the operator's distribution (pydantic, the Kubernetes client). The
values are few and stable, and ``tests/client/test_wire.py`` holds every one of them equal to the
contract's, so the copy cannot drift silently. The pool never imports this package.
"""

from __future__ import annotations

REQUEST_ID_HEADER = "x-request-id"
"""Sent with every attempt of one call (the same value each time), echoed by the gateway."""
REASON_HEADER = "x-genrm-reason"
"""The pool's reason for a refusal (``draining``, ``invalidApiKey``, ...)."""
SHOULD_RETRY_HEADER = "x-should-retry"
"""``true`` or ``false`` on every refusal of the pool: whether the same request may be sent again."""
REVISION_HEADER = "x-genrm-revision"
"""The judge revision that answered, on every answer of the pool's gateway; without it (an engine
reached directly) the client reads SGLang's ``weight_version`` in the answer's body. On a request, the
pin: only that revision may answer it (a step's calls, once the step knows its revision)."""

HELD_HEADER = "x-genrm-held-seconds"
"""On an answer the pool's activator forwarded: how long it held the request while the pool had no
serving replica."""

REVISION_RETIRED = "revisionRetired"
"""The pool's ``409`` for a request pinned to a revision it no longer serves (a judge switch)."""

OVERLOAD_REASONS = frozenset({"holdQueueFull", "tooManyConnections"})
"""Retryable refusals that mean the pool is overloaded (not one replica leaving): a batch sends
fewer at once after one, as after a ``429``."""

CHAT_PATH = "/v1/chat/completions"
GENERATE_PATH = "/generate"
CLASSIFY_PATH = "/classify"
DEMAND_PATH = "/v1/genrm/demand"
"""The demand-hint route on the pool's Service (``POST``, the pool's API key, answered ``202``)."""

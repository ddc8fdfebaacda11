"""Demand hints: a trainer tells a pool, ahead of time, that a judge phase is coming.

Why a hint at all: an autoscaler that follows load reacts after the load has arrived, and a GPU
replica takes minutes to load its model, so the first minutes of every judge phase queue on too few
replicas (or, at zero, on none). The trainer knows the phase is coming before the first request; a
hint turns that knowledge into replicas that are already serving when it starts.

One hint says: about ``requests`` judge requests, starting within ``startsWithinSeconds``, spread
over ``forSeconds``. The operator holds the pool at a replica floor sized for that rate from the
moment it sees the hint until ``startsWithinSeconds + forSeconds`` later; then the hint expires by
itself. It reaches the operator two ways, both defined here once:

* ``POST`` :data:`DEMAND_PATH` to the pool's Service (any replica's gateway), with the same API key
  as judge requests when the pool has one; the gateway keeps the hint in its state document
  (:class:`genrm_contract.sidecar.StateDocument`) until it expires, and the operator reads it from
  there within one long poll;
* the pool's :data:`DEMAND_ANNOTATION`, holding one hint as JSON, for a person with ``kubectl``.

The operator anchors every hint at the moment it first sees it and remembers the ids it has seen,
so a hint reported again (by a second gateway, or by an annotation left in place) counts once.
:func:`send` is the trainer's helper: the standard library only, so any training job can import it.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

DEMAND_PATH = "/v1/genrm/demand"
"""The traffic port's route for a hint (``POST``, JSON :class:`DemandHint`; answered ``202``)."""
DEMAND_ANNOTATION = "genrm.io/demand"
"""The pool annotation that holds one hint as JSON (``kubectl annotate --overwrite``)."""
MAX_HINTS = 16
"""Active hints one gateway keeps; a further one with a new id is refused (``429``)."""
MAX_HINT_BODY_BYTES = 4096
"""A hint's JSON body is small; anything larger is refused before it is parsed (``413``)."""
MAX_HINT_SECONDS = 86_400

HintId = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")]


class DemandHint(BaseModel):
    """One announced judge phase, as the trainer sends it and the gateway reports it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    id: HintId = Field(default_factory=lambda: "h" + secrets.token_hex(8))
    """Names the phase; sending the same id again replaces the hint instead of adding one."""
    requests: int = Field(ge=1, le=1_000_000_000)
    """About how many judge requests the phase sends."""
    starts_within_seconds: int = Field(0, alias="startsWithinSeconds", ge=0, le=3600)
    """The phase's first request comes within this many seconds (0: now)."""
    for_seconds: int = Field(alias="forSeconds", ge=1, le=MAX_HINT_SECONDS)
    """Over how many seconds the requests are spread."""

    @property
    def lifetime(self) -> int:
        """Seconds from the moment the hint is seen until it expires."""
        return self.starts_within_seconds + self.for_seconds

    @property
    def rate(self) -> float:
        """The phase's request rate (requests per second) the floor is sized for."""
        return self.requests / self.for_seconds

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")


def send(url: str, requests: int, within: int, duration: int, api_key: str | None = None,
         hint_id: str | None = None, timeout: float = 10.0) -> dict[str, object]:
    """Announce a judge phase to the pool at ``url`` (its Service, e.g. ``http://judge.ns:8000``).

    Returns the gateway's answer (the hint's ``id`` and when it expires). Raises
    ``urllib.error.HTTPError`` when the gateway refuses it (400 malformed, 401 without the pool's
    key, 429 too many hints). Sending again with the same ``hint_id`` replaces the hint.
    """
    hint = DemandHint(requests=requests, starts_within_seconds=within, for_seconds=duration,
                      **({"id": hint_id} if hint_id else {}))
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url.rstrip("/") + DEMAND_PATH, data=json.dumps(hint.wire()).encode(),
                                     headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        result: dict[str, object] = json.loads(answer.read())
        return result

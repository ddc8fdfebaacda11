"""The operator <-> activator contract: what a pool at zero routes to, and what the activator holds.

Why an activator: a pool at zero replicas has a Service with no endpoints, and a client's connection
is refused. The activator is what the Service points at while a pool has no serving replica: it
accepts the request, holds it, reports it (so the operator wakes the pool at once) and forwards it
to the first replica that serves.

Why the operator tells it everything: the activator then needs no Kubernetes credentials. The
operator already follows every gateway with a long poll; it follows every activator the same way
(:data:`STATE_PATH`, versioned), and pushes each pool's route (:class:`PoolRoute`: the Host values
its clients use, and the addresses of its serving replicas, none while it wakes) with an
idempotent ``PUT``. Held requests are demand the operator acts on like a hint.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from genrm_contract.demand import DemandHint

ROUTES_PATH = "/v1/routes"
"""``PUT {ROUTES_PATH}/{namespace}/{pool}`` sets a pool's :class:`PoolRoute`; ``DELETE`` removes it."""
MAX_HOSTS = 16
MAX_TARGETS = 256

Address = Annotated[str, Field(pattern=r"^[0-9a-fA-F.:\[\]]+:[0-9]{1,5}$", max_length=64)]
"""A replica's traffic address, ``ip:port`` (``[v6]:port``)."""
HostValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9.:\[\]-]+$", max_length=255)]


class PoolRoute(BaseModel):
    """How the activator serves one pool's clients."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    hosts: tuple[HostValue, ...] = Field(min_length=1, max_length=MAX_HOSTS)
    """The ``Host`` values the pool's clients send (the ClusterIP and the Service's DNS names, with and
    without the port), lower case: how a request is told apart from another pool's."""
    targets: tuple[Address, ...] = Field((), max_length=MAX_TARGETS)
    """The serving replicas' traffic addresses; empty while the pool is at zero or waking: hold."""
    hold_timeout_seconds: float = Field(alias="holdTimeoutSeconds", gt=0, le=3600)
    """A request held longer gets ``503 holdTimeout`` (with ``Retry-After``)."""
    max_held: int = Field(alias="maxHeld", ge=1, le=100_000)
    """Requests held at once for this pool; one more gets ``503 holdQueueFull``."""

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")


class ActivatorState(BaseModel):
    """``GET /v1/state``: the requests the activator holds or forwards, per pool (``namespace/name``)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    held: dict[str, int] = Field(default_factory=dict)
    """Requests waiting for a replica, per pool that has any."""
    demand: dict[str, tuple[DemandHint, ...]] = Field(default_factory=dict)
    """Demand hints sent to a pool through the activator (the pool at zero), until they expire."""
    boot_id: str = Field(alias="bootId")
    version: int = Field(ge=0)
    """Grows whenever a pool starts holding, holds more, or its hints change (a long poll waits for
    another version)."""

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")


def pool_key(namespace: str, name: str) -> str:
    """How a pool is named in :class:`ActivatorState` and the routes' paths."""
    return f"{namespace}/{name}"

"""Base class and helpers shared by every GenRMPool API model.

Why a base class: the same pydantic models are the single source of truth for
the CRD's OpenAPI schema (see ``genrm_operator.crdgen``) and for the operator's
parsing of live objects, so field names, defaults and constraints cannot drift
between what the API server enforces and what the code assumes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, with milliseconds only when they are not zero: the one timestamp format.

    Milliseconds matter to the autoscaler: with a 2-second interval a window edge truncated
    to whole seconds would let a restart change which recommendations are inside the window.
    The state machine stamps whole seconds (metav1.Time's precision), which this writes as
    Kubernetes does.
    """
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Inverse of :func:`format_time` (accepts any RFC 3339 offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _wire_precision(moment: datetime) -> datetime:
    """Truncated to what :func:`format_time` keeps, so a value equals itself after a status round trip."""
    return moment.astimezone(UTC).replace(microsecond=moment.microsecond // 1000 * 1000)


Timestamp = Annotated[
    AwareDatetime,
    AfterValidator(_wire_precision),
    PlainSerializer(format_time, return_type=str),
    WithJsonSchema({"type": "string"}),
]
"""A point in time in the status: a ``datetime`` in code, :func:`format_time` on the wire."""


class ApiModel(BaseModel):
    """Kubernetes-style model: camelCase on the wire, unknown fields rejected.

    ``extra="forbid"`` mirrors the API server's strict field validation so a
    typo fails in unit tests the same way it fails on ``kubectl apply``.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """Serialise with API field names, leaving out unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def evolve(self, **changes: Any) -> Self:
        """A copy with ``changes`` (by field name), validated like a new object.

        Used for every transition instead of ``model_copy(update=...)``, which skips validation:
        a phase that does not belong to the operation's type, or a naive time, fails here.
        """
        return self.model_validate({**dict(self), **changes})


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule with a user-facing message)."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules into the generated CRD."""
    return {"x-kubernetes-validations": list(rules)}

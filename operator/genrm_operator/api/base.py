"""Base class and helpers shared by every GenRMPool API model.

Why a base class: the same pydantic models are the single source of truth for
the CRD's OpenAPI schema (see ``genrm_operator.crdgen``) and for the operator's
parsing of live objects, so field names, defaults and constraints cannot drift
between what the API server enforces and what the code assumes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


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


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule with a user-facing message)."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules into the generated CRD."""
    return {"x-kubernetes-validations": list(rules)}

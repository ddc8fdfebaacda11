"""The GenRMPool API (group genrm.io, version v1alpha1) as pydantic models."""

"""Wire contracts shared by the operator and the gateway sidecar (standard library and pydantic only)."""

"""Local control plane and node agent built from Go modules (no Docker)."""

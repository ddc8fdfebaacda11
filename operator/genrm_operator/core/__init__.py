"""The functional core: pure decisions over observed state and time (no kopf, no Kubernetes)."""

"""The thin kopf/Kubernetes shell around the functional core."""

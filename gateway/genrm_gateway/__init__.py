"""Gateway sidecar: the only ingress of a GenRM replica pod."""

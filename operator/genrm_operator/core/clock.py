"""RFC 3339 timestamps for the status, from and to the float seconds the core reasons in."""

from __future__ import annotations

from datetime import UTC, datetime


def to_rfc3339(seconds: float) -> str:
    """Kubernetes-style timestamp with second precision (as metav1.Time)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_rfc3339(stamp: str) -> float:
    """Seconds since the epoch of a timestamp written by :func:`to_rfc3339` or Kubernetes."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

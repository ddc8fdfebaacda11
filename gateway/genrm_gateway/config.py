"""Gateway settings: flags with environment fallbacks, and the control token.

Why environment fallbacks: the chart configures the sidecar through env (and mounts the pool's
token as a file), while humans and tests use flags; both must give the same settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

TOKEN_ENV = "GENRM_CONTROL_TOKEN"
TOKEN_FILE_ENV = "GENRM_CONTROL_TOKEN_FILE"


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine listens; the gateway only ever talks HTTP/1.1 to a loopback engine."""

    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> EngineAddress:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the engine URL must be http://host:port, got {url!r}")
        return cls(parts.hostname, parts.port or 80)

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 8000
    engine: EngineAddress = EngineAddress("127.0.0.1", 30000)
    max_body_bytes: int = 1 << 20
    quiet_seconds: float = 2.0
    propagation_seconds: float = 5.0
    engine_poll_seconds: float = 1.0


def read_control_token() -> str | None:
    """The pool's bearer token; the mounted file wins over the variable and is re-read each time,
    so a rotated Secret takes effect without a restart."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return None
        return token or None
    return os.environ.get(TOKEN_ENV) or None

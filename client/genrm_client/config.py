"""Where a pool is and how to talk to it: one value both clients and every adapter take.

Why from the environment too: the framework adapters are loaded by the frameworks themselves (a file
path in a config), with no place to pass arguments, so they read the same settings from variables
that a launch script or a Ray runtime environment sets once.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from genrm_client.retry import RetryPolicy
from genrm_client.window import WindowLaw

URL_ENV = "GENRM_URL"
API_KEY_ENV = "GENRM_API_KEY"
MODEL_ENV = "GENRM_MODEL"
DEADLINE_ENV = "GENRM_DEADLINE_SECONDS"


@dataclass(frozen=True)
class PoolConfig:
    url: str
    """The pool's Service, e.g. ``http://judge.rl.svc:8000``."""
    api_key: str | None = None
    """The pool's API key (``spec.engine.apiKey``), sent as ``Authorization: Bearer``."""
    model: str | None = None
    """The ``model`` of chat requests (SGLang serves one model; None leaves it out)."""
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    window: WindowLaw = field(default_factory=WindowLaw)
    read_timeout_s: float = 900.0
    """One attempt's wait for its answer (the gateway's own engine timeout is 600 s)."""
    connect_timeout_s: float = 5.0
    max_connections: int = 1024
    """Open connections at most (above the window's maximum, so no call waits for one)."""
    hint_prefix: str = field(default_factory=lambda: "t" + secrets.token_hex(3))
    """Starts this client's demand-hint ids, so two trainers' ``step 12`` are two hints."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PoolConfig:
        """``GENRM_URL`` (required), ``GENRM_API_KEY``, ``GENRM_MODEL``, ``GENRM_DEADLINE_SECONDS``."""
        url = environ.get(URL_ENV)
        if not url:
            raise RuntimeError(f"{URL_ENV} is not set: the judge pool's Service, e.g. http://judge.rl.svc:8000")
        deadline = environ.get(DEADLINE_ENV)
        policy = RetryPolicy(deadline_s=float(deadline)) if deadline else RetryPolicy()
        return cls(url.rstrip("/"), environ.get(API_KEY_ENV) or None, environ.get(MODEL_ENV) or None, policy)

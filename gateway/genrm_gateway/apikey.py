"""A key-protected engine (``spec.engine.apiKey``): how its key reaches the engine and the gateway
without any command line, and how judge clients present it.

Why files written by an init container: SGLang 0.5.23 takes its key only from ``--api-key``, where
``ps``, ``/proc`` and the pod spec show it, or from a ``--config`` YAML file. ``genrm-gateway
engine-key`` runs as the pod's init container with the key in its environment (a ``secretKeyRef``,
which the pod spec shows only as a reference) and writes the engine's config file and the gateway's
key file into a memory-backed volume of the pod. Engine and gateway then use the key the pod
started with for its whole life: were the gateway to read the Secret itself, a gateway restarted
after the Secret changed would hold a key its engine does not.

Why the traffic port demands the same key: a key-protected pool stays protected behind its Service,
and a client that talks to SGLang with a key (the ``openai`` client's ``Authorization: Bearer``)
works unchanged. The gateway never passes a client's ``Authorization`` on; it sends its own.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import yaml
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_FILE, RefusalReason
from starlette.types import Scope

from genrm_gateway.errors import Refusal

FILE_MODE = 0o444
"""Readable by every user: the volume is the pod's own, mounted only into its containers, and an
engine image may run as any user (SGLang's own image as root, the project's as 10001)."""
_WWW_AUTHENTICATE = (b"www-authenticate", b"Bearer")
_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def checked(raw: str, source: str) -> str:
    """The key without surrounding whitespace (a Secret made from a file often ends in a newline).

    It must be visible ASCII: it travels in an ``Authorization`` header, which can carry no line
    break and, at its ends, no space. It must not begin with ``-``: SGLang turns its ``--config``
    file into the arguments ``--api-key <key>``, and its parser takes such a value for a flag and
    exits ("expected one argument"), so the engine would crash-loop (``secrets.token_urlsafe``
    begins a key with ``-`` once in 64). ``source`` names where it came from (the key is never shown).
    """
    key = raw.strip()
    if not key:
        raise ValueError(f"the API key in {source} is empty")
    if not all("!" <= char <= "~" for char in key):
        raise ValueError(f"the API key in {source} must be visible ASCII characters only (no spaces, no "
                         "control or non-ASCII characters): it is sent as an HTTP header")
    if key.startswith("-"):
        raise ValueError(f"the API key in {source} must not begin with '-': SGLang's argument parser would "
                         "read it as a flag and the engine would not start")
    return key


def write_engine_files(directory: Path, key: str) -> None:
    """The engine's ``--config`` file and the gateway's key file (the init container's work).

    Again and again if need be: when a pod's sandbox is recreated its init containers run again
    over the same ``emptyDir``, where the files of the first run are read-only to their owner (a
    non-root user cannot open them for writing). So each file is written beside its place and
    renamed over it, which needs only the directory's write permission, and a reader never sees a
    half-written key.
    """
    _replace(directory / ENGINE_CONFIG_FILE, yaml.safe_dump({"api-key": key}))
    _replace(directory / ENGINE_KEY_FILE, key)


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)  # left by a run that stopped between writing and renaming
    temporary.write_text(text)
    os.chmod(temporary, FILE_MODE)
    os.replace(temporary, path)


def read_key_file(path: str) -> str:
    """The gateway's key, checked as the init container checked it."""
    try:
        return checked(Path(path).read_text(), path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the API key file {path}: {exc}") from None


class ClientAuth:
    """The traffic port's check: ``Authorization: Bearer <key>``, the scheme in any case, the key
    compared in constant time; else 401 (``unauthenticated`` without a bearer token,
    ``invalidApiKey`` with another key).

    Which requests need it follows SGLang's ``decide_request_auth``: all but ``OPTIONS`` and paths
    starting with ``/health``, ``/ready`` or ``/metrics``, so a client without a key learns nothing
    it could not learn from SGLang itself (those paths are then refused by the route table anyway).
    """

    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def refusal(self, scope: Scope) -> Refusal | None:
        if scope["method"] == "OPTIONS" or scope["path"].startswith(_OPEN_PREFIXES):
            return None
        presented = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        scheme, _, token = presented.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return Refusal(401, RefusalReason.UNAUTHENTICATED,
                           "this pool needs its API key: Authorization: Bearer <key>",
                           (_WWW_AUTHENTICATE,))
        if not hmac.compare_digest(token, self._key):
            return Refusal(401, RefusalReason.INVALID_API_KEY, "the API key is not this pool's", (_WWW_AUTHENTICATE,))
        return None

"""Wait until the gateway next door reports Drained: both containers' preStop hooks use this.

Why standard library only, and why a module of its own: the engine container must not be stopped
while its gateway still has admitted requests, so its preStop hook waits for Drained too; but the
engine image has python3 and not the gateway. The pod builder ships this very file's source as
that hook (``python3 -c <source> <control port> <deadline seconds>``), and the gateway's own hook
(``genrm-gateway drain --wait``) calls the same function, so the wait and the token lookup exist
once. The contract's constants for them are defined here and re-exported by ``sidecar``.
"""

import json
import os
import sys
import time
import urllib.request

STATE_PATH = "/v1/state"
DRAINED = "Drained"
TOKEN_ENV = "GENRM_CONTROL_TOKEN"
TOKEN_FILE_ENV = "GENRM_CONTROL_TOKEN_FILE"


def control_token() -> str | None:
    """The pool's bearer token: the mounted file wins over the variable and is read on every call,
    so a rotated Secret takes effect without a restart."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path) as file:
                return file.read().strip() or None
        except OSError:
            return None
    return os.environ.get(TOKEN_ENV) or None


def drained_state(port: int) -> dict[str, object] | None:
    """The gateway's state document, or None while it cannot be read."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{STATE_PATH}",
                                     headers={"Authorization": f"Bearer {control_token() or ''}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            document = json.load(response)
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def wait_drained(port: int, deadline_seconds: float, poll_seconds: float = 0.2) -> dict[str, object] | None:
    """Poll until the gateway reports Drained (its state document) or the deadline passes (None)."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        document = drained_state(port)
        if document is not None and document.get("state") == DRAINED:
            return document
        time.sleep(poll_seconds)
    return None


if __name__ == "__main__":
    sys.exit(0 if wait_drained(int(sys.argv[1]), float(sys.argv[2])) is not None else 1)

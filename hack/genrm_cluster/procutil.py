"""Spawning and stopping child processes as whole process groups.

Why groups: control-plane components and pod containers may fork (`ip netns exec`, shells,
uvicorn workers). Each child is started in its own session, so one signal to the group reaches
every descendant and teardown leaves no strays behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session with stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send `sig` to the process group led by `proc`; a group that is gone is fine."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists (also after its leader has exited)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[bytes], grace_seconds: float) -> int:
    """SIGTERM the group, SIGKILL it after `grace_seconds`, and reap the leader.

    Returns the leader's exit code. The group is killed even after the leader exited, so
    grandchildren that outlive their parent are not left behind.
    """
    signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None and not group_alive(proc.pid):
            return proc.wait()
        time.sleep(0.05)
    signal_group(proc, signal.SIGKILL)
    return proc.wait()


def stop_container(proc: subprocess.Popen[bytes], grace_seconds: float) -> int:
    """Stop a container as a container runtime does: SIGTERM to its first process only, and SIGKILL to
    whatever is left once that process exits or ``grace_seconds`` pass.

    Why not the whole group: a runtime signals PID 1 of the container, and a server that forks its own
    workers (SGLang's scheduler and detokenizer) shuts them down itself; signalling them too makes it
    see its children die and take its crash path instead. The first process is left unreaped (a
    zombie) until the group is killed, so its pid, which is the group's id, cannot have been reused
    by then. Returns the first process's exit code.
    """
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_seconds
    while proc.returncode is None and time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
        except ChildProcessError:  # reaped already (by a poll elsewhere)
            break
        time.sleep(0.05)
    signal_group(proc, signal.SIGKILL)
    return proc.wait()

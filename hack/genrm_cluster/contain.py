"""Runs one container from an image's root filesystem, as a container runtime does for a process.

Why not a runtime: `podman run` (crun) refuses this machine's cgroup mode and rlimits, and no other
runtime is installed. What a pod's container needs from one is small: its own mount, PID, UTS and
IPC namespaces in the pod's network namespace, the image's files as its root with a writable layer
of its own, the pod's volumes at their mount paths, its user, its environment and its command. This
module is that, and nothing of resource limits, seccomp, capabilities or user namespaces: a container
that runs as root is root on the host, and it is no sandbox for untrusted images (docs/development.md
says what is left out). The project's images and the chart run as an unprivileged user.

The node agent starts ``python -I contain.py SPEC`` (`supervisor_argv`) inside the pod's network namespace
(as root). This supervisor unshares the namespaces and forks the container's first process, which is
PID 1 of its PID namespace: it mounts an overlay (the image read-only below, a tmpfs above: a
restarted container starts from the image again, as with a runtime), ``/proc``, a minimal ``/dev``,
``/etc/hosts`` and ``/etc/hostname``, the volumes, then chroots, drops to the user and execs the
command. The supervisor forwards the signals it gets to that process (a runtime signals PID 1; what
PID 1 does with SIGTERM is the image's business, as it is under Kubernetes), records its host PID for
``nsenter`` (exec probes and hooks, `exec_argv`) and exits with its status.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x04000000, 0x08000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
"""The character devices a runtime gives every container (bound from the host's)."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class Mount:
    """A volume: the host directory or file bound at ``target`` inside the container."""

    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything the supervisor needs, written by the node agent as JSON next to the pod's logs."""

    rootfs: str
    """The image's root filesystem (read-only: the overlay's lower layer)."""
    scratch: str
    """An empty host directory the container's writable layer is mounted on (in its namespace only)."""
    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    workdir: str = "/"
    hostname: str = ""
    hosts: str = ""
    """The contents of /etc/hosts (the pod's name and IP, as the kubelet writes them)."""
    mounts: list[Mount] = field(default_factory=list)
    read_only_root: bool = False
    no_new_privileges: bool = False
    """securityContext.allowPrivilegeEscalation false: no setuid binary in the image regains root."""
    pid_file: str = ""
    """Where the supervisor writes the container's first process's host PID (for `exec_argv`)."""

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def read(cls, path: Path) -> ContainerSpec:
        raw = json.loads(path.read_text())
        return cls(**{**raw, "mounts": [Mount(**m) for m in raw["mounts"]]})


def supervisor_argv(spec_file: Path) -> list[str]:
    """The command the node agent runs (in the pod's network namespace) for a container from an image:
    this file as a script, in isolated mode. It needs the standard library only, so it starts without the
    package (whose import pulls in the cluster's clients) and whatever the environment holds."""
    return [sys.executable, "-I", str(Path(__file__).resolve()), str(spec_file)]


def exec_argv(spec: ContainerSpec, argv: list[str]) -> list[str]:
    """A command run inside a running container, as its user, in every namespace of its first process
    and at its root and working directory (``kubectl exec``, exec probes and preStop hooks).

    Run it with an empty environment: nsenter runs as root on the host until it has entered, so the
    container's variables (an ``LD_PRELOAD``) are given to the command by the image's ``env`` inside."""
    pid = Path(spec.pid_file).read_text().strip()
    if not pid:
        raise OSError(f"container not started yet ({spec.pid_file} is empty)")
    nsenter = shutil.which("nsenter") or "nsenter"
    return [nsenter, f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd",
            f"--setuid={spec.uid}", f"--setgid={spec.gid}", "--", "/usr/bin/env", "-i",
            *(f"{k}={v}" for k, v in spec.env.items()), *argv]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {source} on {target}")


def inside(root: Path, path: str) -> Path:
    """``path`` inside the container whose root is ``root``, with every symlink on the way resolved
    within that root (an image's ``/var/run`` is a link to ``/run``; resolved on the host, a volume
    mounted there would land on the host's ``/run``)."""
    resolved = root
    parts = [p for p in path.split("/") if p not in ("", ".")]
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            resolved = resolved.parent if resolved != root else root
            continue
        candidate = resolved / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise OSError(f"too many symbolic links in {path}")
            link = os.readlink(candidate)
            parts = [p for p in link.split("/") if p not in ("", ".")] + parts
            if link.startswith("/"):
                resolved = root
            continue
        resolved = candidate
    return resolved


def _bind(source: str, target: Path, read_only: bool) -> None:
    """Bind ``source`` at ``target`` (made as a file or a directory to match), read-only if asked."""
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    _mount(source, str(target), None, MS_BIND | MS_REC)
    if read_only:
        _mount("none", str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)


def _prepare_root(spec: ContainerSpec) -> Path:
    """The container's root, assembled in its own mount namespace (see the module docstring)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing below leaks back to the host
    scratch = Path(spec.scratch)
    _mount("tmpfs", str(scratch), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for part in ("upper", "work", "root", "etc"):
        (scratch / part).mkdir()
    root = scratch / "root"
    _mount("overlay", str(root), "overlay", 0,
           f"lowerdir={spec.rootfs},upperdir={scratch / 'upper'},workdir={scratch / 'work'}")
    (root / "proc").mkdir(exist_ok=True)
    _mount("proc", str(root / "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    _mount("tmpfs", str(dev), "tmpfs", MS_NOSUID, "mode=0755")
    for name in DEVICES:
        _bind(f"/dev/{name}", dev / name, read_only=False)
    (dev / "shm").mkdir()
    _mount("shm", str(dev / "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        (dev / name).symlink_to(target)
    for name, text in (("hosts", spec.hosts), ("hostname", f"{spec.hostname}\n")):
        (scratch / "etc" / name).write_text(text)
        _bind(str(scratch / "etc" / name), inside(root, f"/etc/{name}"), read_only=True)
    for mount in spec.mounts:
        _bind(mount.source, inside(root, mount.target), mount.read_only)
    if spec.read_only_root:
        _mount("none", str(root), None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    return root


def _start_container(spec: ContainerSpec) -> None:
    """The container's first process: assemble its root, become its user, exec its command."""
    try:
        for signum in FORWARDED:  # the supervisor's forwarding is not this process's
            signal.signal(signum, signal.SIG_DFL)
        root = _prepare_root(spec)
        if spec.hostname:
            name = spec.hostname.encode()
            _check(_libc.sethostname(name, len(name)), "sethostname")
        os.chroot(root)
        os.chdir(spec.workdir or "/")
        os.setgroups([])
        os.setgid(spec.gid)
        os.setuid(spec.uid)
        # Set after the uid change, which clears it: the container dies with its supervisor even if it
        # left the supervisor's process group (setsid), so nothing of a pod outlives it.
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        if spec.no_new_privileges:
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        os.execvpe(spec.argv[0], spec.argv, spec.env)
    except BaseException as exc:  # the kubelet's StartError, in the container's log
        print(f"genrm-cluster: container failed to start: {exc}", file=sys.stderr, flush=True)
        os._exit(128)


def main() -> int:
    spec = ContainerSpec.read(Path(sys.argv[1]))
    # Signals that come before the child exists are kept for it (a pod deleted as it starts still gets
    # its SIGTERM), not the default action, which would kill the supervisor and so the container.
    pending: list[int] = []
    child = 0

    def forward(received: int, _frame: object) -> None:
        if child:
            os.kill(child, received)
        else:
            pending.append(received)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID), "unshare")
    child = os.fork()
    if child == 0:
        _start_container(spec)
    if spec.pid_file:
        written = Path(f"{spec.pid_file}.new")
        written.write_text(str(child))
        written.replace(spec.pid_file)  # never read half written
    for received in pending:
        os.kill(child, received)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main())

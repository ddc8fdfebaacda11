"""The images `make images` built with buildah, as root filesystems the node agent runs containers from.

Why buildah's own store: `hack/images.sh` builds into a store of its own under the cache directory
(vfs, so every layer is a plain directory). A pod naming one of those images gets that image's files,
user, environment, entrypoint and working directory (`contain`); a pod naming any other image runs as a
host process as before (podspec.py). The store is opt-in per cluster (`LocalCluster(image_store=...)`):
every other test keeps running the checkout's code, never an image built from an older one.

Each image is mounted once per store (``buildah from`` + ``buildah mount``: with vfs a copy of its
layers, a few seconds and 345 MB) and shared read-only by all its containers, each with a writable
layer of its own; `close` removes those working containers, and the first mount removes any that a
process which is gone left behind (a test run killed before its `close`), so the store does not grow.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("GENRM_CACHE", Path.home() / ".cache/genrm-operator"))
STORE = CACHE / "images/storage"
"""The store hack/images.sh builds into (its BUILDAH_ROOT)."""
RUNROOT = Path(os.environ.get("XDG_RUNTIME_DIR", "/run")) / "genrm-operator-images"
WORKING = "genrm-cluster-{pid}-{n}"
"""The name of a working container (a mounted image) made by the process ``pid``, ``n`` counting in it."""
_made = itertools.count()
_WORKING = re.compile(r"genrm-cluster-(\d+)-\d+")


def buildah_argv(store: Path = STORE, runroot: Path = RUNROOT) -> list[str]:
    """buildah on the project's store (the flags hack/images.sh uses)."""
    return ["buildah", "--root", str(store), "--runroot", str(runroot), "--storage-driver", "vfs"]


REQUIRED = "GENRM_IMAGES_REQUIRED"
"""Set to 1 by `make test` (after `make images`): images that cannot run are then an error, never a skip."""


def unavailable(store: Path = STORE) -> str | None:
    """Why images from the store cannot be run here, or None when they can."""
    if shutil.which("buildah") is None:
        return "buildah is not installed"
    if os.geteuid() != 0:
        return "mounting an image needs root"
    if not store.is_dir():
        return f"no image store at {store}: run make images"
    return None


def missing(refs: Iterable[str]) -> str | None:
    """Why the images ``refs`` cannot run here (the store's `unavailable`, or some not built), or None.
    Raises RuntimeError instead when `REQUIRED` is set: a test that needs them must not skip."""
    why = unavailable()
    if why is None:
        inspect = [*buildah_argv(), "inspect", "--type", "image"]
        absent = [ref for ref in refs if subprocess.run([*inspect, ref], capture_output=True).returncode]
        why = f"not built: {absent}: run make images" if absent else None
    if why is not None and os.environ.get(REQUIRED) == "1":
        raise RuntimeError(f"the built images are required ({REQUIRED}=1): {why}")
    return why


@dataclass(frozen=True)
class ImageRoot:
    """A mounted image: its root filesystem and what its config says a container runs as and with."""

    ref: str
    rootfs: Path
    user: str
    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    workdir: str

    def ids(self, run_as_user: int | None = None, run_as_group: int | None = None) -> tuple[int, int]:
        """The uid and gid a container runs as: the pod's runAsUser and runAsGroup where set, else the
        image's ``USER`` (names looked up in the image's own /etc/passwd and /etc/group); with no group
        named, the user's primary group in the image, else 0, as a runtime does."""
        name, _, group = (self.user or "0").partition(":")
        uid = run_as_user if run_as_user is not None else _lookup(self.rootfs / "etc/passwd", name)
        if run_as_group is not None:
            return uid, run_as_group
        if group and run_as_user is None:
            return uid, _lookup(self.rootfs / "etc/group", group)
        entry = _passwd_entry(self.rootfs / "etc/passwd", uid)
        return uid, int(entry[3]) if entry else 0

    def home(self, uid: int) -> str:
        """The home directory of ``uid`` in the image (``/`` when it has none), for HOME."""
        entry = _passwd_entry(self.rootfs / "etc/passwd", uid)
        return (entry[5] if entry and len(entry) > 5 else "") or "/"


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _lookup(path: Path, name: str) -> int:
    """A user's or group's number by name in the image's passwd or group file (numbers as they are)."""
    if name.isdigit():
        return int(name)
    for line in _lines(path):
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == name:
            return int(fields[2])
    raise LookupError(f"{name} is not in the image's {path.name}")


def _passwd_entry(path: Path, uid: int) -> list[str] | None:
    """The fields of ``uid``'s line in the image's passwd file (its group at least), or None."""
    for line in _lines(path):
        fields = line.split(":")
        if len(fields) > 3 and fields[2] == str(uid):
            return fields
    return None


class ImageStore:
    """The project's buildah store, mounting each image a pod names the first time one does."""

    def __init__(self, store: Path = STORE, runroot: Path = RUNROOT) -> None:
        self.buildah = buildah_argv(store, runroot)
        self._roots: dict[str, ImageRoot | None] = {}
        self._containers: list[str] = []
        self._lock = threading.Lock()

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.buildah, *args], capture_output=True, text=True, timeout=300)

    def root(self, ref: str) -> ImageRoot | None:
        """The mounted image ``ref`` names, or None when the store has no such image."""
        with self._lock:
            if not self._roots:
                self._prune()
            if ref not in self._roots:
                self._roots[ref] = self._mount(ref)
            return self._roots[ref]

    def _mount(self, ref: str) -> ImageRoot | None:
        inspected = self._run("inspect", "--type", "image", ref)
        if inspected.returncode != 0:
            return None
        config = json.loads(inspected.stdout)["OCIv1"].get("config") or {}
        made = self._run("from", "--pull=never", "--name", WORKING.format(pid=os.getpid(), n=next(_made)),
                         ref)
        if made.returncode != 0:
            raise RuntimeError(f"buildah from {ref}: {made.stderr.strip()}")
        container = made.stdout.strip()
        self._containers.append(container)
        mounted = self._run("mount", container)
        if mounted.returncode != 0:
            self._run("rm", container)
            self._containers.remove(container)
            raise RuntimeError(f"buildah mount {ref}: {mounted.stderr.strip()}")
        return ImageRoot(ref=ref, rootfs=Path(mounted.stdout.strip()), user=config.get("User") or "",
                         env=tuple(config.get("Env") or ()), entrypoint=tuple(config.get("Entrypoint") or ()),
                         cmd=tuple(config.get("Cmd") or ()), workdir=config.get("WorkingDir") or "/")

    def _prune(self) -> None:
        """Remove the working containers of processes that are gone (see the module docstring). The store is
        this machine's and its users' (root, one PID namespace), which is what a PID says anything about."""
        listed = self._run("containers", "--format", "{{.ContainerName}}")
        for name in listed.stdout.split():
            match = _WORKING.fullmatch(name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                self._run("rm", name)

    def close(self) -> None:
        """Remove the working containers the mounts were made from (the images stay)."""
        with self._lock:
            for container in self._containers:
                self._run("rm", container)
            self._containers.clear()
            self._roots.clear()

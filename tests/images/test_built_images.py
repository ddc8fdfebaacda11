"""The images `make images` built with buildah, run for real: each root filesystem is mounted from the
project's image store (hack/images.sh) and its entrypoint run under unshare (mount, PID, UTS, IPC and a
private network namespace) + chroot as the image's declared user, which is most of what a container runtime
does for a process (`podman run` does not work on this machine: crun refuses its cgroup mode and rlimits).

Skipped where the images were not built with buildah (no store, not root, or no buildah): `make images` first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
CACHE = Path(os.environ.get("GENRM_CACHE", Path.home() / ".cache/genrm-operator"))
STORE = CACHE / "images/storage"
RUNROOT = Path(os.environ.get("XDG_RUNTIME_DIR", "/run")) / "genrm-operator-images"
BUILDAH = ["buildah", "--root", str(STORE), "--runroot", str(RUNROOT), "--storage-driver", "vfs"]
TARGETS = {"operator": "genrm-operator", "gateway": "genrm-gateway", "sim": "genrm-sim"}
# docs/development.md#images states this budget: the base (about 130 MB) and the virtualenv (about 220 MB,
# 126 MB of it the Kubernetes client, which every image carries because all three install one wheel).
SIZE_BUDGET = 400 * 10**6
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc", "tcc")


def _buildah(*args: str) -> str:
    return subprocess.run([*BUILDAH, *args], check=True, capture_output=True, text=True).stdout.strip()


def _image(target: str) -> str:
    return f"genrm/{target}:{VERSION}"


def _available() -> str | None:
    if shutil.which("buildah") is None:
        return "buildah is not installed"
    if os.geteuid() != 0:
        return "mounting an image needs root"
    if not STORE.is_dir():
        return f"no image store at {STORE}: run make images"
    missing = [t for t in TARGETS if subprocess.run([*BUILDAH, "inspect", "--type", "image", _image(t)],
                                                    capture_output=True).returncode]
    return f"not built: {missing}: run make images" if missing else None


pytestmark = pytest.mark.skipif(bool(_available()), reason=_available() or "")


class Mounted:
    """An image's root filesystem, mounted, and its config (user, env, entrypoint, workdir)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.config: dict[str, Any] = json.loads(_buildah("inspect", "--type", "image", _image(target)))["OCIv1"][
            "config"]
        self.container = _buildah("from", "--pull=never", _image(target))
        self.root = Path(_buildah("mount", self.container))

    def close(self) -> None:
        subprocess.run([*BUILDAH, "rm", self.container], capture_output=True)

    def script(self, shell: str, timeout: float = 60, net: bool = True) -> subprocess.CompletedProcess[str]:
        """`sh -c shell` inside the image as its user, with its env and workdir, in new namespaces."""
        user = self.config.get("User") or "0"
        env = ["/usr/bin/env", "-i", *self.config.get("Env", [])]
        inner = ["chroot", f"--userspec={user}", "--groups=", str(self.root), *env, "sh", "-c",
                 f'cd {self.config.get("WorkingDir") or "/"} && {shell}']
        outer = f'mount -t proc proc "$1/proc" && {"ip link set lo up && " if net else ""}shift && exec "$@"'
        flags = ["--mount", "--pid", "--uts", "--ipc", "--fork", "--propagation", "private"]
        flags += ["--net"] if net else []
        return subprocess.run(["unshare", *flags, "sh", "-c", outer, "sh", str(self.root), *inner],
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", params=sorted(TARGETS))
def image(request: pytest.FixtureRequest) -> Iterator[Mounted]:
    mounted = Mounted(request.param)
    try:
        yield mounted
    finally:
        mounted.close()


def test_the_entrypoint_is_the_console_script_and_the_user_is_not_root(image: Mounted) -> None:
    assert image.config["Entrypoint"] == [TARGETS[image.target]]
    assert image.config["User"] == "10001:10001"
    if image.target == "gateway":
        assert image.config["Cmd"] == ["serve"]


def test_the_entrypoint_starts_as_the_declared_user(image: Mounted) -> None:
    result = image.script(f'id -u; id -g; {TARGETS[image.target]} --help')
    assert result.returncode == 0, result.stderr
    uid, gid, *rest = result.stdout.splitlines()
    assert (uid, gid) == ("10001", "10001")
    assert any(line.startswith("usage:") for line in rest), result.stdout


def test_no_compiler_no_pip_cache_no_build_leftovers(image: Mounted) -> None:
    root = image.root
    found = [f"{d}/{c}" for d in ("usr/bin", "usr/local/bin", "bin") for c in COMPILERS if (root / d / c).exists()]
    found += [str(p.relative_to(root)) for p in root.glob("usr/bin/*-linux-gnu-gcc*")]
    assert not found, found
    caches = [p for p in ("root/.cache/pip", "tmp/.cache", "home", "wheels", "src") if (root / p).exists()
              and any((root / p).iterdir())]
    assert not caches, caches
    assert not list(root.glob("**/.cache/pip")), "a pip cache"


def test_the_installed_packages_are_the_pinned_ones(image: Mounted) -> None:
    pinned = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        pinned[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    listing = image.script("python3 -c 'import importlib.metadata as m\n"
                           "for d in m.distributions(): print(d.metadata[\"Name\"], d.version)'", net=False)
    assert listing.returncode == 0, listing.stderr
    installed = {re.sub(r"[-_.]+", "-", name).lower(): version
                 for name, version in (line.split() for line in listing.stdout.splitlines())}
    assert installed.pop("genrm-operator") == VERSION
    # The virtualenv's own installer (ensurepip's, from the base): not a dependency of the project.
    for tool in ("pip", "setuptools"):
        installed.pop(tool, None)
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, f"installed but not in constraints.txt: {unpinned}"
    wrong = {name: (version, pinned[name]) for name, version in installed.items() if version != pinned[name]}
    assert not wrong, wrong


def test_the_image_is_within_its_size_budget(image: Mounted) -> None:
    du = subprocess.run(["du", "-sb", "--one-file-system", str(image.root)], check=True, capture_output=True,
                        text=True)
    size = int(du.stdout.split()[0])
    assert size <= SIZE_BUDGET, f"{size / 1e6:.0f} MB unpacked, over the {SIZE_BUDGET / 1e6:.0f} MB budget"


def test_the_simulator_serves_from_its_image() -> None:
    """genrm-sim from the sim image, alone in its network namespace, answers /health as its user."""
    sim = Mounted("sim")
    try:
        probe = ("import time, urllib.request\n"
                 "for _ in range(120):\n"
                 "    try:\n"
                 "        print('health', urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=2).status)\n"
                 "        break\n"
                 "    except OSError:\n"
                 "        time.sleep(0.5)\n")
        result = sim.script("genrm-sim --host 127.0.0.1 --port 30000 --model-path judge >/dev/null 2>&1 & "
                            f"python3 -c \"{probe}\"", timeout=90)
        assert "health 200" in result.stdout, (result.stdout, result.stderr)
    finally:
        sim.close()

"""The images `make images` built with buildah, run for real: each root filesystem is mounted from the
project's image store and its entrypoint run by the local cluster's container supervisor
(`genrm_cluster.contain`: its own mount, PID, UTS and IPC namespaces, the image as its root, its
declared user), in a network namespace of its own, which is most of what a container runtime does for a
process (`podman run` does not work on this machine: crun refuses its cgroup mode and rlimits).

Skipped where the images were not built with buildah (no store, not root, or no buildah), unless
GENRM_IMAGES_REQUIRED=1 (`make test` sets it after `make images`): then that is a failure.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cluster.contain import ContainerSpec, supervisor_argv
from genrm_cluster.imagestore import WORKING, ImageRoot, ImageStore, buildah_argv, missing

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TARGETS = {"operator": "genrm-operator", "gateway": "genrm-gateway", "sim": "genrm-sim"}
# docs/development.md#images states this budget: the base (about 130 MB) and the virtualenv (about 220 MB,
# 126 MB of it the Kubernetes client, which every image carries because all three install one wheel).
SIZE_BUDGET = 400 * 10**6
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc", "tcc")


def _image(target: str) -> str:
    return f"genrm/{target}:{VERSION}"


if (_why := missing(_image(t) for t in TARGETS)) is not None:
    pytest.skip(_why, allow_module_level=True)


@pytest.fixture(scope="module")
def store() -> Iterator[ImageStore]:
    images = ImageStore()
    try:
        yield images
    finally:
        images.close()


class Mounted:
    """An image's root filesystem and config, and a shell run inside it as a container."""

    def __init__(self, target: str, root: ImageRoot) -> None:
        self.target, self.image = target, root
        self.root = root.rootfs

    def script(self, shell: str, timeout: float = 60, net: bool = True) -> subprocess.CompletedProcess[str]:
        """`sh -c shell` inside the image as its user, with its env and workdir (`contain`), in a network
        namespace of its own (with its loopback up when ``net``)."""
        uid, gid = self.image.ids()
        env = dict(v.split("=", 1) for v in self.image.env)
        with tempfile.TemporaryDirectory(prefix="genrm-image-") as scratch:
            spec = ContainerSpec(rootfs=str(self.root), scratch=f"{scratch}/root", argv=["sh", "-c", shell],
                                 env=env, uid=uid, gid=gid, workdir=self.image.workdir, hostname=self.target,
                                 hosts="127.0.0.1\tlocalhost\n").write(Path(scratch) / "spec.json")
            Path(f"{scratch}/root").mkdir()
            up = "ip link set lo up && " if net else ""
            return subprocess.run(["unshare", "--net", "sh", "-c", f'{up}exec "$@"', "sh", *supervisor_argv(spec)],
                                  capture_output=True, text=True, timeout=timeout)


def mounted(store: ImageStore, target: str) -> Mounted:
    root = store.root(_image(target))
    assert root is not None, _image(target)
    return Mounted(target, root)


@pytest.fixture(scope="module", params=sorted(TARGETS))
def image(request: pytest.FixtureRequest, store: ImageStore) -> Mounted:
    return mounted(store, request.param)


def test_the_entrypoint_is_the_console_script_and_the_user_is_not_root(image: Mounted) -> None:
    assert image.image.entrypoint == (TARGETS[image.target],)
    assert image.image.user == "10001:10001"
    if image.target == "gateway":
        assert image.image.cmd == ("serve",)


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


def test_the_simulator_serves_from_its_image(store: ImageStore) -> None:
    """genrm-sim from the sim image, alone in its network namespace, answers /health as its user."""
    sim = mounted(store, "sim")
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


def test_a_mount_left_by_a_process_that_is_gone_is_removed() -> None:
    """A test run killed before its cluster closed leaves its mounted images (345 MB each with vfs):
    the next store's first mount removes them, and its own `close` removes its own."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = WORKING.format(pid=dead.pid, n=0)
    subprocess.run([*buildah_argv(), "from", "--pull=never", "--name", left, _image("sim")], check=True,
                   capture_output=True)
    store = ImageStore()

    def containers() -> set[str]:
        listed = subprocess.run([*buildah_argv(), "containers", "--format", "{{.ContainerName}}"], check=True,
                                capture_output=True, text=True)
        return set(listed.stdout.split())

    before = containers()
    try:
        assert store.root(_image("sim")) is not None
        mine = containers() - before
        assert left in before and left not in containers() and len(mine) == 1
    finally:
        store.close()
    assert not mine & containers()

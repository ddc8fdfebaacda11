"""Running a container from an image: the rules the node agent follows, on a made-up image.

The images themselves run in tests/images and e2e/test_images.py; these are the decisions around them:
where a volume lands inside the root, which command runs and as whom.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from genrm_cluster.contain import inside
from genrm_cluster.imagestore import ImageRoot
from genrm_cluster.kubeapi import KubeAPI
from genrm_cluster.podspec import ConfigError, PodFiles


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """A root filesystem as Debian's: /var/run a link to /run, a user genrm (10001, group 10002)."""
    root = tmp_path / "rootfs"
    for d in ("run", "var", "etc", "opt/app"):
        (root / d).mkdir(parents=True)
    (root / "var/run").symlink_to("/run")
    (root / "opt/current").symlink_to("app")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\ngenrm:x:10001:10002::/home/genrm:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\ngenrm:x:10002:\nreaders:x:20000:\n")
    return root


def test_a_path_inside_the_root_follows_the_images_own_links(rootfs: Path) -> None:
    assert inside(rootfs, "/var/run/secrets/token") == rootfs / "run/secrets/token"
    assert inside(rootfs, "/opt/current/config") == rootfs / "opt/app/config"
    # Never above the root, however many ..: a volume cannot be bound over a host path.
    assert inside(rootfs, "/../../etc/passwd") == rootfs / "etc/passwd"
    (rootfs / "escape").symlink_to("../../../../tmp")
    assert inside(rootfs, "/escape/x") == rootfs / "tmp/x"


def image(rootfs: Path, user: str = "genrm", entrypoint: tuple[str, ...] = ("serve",),
          cmd: tuple[str, ...] = ("--port", "80")) -> ImageRoot:
    return ImageRoot(ref="example/app:1", rootfs=rootfs, user=user, env=("PATH=/opt/app/bin:/usr/bin", "A=image"),
                     entrypoint=entrypoint, cmd=cmd, workdir="/opt/app")


def files(tmp_path: Path, pod_security: dict[str, Any] | None = None) -> PodFiles:
    pod = {"metadata": {"name": "p-0", "namespace": "ns"},
           "spec": {"containers": [], "securityContext": pod_security or {}}}
    # The rules below read no object from the API server.
    return PodFiles(cast(KubeAPI, None), pod, tmp_path / "pod", "10.244.0.9", "10.244.0.1", api_service_ip="10.96.0.1")


def test_command_replaces_the_entrypoint_and_args_the_cmd(rootfs: Path, tmp_path: Path) -> None:
    pod, root = files(tmp_path), image(rootfs)
    argv = {}
    for case, spec in {"image": {}, "args": {"args": ["--port", "$(PORT)"]}, "command": {"command": ["run"]},
                       "both": {"command": ["run"], "args": ["x"]}}.items():
        container = {"name": "c", **spec}
        env = pod.env(container, root) | {"PORT": "81"}
        argv[case] = pod.contained(container, env, root, tmp_path / case, tmp_path / "pid").argv
    assert argv == {"image": ["serve", "--port", "80"], "args": ["serve", "--port", "81"], "command": ["run"],
                    "both": ["run", "x"]}


def test_the_environment_is_the_images_then_the_pods(rootfs: Path, tmp_path: Path) -> None:
    env = files(tmp_path).env({"name": "c", "env": [{"name": "A", "value": "pod"}]}, image(rootfs))
    assert env["A"] == "pod" and env["PATH"] == "/opt/app/bin:/usr/bin" and env["HOME"] == "/home/genrm"
    assert (env["HOSTNAME"], env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == \
        ("p-0", "10.96.0.1", "443")
    assert "GENRM_POD_DIR" not in env, "a host path means nothing inside the image"


def test_the_user_is_the_images_unless_the_security_context_names_one(rootfs: Path, tmp_path: Path) -> None:
    def identity(user: str, container: dict[str, Any], pod: dict[str, Any] | None = None) -> tuple[int, int]:
        spec = files(tmp_path, pod).contained({"name": "c", **container}, {}, image(rootfs, user), tmp_path / "s",
                                              tmp_path / "pid")
        return spec.uid, spec.gid

    assert identity("genrm", {}) == (10001, 10002), "a name: its number and primary group in the image"
    assert identity("genrm:readers", {}) == (10001, 20000)
    assert identity("4242", {}) == (4242, 0), "a number with no entry: group 0, as a runtime does"
    assert identity("genrm", {}, {"runAsUser": 5, "runAsGroup": 6}) == (5, 6)
    assert identity("genrm", {"securityContext": {"runAsUser": 7}}, {"runAsUser": 5}) == (7, 0)
    with pytest.raises(ConfigError, match="runAsNonRoot and image will run as root"):
        identity("root", {}, {"runAsNonRoot": True})
    with pytest.raises(ConfigError, match="nobody is not in the image's passwd"):
        identity("nobody", {})


def test_mounts_go_parents_first_and_keep_read_only(rootfs: Path, tmp_path: Path) -> None:
    pod = files(tmp_path)
    pod.volume_dirs = {"a": tmp_path / "a", "b": tmp_path / "b"}
    container = {"name": "c", "volumeMounts": [{"name": "b", "mountPath": "/etc/x/y", "readOnly": True},
                                               {"name": "a", "mountPath": "/etc/x/"}]}
    mounts = pod.contained(container, {}, image(rootfs), tmp_path / "s", tmp_path / "pid").mounts
    assert [(m.target, m.read_only) for m in mounts] == [("/etc/x", False), ("/etc/x/y", True)]


def test_a_sub_path_stays_inside_its_volume_whatever_links_a_container_made(rootfs: Path, tmp_path: Path) -> None:
    pod = files(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "evil").symlink_to("/")  # what an earlier container could have left in an emptyDir
    (shared / "up").symlink_to("../..")
    pod.volume_dirs = {"shared": shared}
    container = {"name": "c", "volumeMounts": [{"name": "shared", "mountPath": "/a", "subPath": "evil/etc"},
                                               {"name": "shared", "mountPath": "/b", "subPath": "up/x"}]}
    sources = {m.target: m.source for m in pod.volume_mounts(container)}
    assert sources == {"/a": str(shared / "etc"), "/b": str(shared / "x")}


def test_an_image_with_a_malformed_passwd_cannot_start_but_breaks_nothing(rootfs: Path, tmp_path: Path) -> None:
    (rootfs / "etc/passwd").write_text("app:x:notanumber:1::/:/bin/sh\n")
    with pytest.raises(ConfigError, match="container c"):
        files(tmp_path).contained({"name": "c"}, {}, image(rootfs, "app"), tmp_path / "s", tmp_path / "pid")

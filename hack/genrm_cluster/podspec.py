"""Turning a pod spec into what a local process needs: environment, files and paths.

Why this shape: there are no images and no mount namespaces, so each container runs as a host
process. Volumes are materialised as directories of a per-pod dir; the container still sees its
`volumeMounts[].mountPath` strings in its spec, so those are mapped to host paths like this:

* Every `command`/`args` string and every env value that contains a volumeMount's `mountPath`
  (as a whole path component: `/etc/genrm/token`, `--token-file=/etc/genrm/token`) gets that
  prefix replaced by the host directory of the volume (plus `subPath`). A binary that reads a
  hard-coded path it was not told about cannot be redirected: pass paths by args or env.
* Supported volumes: secret, configMap, emptyDir, downwardAPI, and projected (secret, configMap,
  downwardAPI, serviceAccountToken via the TokenRequest API). Contents are written once, at start.
* Env: literal values with `$(VAR)` expansion, `valueFrom` secretKeyRef, configMapKeyRef and
  fieldRef (metadata.name/namespace/uid/labels/annotations, spec.nodeName,
  spec.serviceAccountName, status.podIP/podIPs/hostIP), and `envFrom`; plus PATH (the project's
  virtualenv first, so `genrm-sim`/`genrm-gateway` resolve), HOME and TMPDIR in the pod dir,
  HOSTNAME = pod name and GENRM_POD_DIR. The agent's own environment is not inherited.
* Images: a container whose `image` the cluster was given a root directory for (`images`, e.g.
  SGLang's image mapped to an installed environment of SGLang) gets that root's `bin` first on PATH,
  so its `python3` is the image's; any other image is ignored.
* Images from the store (`imagestore`, when the cluster has one): a container whose image is there
  runs from it for real (`contain`): none of the above path mapping, but the image's environment,
  entrypoint, command, working directory and user under Kubernetes' rules (`command` replaces the
  entrypoint, `args` the command; runAsUser, runAsGroup, runAsNonRoot and readOnlyRootFilesystem
  from the container's securityContext, else the pod's), its volumes mounted at their paths.
* Every container gets KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, the `kubernetes`
  Service's address, as the kubelet sets them (in-cluster clients find the API server by them).
* hostPath volumes are the host directory itself (a model directory on the node, as on a real one).
"""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genrm_cluster.contain import ContainerSpec, Mount, inside
from genrm_cluster.imagestore import ImageRoot
from genrm_cluster.kubeapi import JSON, ApiError, KubeAPI

KUBERNETES_SERVICE_PORT = 443
"""The `kubernetes` Service's port (the API server's own Service, made by the API server)."""


class ConfigError(Exception):
    """A referenced Secret/ConfigMap/key is missing (the kubelet's CreateContainerConfigError)."""


def _lookup(api: KubeAPI, kind: str, namespace: str, name: str, optional: bool) -> JSON | None:
    try:
        return api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
    except ApiError as err:
        if err.status == 404:
            if optional:
                return None
            raise ConfigError(f"{kind[:-1]} {namespace}/{name} not found") from err
        raise


def _object_data(obj: JSON) -> dict[str, bytes]:
    """The payload of a Secret (base64 in `data`) or a ConfigMap (`data` and `binaryData`)."""
    if obj.get("kind") == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def field_value(pod: JSON, path: str, pod_ip: str, host_ip: str) -> str:
    """The downward-API value of `path` (a fieldRef.fieldPath) for this pod."""
    meta = pod["metadata"]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "metadata.labels": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items())),
        "metadata.annotations": "\n".join(
            f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items())
        ),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path not in values:
        raise ConfigError(f"unsupported fieldRef {path}")
    return str(values[path])


class PodFiles:
    """Materialises a pod's volumes under `pod_dir` and resolves its containers' env and argv."""

    def __init__(self, api: KubeAPI, pod: JSON, pod_dir: Path, pod_ip: str, host_ip: str,
                 images: Mapping[str, Path] | None = None, api_service_ip: str = "") -> None:
        self.api = api
        self.api_service_ip = api_service_ip
        self.images = dict(images or {})
        self.pod = pod
        self.pod_dir = pod_dir
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.namespace: str = pod["metadata"]["namespace"]
        self.volume_dirs: dict[str, Path] = {}

    def materialise_volumes(self) -> None:
        """Write every volume's content into `<pod_dir>/volumes/<name>/`."""
        for volume in self.pod["spec"].get("volumes") or []:
            if "hostPath" in volume:
                self.volume_dirs[volume["name"]] = _host_path(volume["name"], volume["hostPath"])
                continue
            target = self.pod_dir / "volumes" / volume["name"]
            target.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume:
                target.chmod(0o777)  # as the kubelet makes it: any container user may write there
            self.volume_dirs[volume["name"]] = target
            if "secret" in volume:
                src = volume["secret"]
                self._write_object(target, "secrets", src.get("secretName", ""), src)
            elif "configMap" in volume:
                self._write_object(target, "configmaps", volume["configMap"].get("name", ""),
                                   volume["configMap"])
            elif "downwardAPI" in volume:
                self._write_downward(target, volume["downwardAPI"])
            elif "projected" in volume:
                for source in volume["projected"].get("sources") or []:
                    self._write_projection(target, source, volume["projected"].get("defaultMode"))
            elif "emptyDir" not in volume:
                raise ConfigError(f"volume {volume['name']}: only secret, configMap, emptyDir, "
                                  "downwardAPI, projected and hostPath volumes are supported")

    def _write_object(self, target: Path, kind: str, name: str, src: JSON,
                      default_mode: int | None = None) -> None:
        obj = _lookup(self.api, kind, self.namespace, name, bool(src.get("optional")))
        data = _object_data(obj) if obj else {}
        mode = src.get("defaultMode", default_mode)
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                if src.get("optional"):
                    continue
                raise ConfigError(f"key {item['key']} not in {kind[:-1]} {self.namespace}/{name}")
            _write_file(target / item["path"], data[item["key"]], item.get("mode", mode))

    def _write_downward(self, target: Path, src: JSON) -> None:
        for item in src.get("items") or []:
            if "fieldRef" not in item:
                raise ConfigError("downwardAPI: only fieldRef items are supported")
            value = field_value(self.pod, item["fieldRef"]["fieldPath"], self.pod_ip, self.host_ip)
            _write_file(target / item["path"], value.encode(), item.get("mode", src.get("defaultMode")))

    def _write_projection(self, target: Path, source: JSON, default_mode: int | None) -> None:
        if "secret" in source:
            self._write_object(target, "secrets", source["secret"].get("name", ""), source["secret"],
                               default_mode)
        elif "configMap" in source:
            self._write_object(target, "configmaps", source["configMap"].get("name", ""),
                               source["configMap"], default_mode)
        elif "downwardAPI" in source:
            self._write_downward(target, {"defaultMode": default_mode, **source["downwardAPI"]})
        elif "serviceAccountToken" in source:
            src = source["serviceAccountToken"]
            meta = self.pod["metadata"]
            sa = self.pod["spec"].get("serviceAccountName") or "default"
            spec: JSON = {
                "expirationSeconds": src.get("expirationSeconds", 3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "uid": meta["uid"]},
            }
            if src.get("audience"):
                spec["audiences"] = [src["audience"]]
            answer = self.api.post(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token",
                                   {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": spec})
            _write_file(target / src["path"], answer["status"]["token"].encode(), default_mode)
        else:
            raise ConfigError(f"unsupported projected source {sorted(source)}")

    def mounts(self, container: JSON) -> list[tuple[str, str]]:
        """(mountPath, host path) pairs of a container, longest mountPath first."""
        return [(m.target, m.source) for m in self.volume_mounts(container)]

    def volume_mounts(self, container: JSON) -> list[Mount]:
        """The container's volumes as mounts, longest mountPath first."""
        mounts = []
        for mount in container.get("volumeMounts") or []:
            host = self.volume_dirs[mount["name"]]
            if mount.get("subPath"):
                # Inside the volume, whatever links a container made in it: bound as written, a link
                # to / would hand the host's root to the next container (the kubelet's subPath CVE).
                host = inside(host, mount["subPath"])
            mounts.append(Mount(str(host), mount["mountPath"].rstrip("/") or "/", bool(mount.get("readOnly"))))
        return sorted(mounts, key=lambda m: len(m.target), reverse=True)

    def env(self, container: JSON, image: ImageRoot | None = None) -> dict[str, str]:
        """The container's environment, see the module docstring (``image``: it runs from that image)."""
        env = self._base_env(container) if image is None else dict(v.split("=", 1) for v in image.env if "=" in v)
        env["HOSTNAME"] = self.pod["metadata"]["name"]
        if self.api_service_ip:
            port = str(KUBERNETES_SERVICE_PORT)
            env.update(KUBERNETES_SERVICE_HOST=self.api_service_ip, KUBERNETES_SERVICE_PORT=port,
                       KUBERNETES_SERVICE_PORT_HTTPS=port)
        for source in container.get("envFrom") or []:
            ref, kind = ((source["secretRef"], "secrets") if "secretRef" in source
                         else (source["configMapRef"], "configmaps"))
            obj = _lookup(self.api, kind, self.namespace, ref["name"], bool(ref.get("optional")))
            prefix = source.get("prefix", "")
            for key, raw in (_object_data(obj) if obj else {}).items():
                env[prefix + key] = raw.decode(errors="replace")
        for var in container.get("env") or []:
            value = self._env_value(var, env)
            if value is not None:
                env[var["name"]] = value
        if image is not None:
            env.setdefault("HOME", image.home(self.identity(container, image)[0]))
            return env
        mounts = self.mounts(container)
        return {k: rewrite_paths(v, mounts) for k, v in env.items()}

    def _base_env(self, container: JSON) -> dict[str, str]:
        """A host process's own variables: the virtualenv (or the mapped image's) first on PATH, and a
        home in the pod's directory."""
        venv_bin = str(Path(sys.executable).parent)
        image_root = self.images.get(container.get("image", ""))
        if image_root is not None:
            venv_bin = f"{image_root / 'bin'}:{venv_bin}"
        home = self.pod_dir / "home"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        return {
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "GENRM_POD_DIR": str(self.pod_dir),
        }

    def _security(self, container: JSON, key: str) -> Any:
        """A securityContext setting: the container's, else the pod's."""
        own = (container.get("securityContext") or {}).get(key)
        return own if own is not None else (self.pod["spec"].get("securityContext") or {}).get(key)

    def identity(self, container: JSON, image: ImageRoot) -> tuple[int, int]:
        """The uid and gid the container runs as (`ImageRoot.ids`), refused as the kubelet refuses a
        container that must not run as root and would."""
        try:
            uid, gid = image.ids(self._security(container, "runAsUser"), self._security(container, "runAsGroup"))
        except (LookupError, ValueError) as err:  # a name the image lacks, a malformed passwd line
            raise ConfigError(f"container {container['name']}: {err}") from err
        if uid == 0 and self._security(container, "runAsNonRoot"):
            raise ConfigError(f"container {container['name']} has runAsNonRoot and image will run as root")
        return uid, gid

    def contained(self, container: JSON, env: dict[str, str], image: ImageRoot, scratch: Path,
                  pid_file: Path) -> ContainerSpec:
        """What `contain` needs to run ``container`` from ``image``."""
        command = [expand(s, env) for s in container.get("command") or ()]
        args = [expand(s, env) for s in container.get("args") or ()]
        # Kubernetes' rule: command replaces the entrypoint (and drops the image's cmd), args the cmd.
        argv = [*command, *args] if command else [*image.entrypoint, *(args or image.cmd)]
        if not argv:
            raise ConfigError(f"container {container['name']}: no command and the image {image.ref} has none")
        uid, gid = self.identity(container, image)
        name = self.pod["metadata"]["name"]
        scratch.mkdir(parents=True, exist_ok=True)
        return ContainerSpec(
            rootfs=str(image.rootfs), scratch=str(scratch), argv=argv, env=env, uid=uid, gid=gid,
            workdir=container.get("workingDir") or image.workdir, hostname=name,
            hosts=f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{self.pod_ip}\t{name}\n",
            mounts=sorted(self.volume_mounts(container), key=lambda m: len(m.target)),  # parents first
            read_only_root=bool(self._security(container, "readOnlyRootFilesystem")),
            no_new_privileges=(container.get("securityContext") or {}).get("allowPrivilegeEscalation") is False,
            pid_file=str(pid_file))

    def _env_value(self, var: JSON, env: dict[str, str]) -> str | None:
        if "valueFrom" not in var:
            return expand(var.get("value", ""), env)
        source = var["valueFrom"]
        if "fieldRef" in source:
            return field_value(self.pod, source["fieldRef"]["fieldPath"], self.pod_ip, self.host_ip)
        for key, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if key in source:
                ref = source[key]
                obj = _lookup(self.api, kind, self.namespace, ref["name"], bool(ref.get("optional")))
                data = _object_data(obj) if obj else {}
                if ref["key"] in data:
                    return data[ref["key"]].decode(errors="replace")
                if ref.get("optional"):
                    return None
                raise ConfigError(f"key {ref['key']} not in {kind[:-1]} {self.namespace}/{ref['name']}")
        raise ConfigError(f"env {var['name']}: unsupported valueFrom {sorted(source)}")

    def argv(self, container: JSON, env: dict[str, str]) -> list[str]:
        """`command + args` with `$(VAR)` expansion and mount paths mapped to host paths."""
        command = container.get("command") or []
        if not command:
            raise ConfigError(f"container {container['name']} has no command; images are ignored "
                              "by the local node agent, so the entrypoint must be explicit")
        mounts = self.mounts(container)
        return [rewrite_paths(expand(s, env), mounts) for s in [*command, *(container.get("args") or [])]]


def _host_path(name: str, source: JSON) -> Path:
    """A hostPath volume's directory, checked as the kubelet checks its ``type`` (a missing ``Directory``
    is its FailedMount: the pod waits and is retried). Mounts are not made read-only here: there are
    no mount namespaces of our own, so a container could write into it."""
    path, kind = Path(source["path"]), source.get("type", "")
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "Directory" and not path.is_dir():
        raise ConfigError(f"volume {name}: hostPath {path} is not a directory (type Directory)")
    elif kind == "File" and not path.is_file():
        raise ConfigError(f"volume {name}: hostPath {path} is not a file (type File)")
    elif kind not in ("", "Directory", "File", "DirectoryOrCreate"):
        raise ConfigError(f"volume {name}: hostPath type {kind} is not supported by the local node agent")
    return path


def _write_file(path: Path, data: bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode if mode is not None else 0o644)


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names are replaced, `$$` escapes, unknown stay."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(sub, value)


def rewrite_paths(value: str, mounts: list[tuple[str, str]]) -> str:
    """Replace each mountPath (as a whole path prefix) in `value` by its host directory, in one pass
    (so a host directory that itself starts with another mount's path is not rewritten again), the
    longest mountPath first where two could match."""
    if not mounts:
        return value
    hosts = dict(mounts)
    ordered = sorted(hosts, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, ordered)) + r")(?=/|$|[^\w.-])")
    return pattern.sub(lambda match: hosts[match.group(1)], value)

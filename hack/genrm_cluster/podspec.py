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
* hostPath volumes are the host directory itself (a model directory on the node, as on a real one).
"""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from genrm_cluster.kubeapi import JSON, ApiError, KubeAPI


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
                 images: Mapping[str, Path] | None = None) -> None:
        self.api = api
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
        pairs = []
        for mount in container.get("volumeMounts") or []:
            host = self.volume_dirs[mount["name"]]
            if mount.get("subPath"):
                host = host / mount["subPath"]
            pairs.append((mount["mountPath"].rstrip("/") or "/", str(host)))
        return sorted(pairs, key=lambda p: len(p[0]), reverse=True)

    def env(self, container: JSON) -> dict[str, str]:
        """The container's environment, see the module docstring."""
        venv_bin = str(Path(sys.executable).parent)
        image_root = self.images.get(container.get("image", ""))
        if image_root is not None:
            venv_bin = f"{image_root / 'bin'}:{venv_bin}"
        home = self.pod_dir / "home"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "HOSTNAME": self.pod["metadata"]["name"],
            "GENRM_POD_DIR": str(self.pod_dir),
        }
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
        mounts = self.mounts(container)
        return {k: rewrite_paths(v, mounts) for k, v in env.items()}

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

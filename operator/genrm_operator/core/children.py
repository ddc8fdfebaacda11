"""Pure builders of a pool's child objects (Pod, Service, Secret, PodDisruptionBudget).

They return plain manifests so the same code is unit-tested, used by the kopf
shell, and readable as the contract between the operator and the node: the
engine binds 127.0.0.1 only, the gateway sidecar is the pod's single ingress,
and deleting a pod by hand still drains it through the sidecar's preStop hook.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

from genrm_contract import drained, sidecar

from ..api.pool import GROUP, KIND, VERSION, GenRMPoolSpec
from ..api.spec import GatewayLimits, GatewaySpec, SecretKeySelector
from . import placement
from .judge import judge_revision
from .names import (
    ENGINE_CONTAINER,
    ENGINE_KEY_CONTAINER,
    GATEWAY_CONTAINER,
    JUDGE_REVISION_LABEL,
    ORDINAL_LABEL,
    POOL_LABEL,
    PUBLISHED_LABEL,
    REVISION_LABEL,
    TOKEN_KEY,
    common_labels,
    pdb_name,
    pod_name,
    secret_name,
    service_name,
)

Manifest = dict[str, Any]
REVISION_LENGTH = 10
SGLANG_LAUNCHER = ["python3", "-m", "sglang.launch_server"]
WEIGHT_VERSION_FLAG = "--weight-version"
"""SGLang's name for the weights an answer came from (``meta_info.weight_version``)."""
SHUTDOWN_SLACK_SECONDS = 30
"""Engine shutdown after the drain, plus margin, inside terminationGracePeriodSeconds."""

ENGINE_KEY_DIR = "/run/genrm/engine-key"
"""Where a key-protected pool's init container writes the engine's ``--config`` file and the gateway's
key file: a memory-backed emptyDir, so the key never reaches the node's disk."""
ENGINE_CONFIG_PATH = f"{ENGINE_KEY_DIR}/{sidecar.ENGINE_CONFIG_FILE}"

ENGINE_PRESTOP = inspect.getsource(drained)
"""The engine's preStop hook: wait until the sidecar reports Drained so SGLang is not stopped under
admitted requests. It runs in the engine image (python3, no gateway) in the pod's network namespace."""


def owner_reference(pool: str, uid: str) -> Manifest:
    """Controller reference so garbage collection removes children with the pool."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": pool, "uid": uid,
        "controller": True, "blockOwnerDeletion": True,
    }


def engine_args(spec: GenRMPoolSpec) -> list[str]:
    """One command line for SGLang and the simulator: same seed and determinism on every replica. A
    key-protected engine gets ``--config`` with its key file (the key itself is on no command line).

    ``--weight-version`` is the judge revision, after the user's arguments: SGLang's parser keeps
    the last value, so every answer's ``weight_version`` names the judge that gave it, whatever
    ``args`` or ``extraArgs`` say."""
    engine = spec.engine
    config = ["--config", ENGINE_CONFIG_PATH] if engine.api_key else []
    return [*(engine.args or _generated_args(spec)), *engine.extra_args, WEIGHT_VERSION_FLAG, judge_revision(spec),
            *config]


def _generated_args(spec: GenRMPoolSpec) -> list[str]:
    engine, model = spec.engine, spec.model
    args = [
        "--model-path", model.path, "--host", "127.0.0.1", "--port", str(engine.port),
        "--random-seed", str(engine.seed), "--tp-size", str(engine.tensor_parallel_size), "--enable-metrics",
    ]
    if model.served_name:
        args += ["--served-model-name", model.served_name]
    if model.revision:
        args += ["--revision", model.revision]
    if engine.deterministic:
        args.append("--enable-deterministic-inference")
    return args


def gateway_limit_args(limits: GatewayLimits) -> list[str]:
    """``--max-head-bytes 65536 ...``: the gateway's flag for each field of ``spec.gateway.limits``."""
    args: list[str] = []
    for name, value in limits.model_dump().items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def _token_env(pool: str) -> Manifest:
    return {
        "name": sidecar.TOKEN_ENV,
        "valueFrom": {"secretKeyRef": {"name": secret_name(pool), "key": TOKEN_KEY}},
    }


def _with_gpus(resources: Manifest, gpus: int) -> Manifest:
    if gpus <= 0:
        return dict(resources)
    merged = {k: dict(v) for k, v in resources.items()}
    merged.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
    merged.setdefault("requests", {})["nvidia.com/gpu"] = str(gpus)
    return merged


def termination_grace_seconds(spec: GenRMPoolSpec) -> int:
    """Covers the preStop drain (propagation + drain timeout) and the engine's own shutdown."""
    drain = spec.drain
    return drain.propagation_seconds + drain.timeout_seconds + SHUTDOWN_SLACK_SECONDS


REVISION_MEMO = 256
_revisions: dict[int, tuple[GenRMPoolSpec, str, str]] = {}
"""Revisions already computed, by ``id(spec)``; each entry holds its spec, so the id stays that spec's."""


def template_revision(pool: str, spec: GenRMPoolSpec) -> str:
    """A hash of everything that shapes a replica pod (StatefulSet's controller-revision-hash).

    Computed from the builder's own output for a stand-in replica, minus what varies per replica
    (name, ordinal, published), so any spec field that reaches the pod changes it (images,
    resources, env, scheduling, the gateway's flags) and no other one does (replicas, the
    autoscaler, the Service, the update strategy).

    Remembered per spec object: specs are immutable and the shell keeps one per pool version, so
    every step on an unchanged pool would otherwise build and hash the same pod, a measurable share
    of the operator's CPU in a scale storm (figures: docs/performance.md#measurements-behind-the-code).
    """
    known = _revisions.get(id(spec))
    if known is not None and known[0] is spec and known[1] == pool:
        return known[2]
    revision = _template_revision(pool, spec)
    if len(_revisions) >= REVISION_MEMO:
        del _revisions[next(iter(_revisions))]
    _revisions[id(spec)] = (spec, pool, revision)
    return revision


def _template_revision(pool: str, spec: GenRMPoolSpec) -> str:
    pod = _replica_pod(pool, "", "", spec, pod_name(pool, 0), 0)
    labels = {k: v for k, v in pod["metadata"]["labels"].items() if k not in (ORDINAL_LABEL, PUBLISHED_LABEL)}
    shape = {"labels": labels, "annotations": pod["metadata"]["annotations"], "spec": pod["spec"]}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:REVISION_LENGTH]


def pod_manifest(pool: str, pool_uid: str, namespace: str, spec: GenRMPoolSpec, name: str, ordinal: int,
                 gpu_product: str = "") -> Manifest:
    """The replica pod: SGLang engine on loopback plus the gateway sidecar, labelled with its template revision.

    ``gpu_product`` (the pool's pin, `placement.choose`) is merged into the node affinity as a
    requirement. Like the ordinal it is no part of the template: it follows where the serving
    replicas run, and a change of it must not make every replica outdated."""
    pod = _replica_pod(pool, pool_uid, namespace, spec, name, ordinal)
    pod["metadata"]["labels"][REVISION_LABEL] = template_revision(pool, spec)
    if gpu_product:
        pod_spec = pod["spec"]
        pod_spec["affinity"] = placement.require_product(pod_spec["nodeSelector"], pod_spec.get("affinity", {}),
                                                         gpu_product)
    return pod


READINESS = {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1, "timeoutSeconds": 3}
"""The gateway's readiness probe timings (docs/gateway.md#readiness).

The gateway answers its readiness from what it already knows (the drain state and its engine
monitor's last verdict), so a failing answer is a verdict, given at once: a dead or unhealthy
engine, or a drain. One such answer takes the replica out of the Service (``failureThreshold: 1``);
a threshold of N would keep a replica with a dead engine in it for N - 1 more periods. What a busy
node delays is the answer itself, and the kubelet counts an answer later than ``timeoutSeconds`` as
a failure: so the timeout, not the threshold, is what lets a slow answer through. Planned removals
never wait for the probe: they unpublish first."""


def _replica_pod(pool: str, pool_uid: str, namespace: str, spec: GenRMPoolSpec, name: str, ordinal: int) -> Manifest:
    engine, gateway, template = spec.engine, spec.gateway, spec.template
    judge = judge_revision(spec)
    labels = {**template.labels, **common_labels(pool), ORDINAL_LABEL: str(ordinal), PUBLISHED_LABEL: "false",
              JUDGE_REVISION_LABEL: judge}
    drain_deadline = spec.drain.propagation_seconds + spec.drain.timeout_seconds
    engine_container: Manifest = {
        "name": ENGINE_CONTAINER,
        "image": engine.image,
        "command": list(engine.command or SGLANG_LAUNCHER),
        "args": engine_args(spec),
        "env": [*engine.env, _token_env(pool)],
        "resources": _with_gpus(engine.resources, engine.gpus_per_replica),
        "volumeMounts": list(template.volume_mounts),
        "lifecycle": {"preStop": {"exec": {"command": [
            "python3", "-c", ENGINE_PRESTOP, str(gateway.control_port), str(drain_deadline),
        ]}}},
    }
    gateway_container: Manifest = {
        "name": GATEWAY_CONTAINER,
        "image": gateway.image,
        "command": ["genrm-gateway", "serve"],
        "args": [
            "--host", "0.0.0.0", "--port", str(gateway.port), "--control-port", str(gateway.control_port),
            "--engine-url", f"http://127.0.0.1:{engine.port}",
            "--max-body-bytes", str(gateway.max_request_body_bytes),
            "--quiet-seconds", str(spec.drain.quiet_seconds),
            "--propagation-seconds", str(spec.drain.propagation_seconds),
            sidecar.JUDGE_REVISION_FLAG, judge,
            *gateway_limit_args(gateway.limits),
        ],
        "env": [_token_env(pool)],
        "ports": [{"name": sidecar.TRAFFIC_PORT_NAME, "containerPort": gateway.port, "protocol": "TCP"},
                  {"name": sidecar.CONTROL_PORT_NAME, "containerPort": gateway.control_port, "protocol": "TCP"}],
        "resources": dict(gateway.resources),
        "readinessProbe": {
            "httpGet": {"path": sidecar.READY_PATH, "port": sidecar.CONTROL_PORT_NAME}, **READINESS,
        },
        "livenessProbe": {
            "httpGet": {"path": sidecar.LIVE_PATH, "port": sidecar.CONTROL_PORT_NAME},
            "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5,
        },
        "lifecycle": {"preStop": {"exec": {"command": [
            "genrm-gateway", "drain", "--wait", "--control-port", str(gateway.control_port),
            "--deadline-seconds", str(drain_deadline),
        ]}}},
    }
    pod_spec: Manifest = {
        "containers": [engine_container, gateway_container],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "restartPolicy": "Always",
        "nodeSelector": dict(template.node_selector),
        "tolerations": list(template.tolerations),
        "imagePullSecrets": list(template.image_pull_secrets),
        "volumes": list(template.volumes),
        "enableServiceLinks": False,
    }
    if template.affinity:
        pod_spec["affinity"] = dict(template.affinity)
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    if template.service_account_name:
        pod_spec["serviceAccountName"] = template.service_account_name
    if engine.api_key:
        _protect_with_key(pod_spec, engine.api_key.secret_key_ref, gateway)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "labels": labels,
            "annotations": dict(template.annotations),
            "ownerReferences": [owner_reference(pool, pool_uid)],
        },
        "spec": pod_spec,
    }


def _protect_with_key(pod_spec: Manifest, ref: SecretKeySelector, gateway_spec: GatewaySpec) -> None:
    """Hand the key ``ref`` names (``spec.engine.apiKey``) to the engine and the gateway without any
    command line.

    SGLang reads its key from ``--api-key`` (every process list and the pod spec would show it) or from
    a ``--config`` file. So an init container of the gateway image, with the key in its environment (a
    ``secretKeyRef``, a mere reference in the pod spec), writes that file and the gateway's key file
    into a memory-backed volume that the engine and the gateway mount read-only; both then hold the
    key the pod started with, whichever container restarts. The operator never reads the Secret.
    """
    mount = {"name": ENGINE_KEY_CONTAINER, "mountPath": ENGINE_KEY_DIR}
    engine, gateway = pod_spec["containers"]
    engine["volumeMounts"] = [*engine["volumeMounts"], {**mount, "readOnly": True}]
    gateway["volumeMounts"] = [{**mount, "readOnly": True}]
    gateway["args"] = [*gateway["args"], "--engine-api-key-file", f"{ENGINE_KEY_DIR}/{sidecar.ENGINE_KEY_FILE}"]
    pod_spec["initContainers"] = [{
        "name": ENGINE_KEY_CONTAINER,
        "image": gateway_spec.image,
        "command": ["genrm-gateway", "engine-key"],
        "args": ["--dir", ENGINE_KEY_DIR],
        "env": [{"name": sidecar.ENGINE_KEY_ENV,
                 "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}],
        "resources": dict(gateway_spec.resources),
        "volumeMounts": [mount],
    }]
    pod_spec["volumes"] = [*pod_spec["volumes"],
                           {"name": ENGINE_KEY_CONTAINER, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]


def _owned(api_version: str, kind: str, name: str, pool: str, pool_uid: str, namespace: str, **body: Any) -> Manifest:
    """A pool-level child: common labels and a controller reference for garbage collection."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name, "namespace": namespace, "labels": common_labels(pool),
            "ownerReferences": [owner_reference(pool, pool_uid)],
        },
        **body,
    }


def service_manifest(pool: str, pool_uid: str, namespace: str, spec: GenRMPoolSpec,
                     judge: str | None = None) -> Manifest:
    """Service selecting only published replicas of the pool, and of judge revision ``judge`` alone when
    given (while the pool runs two: `judgeswitch.pinned_judge`)."""
    selector = {POOL_LABEL: pool, PUBLISHED_LABEL: "true"} | ({JUDGE_REVISION_LABEL: judge} if judge else {})
    return _owned("v1", "Service", service_name(pool), pool, pool_uid, namespace, spec={
        "type": spec.service.type,
        "selector": selector,
        "ports": [{"name": sidecar.TRAFFIC_PORT_NAME, "port": spec.service.port,
                   "targetPort": sidecar.TRAFFIC_PORT_NAME, "protocol": "TCP"}],
    })


def secret_manifest(pool: str, pool_uid: str, namespace: str, token: str) -> Manifest:
    """The sidecars' control token; created once, never rewritten, never logged."""
    return _owned("v1", "Secret", secret_name(pool), pool, pool_uid, namespace,
                  type="Opaque", stringData={TOKEN_KEY: token})


def pdb_manifest(pool: str, pool_uid: str, namespace: str, spec: GenRMPoolSpec) -> Manifest:
    """Limits voluntary evictions (node drains); the operator's own deletes are drains already."""
    return _owned("policy/v1", "PodDisruptionBudget", pdb_name(pool), pool, pool_uid, namespace, spec={
        "maxUnavailable": spec.disruption_budget.max_unavailable,
        "selector": {"matchLabels": {POOL_LABEL: pool}},
    })

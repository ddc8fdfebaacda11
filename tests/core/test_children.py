"""Tests of the pure child builders (replica Pod, Service, Secret, PodDisruptionBudget).

Aspects under test:
- the engine command line: one --random-seed for every replica, --enable-deterministic-inference
  only when deterministic, bound to 127.0.0.1, --enable-metrics, model/served name/revision,
  extra args appended, args and command overrides (the simulator stands in);
- nvidia.com/gpu requests and limits merged into the user's resources;
- readiness and liveness probes on the gateway's control port, a draining preStop hook on it, the
  per-client limits as gateway flags whose defaults are the gateway's own, and a
  terminationGracePeriodSeconds that covers propagation plus the drain timeout;
- the control token comes from the pool's Secret, never inline;
- a key-protected engine (spec.engine.apiKey): an init container of the gateway image writes the
  key from its Secret reference into a memory-backed volume, the engine reads it with --config and
  the gateway from its key file; the key is in no argument and no env value, only referenced;
- owner references (controller), labels (pool, ordinal, published=false), template settings;
- the Service selects only published replicas of its pool; the Secret and the PDB.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from typing import Any

import pytest
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_ENV, ENGINE_KEY_FILE
from genrm_gateway import cli as gateway_cli
from genrm_gateway.config import Limits
from genrm_operator.api.pool import GenRMPoolSpec
from genrm_operator.api.spec import KEY_SPELLINGS, GatewayLimits
from genrm_operator.core import children
from genrm_operator.core.judge import judge_revision
from genrm_operator.core.names import ORDINAL_LABEL, POOL_LABEL, PUBLISHED_LABEL, secret_name

POOL_UID = "7d1c0d3e-0000-4000-8000-000000000001"


def make_spec(**wire: Any) -> GenRMPoolSpec:
    return GenRMPoolSpec.model_validate({"replicas": 2, "model": {"path": "org/judge-7b"}, **wire})


def pod(spec: GenRMPoolSpec, ordinal: int = 3) -> dict[str, Any]:
    return children.pod_manifest("judge", POOL_UID, "ml", spec, f"judge-{ordinal}", ordinal)


def container(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in manifest["spec"]["containers"] if c["name"] == name)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_engine_runs_sglang_on_loopback_with_the_pools_single_seed_and_metrics() -> None:
    spec = make_spec(engine={"seed": 7, "tensorParallelSize": 2, "gpusPerReplica": 2})
    engine = container(pod(spec), "engine")
    assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
    args = engine["args"]
    assert flag(args, "--model-path") == "org/judge-7b"
    assert flag(args, "--host") == "127.0.0.1"
    assert flag(args, "--port") == "30000"
    assert flag(args, "--random-seed") == "7"
    assert flag(args, "--tp-size") == "2"
    assert "--enable-metrics" in args
    assert "--enable-deterministic-inference" in args


def test_every_replica_gets_the_same_engine_command_line() -> None:
    spec = make_spec(engine={"seed": 99})
    lines = {tuple(container(pod(spec, i), "engine")["args"]) for i in range(5)}
    assert len(lines) == 1


def test_deterministic_inference_is_only_requested_when_deterministic() -> None:
    args = container(pod(make_spec(engine={"deterministic": False})), "engine")["args"]
    assert "--enable-deterministic-inference" not in args


def test_served_name_revision_and_extra_args_are_passed_to_the_engine() -> None:
    spec = make_spec(model={"path": "org/judge-7b", "servedName": "judge", "revision": "v2"},
                     engine={"extraArgs": ["--mem-fraction-static", "0.8"]})
    args = container(pod(spec), "engine")["args"]
    assert flag(args, "--served-model-name") == "judge" and flag(args, "--revision") == "v2"
    assert args[-4:] == ["--mem-fraction-static", "0.8", "--weight-version", judge_revision(spec)], \
        "the user's arguments, then the judge revision, which SGLang's parser keeps as the last value"


def test_the_command_and_args_can_be_overridden_so_the_simulator_stands_in() -> None:
    spec = make_spec(engine={"command": ["genrm-sim"], "args": ["--port", "30000"], "extraArgs": ["--fast"]})
    engine = container(pod(spec), "engine")
    assert engine["command"] == ["genrm-sim"]
    assert engine["args"] == ["--port", "30000", "--fast", "--weight-version", judge_revision(spec)]
    seeded = container(pod(make_spec(engine={"command": ["genrm-sim"]})), "engine")
    assert seeded["command"] == ["genrm-sim"] and "--random-seed" in seeded["args"]


def test_gpus_are_requested_and_limited_on_top_of_the_users_resources() -> None:
    spec = make_spec(engine={"gpusPerReplica": 2, "tensorParallelSize": 2,
                             "resources": {"limits": {"memory": "64Gi"}, "requests": {"cpu": "8"}}})
    resources = container(pod(spec), "engine")["resources"]
    assert resources == {"limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
                         "requests": {"cpu": "8", "nvidia.com/gpu": "2"}}
    assert spec.engine.resources == {"limits": {"memory": "64Gi"}, "requests": {"cpu": "8"}}, "not mutated"
    cpu_only = container(pod(make_spec(engine={"gpusPerReplica": 0})), "engine")["resources"]
    assert "nvidia.com/gpu" not in str(cpu_only)


def test_probes_and_the_draining_pre_stop_hook_are_on_the_gateway_sidecar() -> None:
    spec = make_spec(gateway={"port": 8100, "controlPort": 9100},
                     drain={"propagationSeconds": 4, "timeoutSeconds": 120})
    manifest = pod(spec)
    gateway = container(manifest, "gateway")
    assert gateway["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"},
                                {"name": "control", "containerPort": 9100, "protocol": "TCP"}]
    assert gateway["readinessProbe"] == {
        "httpGet": {"path": "/healthz/ready", "port": "control"},
        # The gateway's 503 is a verdict (engine down, draining): one takes the replica out at once; a
        # slow answer within the timeout is no failure (docs/gateway.md#readiness).
        "periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1, "timeoutSeconds": 3,
    }
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz/live", "port": "control"}
    pre_stop = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:3] == ["genrm-gateway", "drain", "--wait"]
    assert flag(pre_stop, "--deadline-seconds") == "124" and flag(pre_stop, "--control-port") == "9100"
    assert flag(gateway["args"], "--engine-url") == "http://127.0.0.1:30000"
    assert flag(gateway["args"], "--port") == "8100" and flag(gateway["args"], "--control-port") == "9100"
    assert "readinessProbe" not in container(manifest, "engine")
    engine_pre_stop = container(manifest, "engine")["lifecycle"]["preStop"]["exec"]["command"]
    assert engine_pre_stop[:2] == ["python3", "-c"] and engine_pre_stop[3:] == ["9100", "124"]


@pytest.mark.parametrize(("state", "exit_code"), [("Drained", 0), ("Fenced", 1)])
def test_the_engine_pre_stop_script_runs_alone_and_waits_for_drained(state: str, exit_code: int) -> None:
    """The hook runs in the engine image, which has python3 but none of this project's packages."""
    seen: list[str] = []

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.path} {self.headers.get('authorization')}")
            body = json.dumps({"state": state}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        command = container(pod(make_spec()), "engine")["lifecycle"]["preStop"]["exec"]["command"]
        command = [sys.executable, "-I", *command[1:3], str(server.server_address[1]), "0.6"]
        done = subprocess.run(command, env={"GENRM_CONTROL_TOKEN": "tok"}, timeout=10, capture_output=True)
    finally:
        server.shutdown()
    assert done.returncode == exit_code, done.stderr
    assert seen and seen[0] == "/v1/state Bearer tok"


def test_every_gateway_limit_becomes_a_gateway_flag_with_the_gateways_own_default() -> None:
    """The API's defaults are the gateway's: a pool that sets nothing runs the gateway as shipped."""
    args = container(pod(make_spec(gateway={"limits": {"maxHeaders": 50}})), "gateway")["args"]
    assert flag(args, "--max-headers") == "50"
    parsed = gateway_cli.build_parser().parse_args(["serve", *args])
    defaults = Limits()
    for name in GatewayLimits.model_fields:
        assert f"--{name.replace('_', '-')}" in args
        if name != "max_headers":
            assert getattr(parsed, name) == getattr(defaults, name), name


def test_the_termination_grace_period_covers_propagation_and_the_drain_timeout() -> None:
    spec = make_spec(drain={"propagationSeconds": 5, "quietSeconds": 2, "timeoutSeconds": 600})
    grace = pod(spec)["spec"]["terminationGracePeriodSeconds"]
    assert grace == children.termination_grace_seconds(spec)
    assert grace >= 5 + 600 + children.SHUTDOWN_SLACK_SECONDS


def test_the_control_token_comes_from_the_pools_secret() -> None:
    manifest = pod(make_spec())
    for name in ("engine", "gateway"):
        env = {e["name"]: e for e in container(manifest, name)["env"]}
        assert env["GENRM_CONTROL_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": secret_name("judge"), "key": "token"}}
        assert "value" not in env["GENRM_CONTROL_TOKEN"]


KEY_REF = {"secretKeyRef": {"name": "judge-key", "key": "apiKey"}}


def test_a_key_protected_engine_gets_its_key_from_its_secret_and_on_no_command_line() -> None:
    manifest = pod(make_spec(engine={"apiKey": KEY_REF}, gateway={"image": "gw:1"}))
    pod_spec = manifest["spec"]
    [init] = pod_spec["initContainers"]
    assert (init["image"], init["command"]) == ("gw:1", ["genrm-gateway", "engine-key"])
    assert init["env"] == [{"name": ENGINE_KEY_ENV, "valueFrom": KEY_REF}]
    key_dir = gateway_cli.build_parser().parse_args(["engine-key", *init["args"]]).dir
    [mount] = init["volumeMounts"]
    assert mount == {"name": mount["name"], "mountPath": key_dir}
    assert {"name": mount["name"], "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod_spec["volumes"]
    engine, gateway = container(manifest, "engine"), container(manifest, "gateway")
    assert flag(engine["args"], "--config") == f"{key_dir}/{ENGINE_CONFIG_FILE}"
    served = gateway_cli.build_parser().parse_args(["serve", *gateway["args"]])
    assert served.engine_api_key_file == f"{key_dir}/{ENGINE_KEY_FILE}"
    for reader in (engine, gateway):
        assert {**mount, "readOnly": True} in reader["volumeMounts"]
    for each in (init, engine, gateway):
        assert not {arg.split("=", 1)[0] for arg in [*each["command"], *each["args"]]} & set(KEY_SPELLINGS)
        assert all("value" not in var for var in each["env"] if "valueFrom" in var)
    assert json.dumps(manifest).count('"judge-key"') == 1, "the Secret is named once: by the init container"


def test_a_pool_without_a_key_keeps_its_pod_as_it_was() -> None:
    manifest = pod(make_spec())
    assert "initContainers" not in manifest["spec"] and "--config" not in container(manifest, "engine")["args"]
    assert "--engine-api-key-file" not in container(manifest, "gateway")["args"]
    keyed = make_spec(engine={"apiKey": KEY_REF})
    assert children.template_revision("judge", keyed) != children.template_revision("judge", make_spec())


def test_pods_are_owned_by_the_pool_and_labelled_unpublished_with_their_ordinal() -> None:
    spec = make_spec(template={"labels": {"team": "rl", POOL_LABEL: "spoofed"}, "annotations": {"a": "b"},
                               "nodeSelector": {"gpu": "h100"}, "priorityClassName": "judges",
                               "serviceAccountName": "judge", "tolerations": [{"key": "gpu"}]})
    manifest = pod(spec, 5)
    meta = manifest["metadata"]
    assert (meta["name"], meta["namespace"]) == ("judge-5", "ml")
    assert meta["ownerReferences"] == [{
        "apiVersion": "genrm.io/v1alpha1", "kind": "GenRMPool", "name": "judge", "uid": POOL_UID,
        "controller": True, "blockOwnerDeletion": True}]
    labels = meta["labels"]
    assert labels[POOL_LABEL] == "judge", "template labels cannot take the pod out of its pool"
    assert labels[ORDINAL_LABEL] == "5" and labels[PUBLISHED_LABEL] == "false" and labels["team"] == "rl"
    assert labels["app.kubernetes.io/managed-by"] == "genrm-operator"
    assert meta["annotations"] == {"a": "b"}
    pod_spec = manifest["spec"]
    assert pod_spec["nodeSelector"] == {"gpu": "h100"} and pod_spec["priorityClassName"] == "judges"
    assert pod_spec["serviceAccountName"] == "judge" and pod_spec["tolerations"] == [{"key": "gpu"}]
    assert pod_spec["restartPolicy"] == "Always" and pod_spec["enableServiceLinks"] is False


def test_the_service_selects_only_published_replicas_of_its_pool() -> None:
    service = children.service_manifest("judge", POOL_UID, "ml", make_spec(service={"type": "NodePort",
                                                                                       "port": 9000}))
    assert service["spec"]["selector"] == {POOL_LABEL: "judge", PUBLISHED_LABEL: "true"}
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"] == [{"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}]
    assert service["metadata"]["ownerReferences"][0]["uid"] == POOL_UID


def test_the_secret_and_the_disruption_budget_are_owned_by_the_pool() -> None:
    secret = children.secret_manifest("judge", POOL_UID, "ml", "s3cr3t")
    assert secret["metadata"]["name"] == "judge-control" and secret["stringData"] == {"token": "s3cr3t"}
    pdb = children.pdb_manifest("judge", POOL_UID, "ml", make_spec(disruptionBudget={"maxUnavailable": 2}))
    assert pdb["spec"] == {"maxUnavailable": 2, "selector": {"matchLabels": {POOL_LABEL: "judge"}}}
    for manifest in (secret, pdb):
        assert manifest["metadata"]["ownerReferences"][0]["controller"] is True


def test_template_revision_is_remembered_per_spec_object_and_follows_every_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[str] = []
    compute = children._template_revision

    def counting(pool: str, spec: GenRMPoolSpec) -> str:
        computed.append(pool)
        return compute(pool, spec)

    monkeypatch.setattr(children, "_template_revision", counting)
    monkeypatch.setattr(children, "_revisions", {})
    spec = make_spec()
    first = children.template_revision("judge", spec)
    assert children.template_revision("judge", spec) == first and computed == ["judge"]
    assert children.template_revision("other", spec) != first, "the pool's name is part of the pod"
    assert children.template_revision("judge", make_spec()) == first, "an equal spec, computed anew"
    edited = make_spec(engine={"image": "sglang:2", "env": [{"name": "V", "value": "1"}]})
    assert children.template_revision("judge", edited) != first
    for _ in range(children.REVISION_MEMO + 10):
        children.template_revision("judge", make_spec())
    assert len(children._revisions) == children.REVISION_MEMO

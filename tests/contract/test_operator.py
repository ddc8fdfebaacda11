"""The operator against SGLang's contract: the engine command lines it renders (examples included)
start on SGLang, a key-protected pool's engine reads its key from its --config file and every
spelling SGLang reads as a key flag is refused in its arguments, the images are the pinned release,
and its verification probes (through each replica's gateway) work on engines as strict as SGLang,
for generative judges, reward models and key-protected engines alike, and greedy ones on engines
without deterministic inference."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_FILE
from genrm_gateway.apikey import write_engine_files
from genrm_operator.api.pool import GenRMPoolSpec
from genrm_operator.api.spec import KEY_FLAGS, KEY_SPELLINGS, SGLANG_IMAGE_TAG, ProbeRequest, VerificationSpec
from genrm_operator.core import children
from genrm_operator.shell.sidecar import Endpoint, SidecarClient, compare
from genrm_sim import cli
from genrm_sim.contract import Contract
from genrm_testing import CONTROL_TOKEN, run_gateway, run_sim

DET = "--enable-deterministic-inference"

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def engine_container(spec: GenRMPoolSpec) -> dict[str, Any]:
    pod = children.pod_manifest("p", "uid", "ns", spec, "p-0", 0)
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def assert_sglang_starts(args: list[str], sglang: Contract, simulator: bool = False) -> None:
    """Every flag spelled exactly as SGLang spells it (no abbreviation), and the command line passes
    SGLang's parser and start-up checks as the simulator repeats them."""
    names = {n for f in sglang.flags for n in f.names}
    for token in args:
        if token.startswith("--") and not (simulator and token.startswith("--sim-")):
            assert token.split("=", 1)[0] in names, f"{token} is not a flag of SGLang {sglang.version}"
    cli.parse_config(args)


@pytest.mark.parametrize("wire", [
    {},
    {"model": {"path": "org/judge", "servedName": "judge", "revision": "abc123"}},
    {"engine": {"deterministic": False, "tensorParallelSize": 2, "gpusPerReplica": 2},
     "verification": {"enabled": False}},
    {"engine": {"extraArgs": ["--attention-backend", "fa3", "--mem-fraction-static", "0.8"]}},
])
def test_the_pod_builders_engine_command_line_starts_on_sglang(wire: dict[str, Any], sglang: Contract) -> None:
    spec = GenRMPoolSpec.model_validate({"model": {"path": "org/judge"}} | wire)
    container = engine_container(spec)
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert_sglang_starts(container["args"], sglang)


def test_a_key_protected_pools_engine_reads_its_key_from_the_config_file(tmp_path: Path, sglang: Contract) -> None:
    spec = GenRMPoolSpec.model_validate({"model": {"path": "org/judge"},
                                         "engine": {"apiKey": {"secretKeyRef": {"name": "judge", "key": "apiKey"}}}})
    args = engine_container(spec)["args"]
    write_engine_files(tmp_path, "k-1")  # what the pod's init container writes at ENGINE_CONFIG_PATH
    local = [str(tmp_path / ENGINE_CONFIG_FILE) if arg == children.ENGINE_CONFIG_PATH else arg for arg in args]
    assert local != args and not any("k-1" in arg for arg in args)
    assert_sglang_starts(local, sglang)
    assert cli.parse_config(local).api_key == "k-1"


def test_the_refused_key_spellings_are_every_one_sglang_reads_as_a_key_flag() -> None:
    """SGLang's parser takes abbreviations (``--api-k``), so the CRD refuses each of them."""
    parser = cli.build_parser()
    read_as_key = set()
    for flag in KEY_FLAGS:
        for end in range(3, len(flag) + 1):
            try:
                args, _ = parser.parse_known_args(["--model-path", "m", flag[:end], "x"])
            except SystemExit:  # ambiguous
                continue
            if getattr(args, flag[2:].replace("-", "_"), None) == "x":
                read_as_key.add(flag[:end])
    assert read_as_key == set(KEY_SPELLINGS)


def test_an_extra_arg_sglang_would_refuse_is_caught(sglang: Contract) -> None:
    for extra in (["--attention-backend", "torch_native"], ["--mem-fraction", "0.8", "--no-such-flag"]):
        spec = GenRMPoolSpec.model_validate({"model": {"path": "m"}, "engine": {"extraArgs": extra}})
        with pytest.raises((AssertionError, SystemExit)):
            assert_sglang_starts(engine_container(spec)["args"], sglang)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_renders_an_engine_that_starts(path: Path, sglang: Contract) -> None:
    doc = yaml.safe_load(path.read_text())
    spec = GenRMPoolSpec.model_validate(doc["spec"])
    container = engine_container(spec)
    simulator = container["command"] == ["genrm-sim"]
    assert_sglang_starts(container["args"], sglang, simulator=simulator)
    if simulator:
        return
    assert spec.engine.image == f"lmsysorg/sglang:{sglang.image_tag}"
    assert not spec.verification.enabled or spec.verification.sampling == "Greedy" or spec.engine.deterministic
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    local_model = any(spec.model.path.startswith(f"{mount}/") for mount in mounts)
    assert local_model or env.get("HF_HOME") in mounts, \
        "the model (or its cache) must be mounted where the engine reads it"


def test_the_project_pins_one_sglang_release(sglang: Contract) -> None:
    assert SGLANG_IMAGE_TAG == sglang.image_tag
    assert GenRMPoolSpec.model_validate({"model": {"path": "m"}}).engine.image == f"lmsysorg/sglang:{sglang.image_tag}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^ARG SGLANG_IMAGE=lmsysorg/sglang:{re.escape(sglang.image_tag)}$", dockerfile, re.M)
    documented = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = 0
    for path in [*EXAMPLES, *documented]:
        for tag in re.findall(r"lmsysorg/sglang:([\w.\-]+)", path.read_text()):
            assert tag == sglang.image_tag, f"{path.name} uses lmsysorg/sglang:{tag}"
            named += path in documented
    assert named, "the docs no longer name the pinned SGLang image; this check would be empty"


def probe(endpoint: Endpoint, verification: VerificationSpec) -> list[str]:
    async def run() -> list[str]:
        client = SidecarClient()
        try:
            return await client.answers(endpoint, verification)
        finally:
            await client.close()
    return asyncio.run(run())


@contextmanager
def replica(*sim_args: str, gateway_args: tuple[str, ...] = ()) -> Iterator[Endpoint]:
    """A simulated replica as the operator reaches it: its gateway's control port, with the pool's token."""
    with run_sim(*sim_args, ready_path=None) as sim, run_gateway(sim.url, *gateway_args) as gateway:
        yield Endpoint("127.0.0.1", gateway.control_port, CONTROL_TOKEN)


def test_probes_agree_across_deterministic_judges_and_overlapping_verifications_do_not_collide() -> None:
    spec = VerificationSpec()
    with replica(DET, "--random-seed", "1", "--sim-ttft-ms", "200") as a, replica(DET, "--random-seed", "2") as b, \
            replica(DET, "--sim-perturb") as perturbed:
        async def overlapping() -> list[list[str]]:
            client = SidecarClient()
            try:
                return list(await asyncio.gather(*(client.answers(a, spec) for _ in range(3))))
            finally:
                await client.close()
        answers = asyncio.run(overlapping())
        assert answers[0] == answers[1] == answers[2]
        assert compare(probe(b, spec), answers[0])[0]
        assert not compare(probe(perturbed, spec), answers[0])[0]


def test_greedy_probes_agree_across_judges_without_deterministic_inference_and_seeded_ones_do_not() -> None:
    """Why sampling Greedy verifies a pool whose engine cannot run deterministic inference: such an
    engine ignores the seed of Seeded probes, so two identical replicas disagree on those."""
    greedy, seeded = VerificationSpec(sampling="Greedy"), VerificationSpec()
    with replica() as a, replica() as b, replica("--sim-perturb") as perturbed:
        reference = probe(a, greedy)
        assert compare(probe(b, greedy), reference) == (True, f"{len(reference)} probes identical to the reference")
        assert not compare(probe(perturbed, greedy), reference)[0]
        assert not compare(probe(b, seeded), probe(a, seeded))[0]


def test_reward_model_pools_are_verified_by_their_scores() -> None:
    spec = VerificationSpec(requests=[ProbeRequest(prompt="2+2=4"), ProbeRequest(prompt="2+2=5")])
    with replica("--sim-classifier", DET) as a, replica("--sim-classifier", DET) as b, \
            replica("--sim-classifier", DET, "--sim-perturb") as perturbed:
        scores = probe(a, spec)
        assert len(scores) == 2 and all(isinstance(float(s.strip("[]")), float) for s in scores)
        assert compare(probe(b, spec), scores) == (True, "2 probes identical to the reference")
        assert not compare(probe(perturbed, spec), scores)[0]


def test_a_key_protected_replica_is_verified_without_the_operator_holding_its_key(tmp_path: Path) -> None:
    """The probes carry the control token only; the gateway adds the engine's key."""
    write_engine_files(tmp_path, "judge-key")
    spec = VerificationSpec()
    with replica(DET, "--config", str(tmp_path / ENGINE_CONFIG_FILE),
                 gateway_args=("--engine-api-key-file", str(tmp_path / ENGINE_KEY_FILE))) as keyed, \
            replica(DET) as plain:
        assert compare(probe(keyed, spec), probe(plain, spec))[0]

"""A key-protected engine behind the gateway (``spec.engine.apiKey``), the simulator as strict as SGLang.

Aspects: the init container's command writes one key for the engine's ``--config`` file and the
gateway's key file, and refuses a key no header can carry; judge clients need the pool's key on
the traffic port (401 otherwise, counted; an ``openai`` client with the key works unchanged), while
the paths SGLang leaves open stay unauthenticated and ``/server_info``, which shows the key, stays
blocked; every engine call carries the gateway's own key, never the client's header (readiness,
``/metrics`` and ``/v1/loads`` load reads, judge requests, aborts); the operator's probes reach the
judge routes on the control port with the control token.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from conftest import AUTH, Stack, gateway_process, gateway_stack
from genrm_contract.revisions import REVISION_PATH
from genrm_contract.sidecar import ENGINE_CONFIG_FILE, ENGINE_KEY_ENV, ENGINE_KEY_FILE, PROBE_PREFIX, RefusalReason
from genrm_gateway import cli
from genrm_sim import cli as sim_cli
from spy import running_spy

pytestmark = pytest.mark.timeout(60)

KEY = "k3y:#'\"{x}-true"
"""Awkward for YAML (a colon, a comment sign, quotes, braces) yet a valid header value."""
BEARER = {"authorization": f"Bearer {KEY}"}
JUDGE = {"text": "Is 2+2=4?", "sampling_params": {"max_new_tokens": 8}}


def write_key(directory: Path, raw: str) -> None:
    """``genrm-gateway engine-key`` as the pod's init container runs it: the key in its environment."""
    subprocess.run([sys.executable, "-m", "genrm_gateway", "engine-key", "--dir", str(directory)], check=True,
                   env=os.environ | {ENGINE_KEY_ENV: raw})


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("engine-key")
    write_key(directory, f"  {KEY}\n")  # a Secret made from a file often ends in a newline
    return directory


@contextmanager
def keyed_stack(key_dir: Path, *sim_args: str) -> Iterator[Stack]:
    """The simulator with the key from its ``--config`` file, the gateway with the key file."""
    with gateway_stack("--engine-api-key-file", str(key_dir / ENGINE_KEY_FILE),
                       sim_args=("--config", str(key_dir / ENGINE_CONFIG_FILE), *sim_args)) as stack:
        yield stack


@pytest.fixture(scope="module")
def keyed(key_dir: Path) -> Iterator[Stack]:
    with keyed_stack(key_dir) as stack:
        yield stack


def refused(stack: Stack, reason: str) -> float:
    pattern = re.compile(rf'^genrm_gateway_refused_total\{{reason="{reason}"\}} (\S+)$', re.M)
    found = pattern.search(httpx.get(f"{stack.control}/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_the_init_container_writes_one_key_for_the_engine_and_the_gateway(key_dir: Path) -> None:
    config, key_file = key_dir / ENGINE_CONFIG_FILE, key_dir / ENGINE_KEY_FILE
    assert yaml.safe_load(config.read_text()) == {"api-key": KEY} and key_file.read_text() == KEY
    assert sim_cli.parse_config(["--model-path", "m", "--config", str(config)]).api_key == KEY
    assert {stat.S_IMODE(path.stat().st_mode) for path in (config, key_file)} == {0o444}


@pytest.mark.parametrize("raw", ["", " \n", "two words", "clé", "tab\there", "-dash-first"])
def test_a_key_no_header_can_carry_is_refused_without_showing_it(
        raw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_KEY_ENV, raw)
    with pytest.raises(SystemExit) as exited:
        cli.main(["engine-key", "--dir", str(tmp_path)])
    message = str(exited.value)
    assert ENGINE_KEY_ENV in message and (not raw.strip() or raw not in message)
    assert not list(tmp_path.iterdir())


def test_a_key_beginning_with_a_dash_would_stop_the_engine(tmp_path: Path) -> None:
    """Why ``engine-key`` refuses it: SGLang (and so the simulator) turns the file into ``--api-key
    <key>`` and its parser reads ``-…`` as a flag, so the engine would crash-loop."""
    config = tmp_path / ENGINE_CONFIG_FILE
    config.write_text(yaml.safe_dump({"api-key": "-dash-first"}))
    with pytest.raises(SystemExit):
        sim_cli.parse_config(["--model-path", "m", "--config", str(config)])


AS_THE_IMAGES_USER = """
import os, sys
from genrm_gateway import cli
if os.geteuid() == 0:  # root may write over read-only files: become the image's user, once imported
    os.setgroups([]); os.setgid(10001); os.setuid(10001)
cli.main(["engine-key", "--dir", sys.argv[1]])
"""


def test_the_init_container_can_run_again_over_its_own_files() -> None:
    """A recreated pod sandbox runs the init containers again over the same emptyDir, as the image's
    non-root user, and the first run's files are read-only: the second run must still succeed."""
    directory = Path(tempfile.mkdtemp())
    try:
        directory.chmod(0o777)  # an emptyDir's mode
        for key in ("first-key", "second-key"):
            subprocess.run([sys.executable, "-c", AS_THE_IMAGES_USER, str(directory)], check=True,
                           env=os.environ | {ENGINE_KEY_ENV: key})
        assert (directory / ENGINE_KEY_FILE).read_text() == "second-key"
        assert yaml.safe_load((directory / ENGINE_CONFIG_FILE).read_text()) == {"api-key": "second-key"}
        assert sorted(path.name for path in directory.iterdir()) == sorted([ENGINE_CONFIG_FILE, ENGINE_KEY_FILE])
    finally:
        shutil.rmtree(directory)


def test_a_gateway_whose_key_file_is_unusable_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(SystemExit, match=r"genrm-gateway: .*API key"):
            cli.main(["serve", "--engine-api-key-file", str(path)])


def test_judge_clients_need_the_pools_key(keyed: Stack) -> None:
    unauthenticated, invalid = RefusalReason.UNAUTHENTICATED, RefusalReason.INVALID_API_KEY
    before = {reason: refused(keyed, reason) for reason in (unauthenticated, invalid)}
    for headers, reason in (({}, unauthenticated), ({"authorization": KEY}, unauthenticated),
                            ({"authorization": f"Basic {KEY}"}, unauthenticated),
                            ({"authorization": "Bearer not-the-key"}, invalid)):
        answer = httpx.post(f"{keyed.url}/generate", json=JUDGE, headers=headers)
        assert answer.status_code == 401 and answer.json()["error"]["reason"] == reason, headers
        assert answer.headers["x-genrm-reason"] == reason and answer.headers["www-authenticate"] == "Bearer"
    assert {reason: refused(keyed, reason) - before[reason] for reason in before} == {
        unauthenticated: 3, invalid: 1}
    judged = httpx.post(f"{keyed.url}/generate", json=JUDGE, headers={"authorization": f"bEaReR {KEY}"})
    assert judged.status_code == 200 and judged.json()["text"]  # the scheme in any case, as SGLang
    with openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0) as judge:
        model = judge.models.list().data[0].id
        chat = judge.chat.completions.create(model=model, messages=[{"role": "user", "content": "2+2=4?"}])
        assert chat.choices[0].message.content
    with openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="none", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def test_the_revision_document_needs_the_pools_key_as_the_models_list_does(keyed: Stack) -> None:
    for path in ("/v1/models", REVISION_PATH):
        stranger = httpx.get(f"{keyed.url}{path}")
        assert stranger.status_code == 401, path
        assert stranger.headers["x-genrm-reason"] == RefusalReason.UNAUTHENTICATED, path
        assert httpx.get(f"{keyed.url}{path}", headers=BEARER).status_code == 200, path


def test_sglangs_open_paths_stay_open_and_server_info_never_shows_the_key(keyed: Stack) -> None:
    """``/server_info`` reports SGLang's ``api_key``: blocked for key holders, 401 for others."""
    for path in ("/server_info", "/get_server_info"):
        blocked = httpx.get(f"{keyed.url}{path}", headers=BEARER)
        assert blocked.status_code == 403 and blocked.json()["error"]["reason"] == RefusalReason.NOT_ALLOWED
        assert "k3y" not in blocked.text
        assert httpx.get(f"{keyed.url}{path}").status_code == 401
    assert httpx.get(f"{keyed.sim.url}/server_info", headers=BEARER).json()["api_key"] == KEY  # what is kept back
    for path in ("/health", "/health_generate", "/ready", "/metrics"):  # as SGLang: no key asked, then refused
        assert httpx.get(f"{keyed.url}{path}").json()["error"]["reason"] == RefusalReason.NOT_ALLOWED, path
    assert httpx.options(f"{keyed.url}/generate").status_code == 405
    assert httpx.get(f"{keyed.url}/no-such-route").status_code == 401
    assert httpx.get(f"{keyed.url}/no-such-route", headers=BEARER).status_code == 404


def test_a_leaving_client_aborts_its_request_on_a_keyed_engine(key_dir: Path) -> None:
    """The abort carries the key: without it the engine would go on until its own disconnect check (4 s)."""
    with keyed_stack(key_dir, "--sim-ttft-ms", "5000") as stack:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{stack.url}/generate", json=JUDGE, headers=BEARER, timeout=0.5)

        def engine_requests() -> int:
            load = httpx.get(f"{stack.sim.url}/v1/loads", headers=BEARER).json()["loads"][0]
            return int(load["num_running_reqs"] + load["num_waiting_reqs"])

        deadline = time.monotonic() + 2
        while engine_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine_requests() == 0


def test_every_engine_call_carries_the_gateways_key_and_never_the_clients_header(key_dir: Path) -> None:
    with running_spy() as spy:
        spy.metrics = b""  # no load series: the gateway reads SGLang's /v1/loads too
        with gateway_process(spy.url, "--engine-api-key-file", str(key_dir / ENGINE_KEY_FILE)) as gateway:
            assert httpx.post(f"{gateway.url}/generate", json=JUDGE,
                              headers={"authorization": f"bearer {KEY}"}).status_code == 200
            spy.misbehave = "silent"
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{gateway.url}/generate", json=JUDGE, headers=BEARER, timeout=0.5)
            deadline = time.monotonic() + 3
            while not any(s.target == "/abort_request" for s in spy.seen) and time.monotonic() < deadline:
                time.sleep(0.05)
    paths = {seen.target.split("?", 1)[0] for seen in spy.seen}
    assert {"/ready", "/metrics", "/v1/loads", "/generate", "/abort_request"} <= paths
    for seen in spy.seen:
        assert [value for name, value in seen.headers if name == "authorization"] == [f"Bearer {KEY}"], seen


def test_the_operators_probes_reach_the_judge_on_the_control_port_with_the_control_token(keyed: Stack) -> None:
    probe = f"{keyed.control}{PROBE_PREFIX}"
    assert httpx.get(f"{probe}/model_info", headers=AUTH).json()["is_generation"] is True
    answer = httpx.post(f"{probe}/generate", json=JUDGE, headers={**AUTH, "x-request-id": "genrm-verify-1"})
    assert answer.status_code == 200 and answer.json()["text"] and answer.headers["x-request-id"] == "genrm-verify-1"
    for headers, code, reason in (({}, 401, RefusalReason.UNAUTHENTICATED), (BEARER, 403, RefusalReason.FORBIDDEN),
                                  ({"authorization": "Bearer nope"}, 403, RefusalReason.FORBIDDEN)):
        refusal = httpx.post(f"{probe}/generate", json=JUDGE, headers=headers)
        assert (refusal.status_code, refusal.json()["error"]["reason"]) == (code, reason), headers
        assert refusal.headers["connection"] == "close"
    assert httpx.post(f"{probe}/flush_cache", json={}, headers=AUTH).status_code == 404
    large = {"text": "x" * 80_000, "sampling_params": {"max_new_tokens": 1}}  # beyond the control API's 64 KiB
    assert httpx.post(f"{probe}/generate", json=large, headers=AUTH).status_code == 200


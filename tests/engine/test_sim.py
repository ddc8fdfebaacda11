"""The simulator as a real process: SGLang's determinism rules, shapes, refusals, health, SIGTERM.

Each behaviour here is SGLang 0.5.23's as read from its source (see engine/genrm_sim/README.md):
what SGLang rejects, the simulator rejects, so a test that passes here does not crash real pods.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from genrm_sim import cli
from genrm_sim.dialects import NativeGenerate, Outcome
from genrm_testing import free_port, run_sim, wait_ready

pytestmark = pytest.mark.timeout(60)

DET = "--enable-deterministic-inference"
SAMPLED = {"text": "Is 2+2=4? Answer: yes", "sampling_params": {"temperature": 0.8, "max_new_tokens": 64}}
GREEDY = {"text": "Is 2+2=4? Answer: yes", "sampling_params": {"temperature": 0, "max_new_tokens": 64}}


def generate(url: str, body: dict[str, object]) -> str:
    response = httpx.post(f"{url}/generate", json=body, timeout=10)
    response.raise_for_status()
    text: str = response.json()["text"]
    return text


def seeded(seed: int) -> dict[str, object]:
    return {**SAMPLED, "sampling_params": {**SAMPLED["sampling_params"], "sampling_seed": seed}}  # type: ignore[dict-item]


def test_deterministic_inference_answers_from_prompt_and_sampling_seed_never_random_seed() -> None:
    with run_sim("--random-seed", "7", DET) as a, run_sim("--random-seed", "8", DET) as b, \
            run_sim("--random-seed", "7", DET, "--sim-perturb") as p:
        chat = {"model": "judge-sim", "messages": [{"role": "user", "content": "grade: 4"}], "seed": 3}
        for body in (SAMPLED, GREEDY, seeded(5)):
            assert generate(a.url, body) == generate(b.url, body) == generate(a.url, body)
        assert httpx.post(f"{a.url}/v1/chat/completions", json=chat).json()["choices"] == \
            httpx.post(f"{b.url}/v1/chat/completions", json=chat).json()["choices"]
        assert generate(a.url, seeded(5)) != generate(a.url, SAMPLED)
        assert generate(a.url, seeded(42)) == generate(a.url, SAMPLED)  # SGLang's default sampling seed
        assert generate(a.url, GREEDY) != generate(p.url, GREEDY)
        assert "Score:" in generate(a.url, GREEDY)


def test_without_deterministic_inference_sampled_answers_ignore_the_seed_and_differ() -> None:
    with run_sim("--random-seed", "7") as a, run_sim("--random-seed", "7") as b:
        assert generate(a.url, seeded(1234)) != generate(b.url, seeded(1234))
        assert generate(a.url, seeded(1234)) != generate(a.url, seeded(1234))
        assert generate(a.url, GREEDY) == generate(b.url, GREEDY)


def test_output_length_streaming_and_sglang_shapes() -> None:
    with run_sim("--random-seed", "1", "--served-model-name", "judge") as sim:
        body = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3}}).json()
        assert body["meta_info"]["completion_tokens"] == 3
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        completion = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()
        assert completion["usage"]["completion_tokens"] == 2
        greedy = {"text": "x", "sampling_params": {"temperature": 0}}
        with httpx.stream("POST", f"{sim.url}/generate", json={**greedy, "stream": True}) as stream:
            events = [line for line in stream.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["text"] == generate(sim.url, greedy)
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "stream": True,
                "stream_options": {"include_usage": True}}) as stream:
            chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line and line != "data: [DONE]"]
        assert chunks[-1]["usage"]["total_tokens"] > 0
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["id"] == "judge"
        for path in ("/model_info", "/get_model_info"):
            info = httpx.get(f"{sim.url}{path}").json()
            assert (info["model_path"], info["served_model_name"], info["is_generation"]) == \
                ("judge-sim", "judge", True)
        for path in ("/get_server_info", "/server_info"):
            info = httpx.get(f"{sim.url}{path}").json()
            assert info["random_seed"] == 1
            assert info["enable_deterministic_inference"] is False
            assert info["version"].startswith("0.5.23")
        loads = httpx.get(f"{sim.url}/v1/loads").json()["loads"]
        assert [(r["dp_rank"], r["num_running_reqs"], r["num_waiting_reqs"]) for r in loads] == [(0, 0, 0)]
        assert httpx.get(f"{sim.url}/get_load").status_code == 404  # removed from SGLang
        metrics = httpx.get(f"{sim.url}/metrics").text
        assert 'sglang:num_running_reqs{engine_type="unified",model_name="judge",moe_ep_rank="0",' \
               'pp_rank="0",tp_rank="0"} 0.0' in metrics
        assert 'sglang:e2e_request_latency_seconds_count{engine_type="unified",is_streaming="true",' \
               'model_name="judge"} 2.0' in metrics
        assert httpx.post(f"{sim.url}/generate", content=b"{nope").status_code == 400


def test_what_sglang_refuses_is_refused() -> None:
    with run_sim("--sim-ttft-ms", "300") as sim:
        unknown = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": {"temprature": 0}})
        assert unknown.status_code == 400
        assert unknown.json()["error"].startswith("unknown field `temprature`, expected one of")
        plain = httpx.post(f"{sim.url}/v1/completions", content=json.dumps({"prompt": "x"}))
        assert plain.status_code == 400 and "application/json" in plain.json()["message"]
        for kind in (None, "application/x-www-form-urlencoded"):  # FastAPI's strict content type; curl -d's
            untyped = httpx.post(f"{sim.url}/generate", content=json.dumps({"text": "x"}),
                                 headers={"content-type": kind} if kind else {})
            assert untyped.status_code == 400 and untyped.json()["type"] == "Bad Request", untyped.text
        assert httpx.post(f"{sim.url}/generate", content=json.dumps({"text": "x"}),
                          headers={"content-type": "application/vnd.judge+json"}).status_code == 200

        first = threading.Thread(target=lambda: httpx.post(f"{sim.url}/generate", json={"text": "x", "rid": "r"}))
        first.start()
        time.sleep(0.1)
        duplicate = httpx.post(f"{sim.url}/generate", json={"text": "y", "rid": "r"})
        assert duplicate.status_code == 400
        assert duplicate.json() == {"error": {"message": "Duplicate request ID detected: r"}}
        first.join()
        assert httpx.post(f"{sim.url}/generate", json={"text": "y", "rid": "r"}).status_code == 200
        assert httpx.post(f"{sim.url}/classify", json={"text": "x"}).status_code == 400  # not a reward model


def test_health_is_a_generation_ready_is_cheap_and_the_port_opens_once_loaded() -> None:
    launched_at = time.monotonic()
    with run_sim("--sim-startup-seconds", "1.5", ready_path=None) as sim:
        with pytest.raises(httpx.ConnectError):  # SGLang opens its port once the weights are loaded
            httpx.get(f"{sim.url}/health")
        wait_ready(f"{sim.url}/ready", seconds=10)
        assert time.monotonic() - launched_at >= 1.5
        started = time.monotonic()
        assert httpx.get(f"{sim.url}/health", timeout=25).status_code == 200
        assert time.monotonic() - started >= 1.0
        metrics = httpx.get(f"{sim.url}/metrics").text
        assert 'sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="judge-sim"} 0.0' \
            in metrics  # SGLang leaves its health generation out of the request metrics


def test_queueing_and_abort() -> None:
    with run_sim("--sim-ttft-ms", "400", "--max-running-requests", "1") as sim:
        results: list[dict[str, object]] = []
        threads = [threading.Thread(target=lambda rid=rid: results.append(httpx.post(
            f"{sim.url}/generate", json={"text": "x", "rid": rid}, timeout=10).json())) for rid in ("a", "b")]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        load = httpx.get(f"{sim.url}/v1/loads").json()["loads"][0]
        assert (load["num_running_reqs"], load["num_waiting_reqs"], load["max_running_requests"]) == (1, 1, 1)
        httpx.post(f"{sim.url}/abort_request", json={"abort_all": True})
        for thread in threads:
            thread.join()
        reasons = {r["meta_info"]["finish_reason"]["type"] for r in results}  # type: ignore[index]
        assert "abort" in reasons


def test_abort_is_by_prefix_of_an_id_in_flight_as_in_sglang() -> None:
    """SGLang's scheduler aborts every rid that starts with the aborted one; its tokenizer manager
    drops an abort whose rid is not in flight (so ``a-`` alone aborts nothing)."""
    with run_sim("--sim-ttft-ms", "1500") as sim:
        rids = ("a-1", "a-10", "a-1.0", "a-2", "b-1")
        results: dict[str, str] = {}

        def post(rid: str) -> None:
            body = httpx.post(f"{sim.url}/generate", json={"text": "x", "rid": rid}, timeout=10).json()
            results[rid] = body["meta_info"]["finish_reason"]["type"]

        threads = [threading.Thread(target=post, args=(rid,)) for rid in rids]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        httpx.post(f"{sim.url}/abort_request", json={"rid": "a-"})  # not in flight: ignored
        httpx.post(f"{sim.url}/abort_request", json={"rid": ""})  # empty: ignored, not "abort all"
        httpx.post(f"{sim.url}/abort_request", json={"rid": "a-1"})
        for thread in threads:
            thread.join()
        assert results == {"a-1": "abort", "a-10": "abort", "a-1.0": "abort", "a-2": "stop", "b-1": "stop"}


def test_a_batched_generate_answers_one_result_per_rid() -> None:
    """SGLang's batched ``/generate``: a list of results in prompt order, each under its rid (the
    client's list, ``<rid>_<i>`` for one string); streamed, chunks carry their member's ``index``."""
    with run_sim("--sim-itl-ms", "1") as sim:
        params = {"temperature": 0, "max_new_tokens": 4}
        batch = httpx.post(f"{sim.url}/generate", json={
            "text": ["one", "two", "three"], "rid": ["r0", "r1", "r2"], "sampling_params": params}).json()
        assert [item["meta_info"]["id"] for item in batch] == ["r0", "r1", "r2"]
        assert [item["text"] for item in batch] == [generate(sim.url, {"text": t, "sampling_params": params})
                                                    for t in ("one", "two", "three")]
        named = httpx.post(f"{sim.url}/generate", json={"text": ["a", "b"], "rid": "job", "sampling_params": params})
        assert [item["meta_info"]["id"] for item in named.json()] == ["job_0", "job_1"]
        mismatch = httpx.post(f"{sim.url}/generate", json={"text": ["a", "b"], "rid": ["only"]})
        assert mismatch.status_code == 400
        assert mismatch.json()["error"]["message"] == \
            "The specified rids length mismatch with the batch_size for batch processing."
        with httpx.stream("POST", f"{sim.url}/generate", json={
                "text": ["one", "two"], "stream": True, "sampling_params": params}) as stream:
            events = [line for line in stream.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in events[:-1]]
        final = {c["index"]: c["text"] for c in chunks if c["meta_info"]["finish_reason"] is not None}
        assert final == {0: batch[0]["text"], 1: batch[1]["text"]}


def test_sampling_params_sglang_refuses_with_its_messages() -> None:
    """SGLang's schema check (``api_types.decode_SamplingParams``: a plain 400 with serde's text)
    and ``SamplingParams.verify`` (a 400, or inside an already open stream an error event)."""
    with run_sim() as sim:
        def refusal(sampling: dict[str, object]) -> object:
            response = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": sampling})
            assert response.status_code == 400, sampling
            return response.json()["error"]

        assert refusal({"top_p": 0}) == {"message": "top_p must be in (0, 1], got 0."}
        assert refusal({"top_k": 0}) == {"message": "top_k must be -1 (disable) or at least 1, got 0."}
        assert refusal({"temperature": -0.5}) == \
            {"message": "temperature must be a non-negative finite number, got -0.5."}
        assert refusal({"max_new_tokens": -1}) == {"message": "max_new_tokens must be at least 0, got -1."}
        assert refusal({"max_new_tokens": 4.0}) == "invalid type: floating point `4.0`, expected i64"
        assert refusal({"top_p": "0.9"}) == 'invalid type: string "0.9", expected f64'
        # A temperature of 0 is greedy: SGLang sets top-k to 1 before checking it.
        assert httpx.post(f"{sim.url}/generate", json={
            "text": "x", "sampling_params": {"temperature": 0, "top_k": 0}}).status_code == 200
        with httpx.stream("POST", f"{sim.url}/generate", json={
                "text": "x", "stream": True, "sampling_params": {"top_p": 0}}) as stream:
            assert stream.status_code == 200
            events = [line for line in stream.iter_lines() if line]
        assert events == ['data: {"error":{"message":"top_p must be in (0, 1], got 0.","type":"invalid_request_error",'
                          '"code":400,"retryable":false}}', "data: [DONE]"]
        typed = httpx.post(f"{sim.url}/generate", json={"text": "x", "stream": True,
                                                         "sampling_params": {"max_new_tokens": 4.0}})
        assert typed.status_code == 400  # the schema check comes before the stream opens


def test_the_context_length_bounds_prompt_and_output_as_in_sglang() -> None:
    with run_sim("--context-length", "50") as sim, run_sim("--context-length", "50", "--allow-auto-truncate") as cut:
        ten_words = " ".join(["word"] * 10)
        asked = {"text": ten_words, "sampling_params": {"max_new_tokens": 41}}
        refused = httpx.post(f"{sim.url}/generate", json=asked)
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == (
            "Requested token count exceeds the model's maximum context length of 50 tokens. You requested a total "
            "of 51 tokens: 10 tokens from the input messages and 41 tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit.")
        assert httpx.post(f"{sim.url}/generate", json={**asked, "sampling_params": {"max_new_tokens": 40}}) \
            .status_code == 200
        assert httpx.post(f"{sim.url}/generate", json={"text": ten_words}).status_code == 200  # no length asked
        long = httpx.post(f"{sim.url}/generate", json={"text": " ".join(["word"] * 50)})
        assert long.json()["error"]["message"] == \
            "The input (50 tokens) is longer than the model's context length (50 tokens)."
        truncated = httpx.post(f"{cut.url}/generate", json={**asked, "sampling_params": {
            "max_new_tokens": 41, "ignore_eos": True}})
        assert truncated.status_code == 200 and truncated.json()["meta_info"]["completion_tokens"] <= 40
        assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["max_model_len"] == 50


def test_a_streamed_generate_ends_with_its_finish_reason() -> None:
    with run_sim("--sim-itl-ms", "200") as sim:
        def last_chunk(body: dict[str, object], abort_after: float | None = None) -> dict[str, object]:
            with httpx.stream("POST", f"{sim.url}/generate", json={**body, "stream": True}) as stream:
                if abort_after is not None:
                    time.sleep(abort_after)
                    httpx.post(f"{sim.url}/abort_request", json={"rid": body["rid"]})
                events = [line for line in stream.iter_lines() if line]
            assert events[-1] == "data: [DONE]"
            chunk: dict[str, object] = json.loads(events[-2][6:])
            assert all(json.loads(e[6:])["meta_info"]["finish_reason"] is None for e in events[:-2])
            return chunk

        length = last_chunk({"text": "x", "sampling_params": {"max_new_tokens": 2}})
        assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 2}  # type: ignore[index]
        assert length["meta_info"]["completion_tokens"] == 2  # type: ignore[index]
        stop = last_chunk({"text": "x", "sampling_params": {"temperature": 0, "max_new_tokens": 500}})
        assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}  # type: ignore[index]
        aborted = last_chunk({"text": "x", "rid": "cut", "sampling_params": {"max_new_tokens": 50}}, abort_after=0.5)
        assert aborted["meta_info"]["finish_reason"] == {  # type: ignore[index]
            "type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def test_idle_keep_alive_connections_close_after_five_seconds_as_sglangs_uvicorn() -> None:
    with run_sim() as sim, socket.create_connection(("127.0.0.1", sim.port)) as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += conn.recv(65536)
        answered = time.monotonic()
        conn.settimeout(10)
        assert conn.recv(1) == b""  # closed by the server
        assert 4.5 <= time.monotonic() - answered <= 7


def test_an_api_key_guards_every_route_but_the_probes_and_metrics_as_in_sglang() -> None:
    """SGLang's ``decide_request_auth`` with ``--api-key`` (no admin key): ``/health*``, ``/ready*``
    and ``/metrics*`` pass, as does ``OPTIONS``; everything else needs the bearer token."""
    with run_sim("--api-key", "s3cret") as sim:
        good, bad = {"authorization": "Bearer s3cret"}, {"authorization": "Bearer nope"}
        for path in ("/health", "/ready", "/metrics"):
            assert httpx.get(f"{sim.url}{path}", timeout=25).status_code == 200, path
        for method, path in (("GET", "/v1/models"), ("GET", "/ping"), ("GET", "/"), ("GET", "/v1/loads"),
                             ("POST", "/generate"), ("POST", "/abort_request"), ("GET", "/server_info")):
            for headers in ({}, bad, {"authorization": "s3cret"}, {"authorization": "Basic s3cret"}):
                refused = httpx.request(method, f"{sim.url}{path}", headers=headers, json={"text": "x"})
                assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"}), (path, headers)
        assert httpx.post(f"{sim.url}/generate", headers=good, json={"text": "x"}).status_code == 200
        assert httpx.post(f"{sim.url}/generate", headers={"authorization": "bearer s3cret"},
                          json={"text": "x"}).status_code == 200  # the scheme is case-insensitive
        assert httpx.options(f"{sim.url}/generate").status_code != 401


def config_file(tmp_path: Path, text: str, name: str = "sglang.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_config_file_is_merged_as_sglang_merges_it_and_the_command_line_wins(tmp_path: Path) -> None:
    """``prepare_server_args``: the file's flags go before the command line (which wins), keys are
    flag spellings, a true ``store_true`` is the bare flag and a false one nothing."""
    path = config_file(tmp_path, 'api-key: "k: #1"\nport: 31000\nrandom-seed: 5\nenable-metrics: true\n'
                                 "enable-deterministic-inference: false\nserved-model-name: from-file\n")
    config = cli.parse_config(["--model-path", "m", "--config", path, "--random-seed", "9"])
    assert (config.api_key, config.port, config.random_seed, config.served_model_name) == ("k: #1", 31000, 9,
                                                                                            "from-file")
    assert config.enable_metrics and not config.enable_deterministic_inference
    assert cli.parse_config(["--model-path", "m", "--config", config_file(tmp_path, "")]).api_key is None
    numeric = config_file(tmp_path, "api-key: 12345\n", "n.yml")  # YAML's int, passed on as str(value)
    assert cli.parse_config(["--model-path", "m", "--config", numeric]).api_key == "12345"


def test_only_a_separate_config_token_reads_the_file(tmp_path: Path) -> None:
    """``--config=f.yaml`` is parsed as a flag and the file never read, as in SGLang."""
    path = config_file(tmp_path, "api-key: never-read\n")
    assert cli.parse_config(["--model-path", "m", f"--config={path}"]).api_key is None
    assert cli.parse_config(["--model-path", "m", "--config=/no/such/file.json"]).api_key is None


@pytest.mark.parametrize(("text", "name", "argv", "message"), [
    ("api-key: k\n", "c.json", [], "Config file must be YAML format, got: .json"),
    ("api-key: k\n", "c.yaml", ["--config", "/no/such.yaml"], "Multiple config files specified"),
    ("- api-key\n", "c.yaml", [], "Config file must contain a dictionary at root level"),
    ("dllm-fdfo: true\n", "c.yaml", [], "Unsupported config option 'dllm_fdfo' with action"),
    ("api-key: [unclosed\n", "c.yaml", [], "ParserError"),
])
def test_a_config_file_sglang_would_refuse_exits(tmp_path: Path, text: str, name: str, argv: list[str],
                                                 message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parse_config(["--model-path", "m", "--config", config_file(tmp_path, text, name), *argv])
    assert message in str(exited.value)
    for bad, said in ((["--config"], "No config file specified"),
                      (["--config", str(tmp_path / "missing.yaml")], "Config file not found")):
        with pytest.raises(SystemExit, match=said):
            cli.parse_config(["--model-path", "m", *bad])


def test_a_config_key_is_a_flag_spelling_so_underscores_are_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang turns each key into ``--<key>`` as written: ``api_key`` is ``--api_key``, no flag of its."""
    with pytest.raises(SystemExit) as exited:
        cli.parse_config(["--model-path", "m", "--config", config_file(tmp_path, "api_key: k\n")])
    assert exited.value.code == 2 and "--api_key" in capsys.readouterr().err


def test_a_key_from_a_config_file_guards_the_engine_and_is_on_no_command_line(tmp_path: Path) -> None:
    key = "from-the-file-7f3a"
    with run_sim("--config", config_file(tmp_path, f"api-key: {key}\n")) as sim:
        assert httpx.get(f"{sim.url}/v1/models").status_code == 401
        assert httpx.get(f"{sim.url}/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(f"{sim.url}/ready").status_code == 200
        assert key.encode() not in Path(f"/proc/{sim.process.pid}/cmdline").read_bytes()


def test_failure_injection_from_flags_and_env() -> None:
    with run_sim(env={"GENRM_SIM_ERROR_RATE": "1"}) as failing:
        assert httpx.post(f"{failing.url}/generate", json={"text": "x"}).status_code == 500
    with run_sim("--sim-crash-after", "1") as crashing:
        assert httpx.post(f"{crashing.url}/generate", json={"text": "x"}).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{crashing.url}/generate", json={"text": "x"})
        assert crashing.process.wait(5) != 0
    with run_sim("--sim-hang") as hanging:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{hanging.url}/generate", json={"text": "x"}, timeout=0.5)
        hanging.process.kill()  # a hung request never finishes, so SIGTERM would wait for it


def start(*args: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "genrm_sim", "--model-path", "m", "--port", str(port), *args],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    return proc, port


def test_sglang_flags_are_checked_like_sglang() -> None:
    for args, message in (
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--attention-backend", "fa9"], "argument --attention-backend: invalid choice: 'fa9'"),
        (["--port", "http"], "argument --port: invalid int value: 'http'"),
        ([DET, "--attention-backend", "torch_native"], "attention backends are supported for deterministic"),
    ):
        proc, _ = start(*args)
        try:
            _, stderr = proc.communicate(timeout=20)
        finally:
            proc.kill()
        assert proc.returncode != 0 and message in stderr, (args, stderr)

    proc, port = start("--mem-fraction-static", "0.8", DET, "--attention-backend", "fa3", "--tp-size", "1",
                       "--skip-server-warmup", "--sim-sigterm-poll-seconds", "0.1")
    try:
        wait_ready(f"http://127.0.0.1:{port}/ready")
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404  # no --enable-metrics
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    warnings = [line for line in stderr.splitlines() if "ignoring SGLang flags" in line]
    assert len(warnings) == 1 and "--mem-fraction-static" in warnings[0] and "--tp-size" not in warnings[0]


def test_reward_model_answers_classify_with_scores() -> None:
    with run_sim("--sim-classifier", DET) as a, run_sim("--sim-classifier", DET, "--random-seed", "9") as b, \
            run_sim("--sim-classifier") as loose, run_sim("--sim-classifier") as loose2:
        one = httpx.post(f"{a.url}/classify", json={"text": "good answer", "rid": "c1"}).json()
        assert one["meta_info"]["id"] == "c1" and isinstance(one["embedding"][0], float)
        assert httpx.post(f"{b.url}/classify", json={"text": "good answer"}).json()["embedding"] == one["embedding"]
        batch = httpx.post(f"{a.url}/classify", json={"text": ["good answer", "bad answer"]}).json()
        assert batch[0]["embedding"] == one["embedding"] != batch[1]["embedding"]
        one_rid_for_a_batch = httpx.post(f"{a.url}/classify", json={"text": ["a", "b"], "rid": "r"})
        assert one_rid_for_a_batch.status_code == 500  # SGLang asserts that a batch has a list of rids
        openai = httpx.post(f"{a.url}/v1/classify", json={"input": "good answer"}).json()
        assert openai["data"][0]["probs"] == [1.0]  # SGLang's softmax over one label
        assert httpx.post(f"{a.url}/generate", json={"text": "x"}).status_code == 400
        assert httpx.get(f"{a.url}/model_info").json()["is_generation"] is False
        scores = [httpx.post(f"{s.url}/classify", json={"text": "good answer"}).json()["embedding"][0]
                  for s in (loose, loose2)]
        assert scores[0] != scores[1] and abs(scores[0] - scores[1]) < 1e-3  # batch noise without determinism


def test_sigterm_like_sglang_health_503_requests_still_served_then_exit() -> None:
    with run_sim("--sim-ttft-ms", "1000", "--sim-sigterm-poll-seconds", "1.5") as sim:
        result: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: result.append(
            httpx.post(f"{sim.url}/generate", json={"text": "x"}, timeout=10)))
        thread.start()
        time.sleep(0.3)
        sim.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert httpx.get(f"{sim.url}/health").status_code == 503
        assert httpx.get(f"{sim.url}/ready").status_code == 503
        assert httpx.post(f"{sim.url}/generate", json={"text": "late"}).status_code == 200  # still served
        thread.join()
        assert result[0].status_code == 200
        assert sim.process.wait(5) == 0


def test_ignore_eos_decodes_to_max_new_tokens_on_every_api() -> None:
    """SGLang ignores the end of sequence with ``ignore_eos``: the output is exactly as long as asked."""
    with run_sim() as sim:
        native = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": {
            "max_new_tokens": 300, "temperature": 0, "ignore_eos": True}}).json()
        assert native["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
        assert len(native["output_ids"]) == native["meta_info"]["completion_tokens"] == 300
        assert native["text"].startswith(generate(sim.url, {"text": "x", "sampling_params": {"temperature": 0}}))
        chat = httpx.post(f"{sim.url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 90, "ignore_eos": True}).json()
        assert (chat["usage"]["completion_tokens"], chat["choices"][0]["finish_reason"]) == (90, "length")


def test_a_native_answer_carries_sglangs_meta_info_and_token_ids() -> None:
    """``meta_info`` as SGLang's tokenizer manager builds it, timings only under ``--enable-metrics``;
    a stream's first chunk says when it was sent, its last adds the spans and latencies."""
    with run_sim("--sim-itl-ms", "1") as sim, \
            run_sim("--sim-itl-ms", "1", "--revision", "r7", "--weight-version", "w3") as other:
        body = {"text": "x", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
        answer = httpx.post(f"{sim.url}/generate", json=body).json()
        meta = answer["meta_info"]
        assert len(answer["output_ids"]) == 5 and all(isinstance(i, int) for i in answer["output_ids"])
        assert httpx.post(f"{sim.url}/generate", json=body).json()["output_ids"] == answer["output_ids"]  # greedy
        assert (meta["weight_version"], meta["num_retractions"], meta["cached_tokens_details"]) == ("default", 0, None)
        assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 5}]
        assert meta["request_received_ts"] <= meta["forward_entry_time"] <= meta["request_finished_ts"]
        assert meta["e2e_latency"] > 0 and meta["decode_throughput"] > 0
        with httpx.stream("POST", f"{sim.url}/generate", json={**body, "stream": True}) as stream:
            chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line and line != "data: [DONE]"]
        assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]  # cumulative, as the text
        assert ["response_sent_to_client_ts" in c["meta_info"] for c in chunks] == [True, False, False, False, True]
        assert "e2e_latency" in chunks[-1]["meta_info"] and "e2e_latency" not in chunks[-2]["meta_info"]
        # SGLang's weight version is --weight-version's, whatever --revision downloaded.
        assert httpx.post(f"{other.url}/generate", json=body).json()["meta_info"]["weight_version"] == "w3"
        assert httpx.get(f"{other.url}/model_info").json()["weight_version"] == "w3"
    call, outcome = NativeGenerate().parse({"text": "x"}, "m", False), Outcome("r", "t", "length", 1, 1)
    assert "queue_time" not in NativeGenerate().response(call, outcome)["meta_info"]  # without --enable-metrics
    assert "queue_time" in NativeGenerate(metrics=True).response(call, outcome)["meta_info"]


def test_what_fastapi_refuses_is_refused_in_openais_error_shape() -> None:
    """A body SGLang's request model cannot validate is refused before its route runs, on every route,
    as ``{"object": "error", ..., "type": "Bad Request", "code": 400}``; SGLang's own refusals on the
    OpenAI routes have type ``BadRequestError``."""
    with run_sim() as sim:
        def refused(path: str, **request: object) -> dict[str, object]:
            response = httpx.post(f"{sim.url}{path}", **request)  # type: ignore[arg-type]
            assert response.status_code == 400, (path, request, response.text)
            body: dict[str, object] = response.json()
            return body

        for content in (b"", b'{"text": ', b"[1, 2]"):
            assert refused("/generate", content=content)["type"] == "Bad Request"
        for body in ({"text": 5}, {"input_ids": "1 2"}, {"text": "x", "rid": 7}, {"text": "x", "sampling_params": 1}):
            assert refused("/generate", json=body)["type"] == "Bad Request"
        assert refused("/generate", json={"sampling_params": {}})["error"] == {
            "message": "Either text, input_ids or input_embeds should be provided."}
        assert refused("/abort_request", content=b"")["type"] == "Bad Request"
        assert refused("/abort_request", json={"rid": 3})["type"] == "Bad Request"
        chat = {"messages": [{"role": "user", "content": "x"}]}
        assert refused("/v1/chat/completions", json={**chat, "max_tokens": "many"})["type"] == "Bad Request"
        assert refused("/v1/chat/completions", json={"model": "m"})["type"] == "Bad Request"
        for body in ({**chat, "temperature": -1}, {**chat, "top_p": 0}, {**chat, "messages": []}):
            assert refused("/v1/chat/completions", json=body)["type"] == "BadRequestError", body
        assert refused("/v1/classify", json={"input": "x"})["type"] == "BadRequestError"  # not a reward model


def test_openai_answers_and_streams_have_sglangs_framing() -> None:
    """Answers under the request's model name; chat streams open with the role's chunk and close with
    the finish reason's, without content; completion chunks carry ``usage: null`` and the last token's
    the finish reason."""
    with run_sim("--served-model-name", "judge") as sim:
        chat = {"model": "any-name", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
        answer = httpx.post(f"{sim.url}/v1/chat/completions", json=chat).json()
        assert answer["model"] == "any-name" and answer["choices"][0]["message"]["reasoning_content"] is None
        assert answer["metadata"] == {"weight_version": "default",
                                      "weight_versions": [{"version": "default", "start": 0, "end": 3}]}
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={**chat, "stream": True}) as stream:
            deltas = [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"])
                      for c in (json.loads(line[6:]) for line in stream.iter_lines()
                                if line and line != "data: [DONE]")]
        assert deltas[0] == ({"reasoning_content": None, "role": "assistant", "content": ""}, None)
        assert [set(d) for d, _ in deltas[1:-1]] == [{"reasoning_content", "content"}] * 3
        assert deltas[-1] == ({"reasoning_content": None}, "length")
        with httpx.stream("POST", f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True,
                                                                     "stream_options": {"include_usage": True}}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line and line != "data: [DONE]"]
        assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
        assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 3


def test_model_cards_cache_flush_and_load_sections_as_sglang() -> None:
    with run_sim("--served-model-name", "judge", "--sim-ttft-ms", "500") as sim:
        card = httpx.get(f"{sim.url}/v1/models/judge").json()
        assert card == httpx.get(f"{sim.url}/v1/models").json()["data"][0] | {"created": card["created"]}
        assert (card["root"], card["parent"]) == ("judge", None)
        missing = httpx.get(f"{sim.url}/v1/models/other")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert httpx.post(f"{sim.url}/flush_cache").text.startswith("Cache flushed.")
        busy = threading.Thread(target=lambda: httpx.post(f"{sim.url}/generate", json={"text": "x"}, timeout=10))
        busy.start()
        time.sleep(0.2)
        refused = httpx.get(f"{sim.url}/flush_cache")
        assert (refused.status_code, refused.text) == (400, "Flush cache failed.\n")
        busy.join()
        full = httpx.get(f"{sim.url}/v1/loads").json()["loads"][0]
        assert {"memory", "disaggregation", "queues"} <= set(full)
        core = httpx.get(f"{sim.url}/v1/loads", params={"include": "core"}).json()["loads"][0]
        assert set(full) - set(core) == {"memory", "disaggregation", "queues"}
        assert httpx.get(f"{sim.url}/v1/loads", params={"include": "nope"}).status_code == 500  # SGLang's, unhandled
        info = httpx.get(f"{sim.url}/server_info").json()
        assert set(info["startup_time"]) >= {"load_weight", "tokenizer_e2e"}
        assert info["internal_states"][0]["max_running_requests"] == info["max_running_requests"]

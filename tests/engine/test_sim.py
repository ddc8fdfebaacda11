"""The simulator as a real process: determinism, SGLang shapes, flags, failure injection, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from genrm_sim.testing import free_port, run_sim, wait_ready

pytestmark = pytest.mark.timeout(30)

SAMPLED = {"text": "Is 2+2=4? Answer: yes", "sampling_params": {"temperature": 0.8, "max_new_tokens": 64}}
GREEDY = {"text": "Is 2+2=4? Answer: yes", "sampling_params": {"temperature": 0, "max_new_tokens": 64}}


def generate(url: str, body: dict[str, object]) -> str:
    response = httpx.post(f"{url}/generate", json=body, timeout=10)
    response.raise_for_status()
    text: str = response.json()["text"]
    return text


def test_same_seed_is_byte_identical_and_other_seeds_differ_when_sampling() -> None:
    with run_sim("--random-seed", "7") as a, run_sim("--random-seed", "7") as b, \
            run_sim("--random-seed", "8") as c, run_sim("--random-seed", "7", "--sim-perturb") as p:
        chat = {"model": "judge-sim", "messages": [{"role": "user", "content": "grade: 4"}], "seed": 3}
        for body in (SAMPLED, GREEDY):
            assert generate(a.url, body) == generate(b.url, body)
        assert httpx.post(f"{a.url}/v1/chat/completions", json=chat).json()["choices"] == \
            httpx.post(f"{b.url}/v1/chat/completions", json=chat).json()["choices"]
        assert generate(a.url, SAMPLED) != generate(c.url, SAMPLED)
        assert generate(a.url, GREEDY) == generate(c.url, GREEDY)
        assert generate(a.url, GREEDY) != generate(p.url, GREEDY)
        seeded = {**SAMPLED, "sampling_params": {**SAMPLED["sampling_params"], "sampling_seed": 5}}
        assert generate(a.url, seeded) != generate(a.url, SAMPLED)
        assert "Score:" in generate(a.url, GREEDY)


def test_output_length_streaming_and_sglang_shapes() -> None:
    with run_sim("--random-seed", "1", "--served-model-name", "judge") as sim:
        body = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3}}).json()
        assert body["meta_info"]["completion_tokens"] == 3
        assert body["meta_info"]["finish_reason"] == {"type": "length"}
        completion = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()
        assert completion["usage"]["completion_tokens"] == 2
        with httpx.stream("POST", f"{sim.url}/generate", json={"text": "x", "stream": True}) as stream:
            events = [line for line in stream.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["text"] == generate(sim.url, {"text": "x"})
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "stream": True,
                "stream_options": {"include_usage": True}}) as stream:
            chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line and line != "data: [DONE]"]
        assert chunks[-1]["usage"]["total_tokens"] > 0
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert httpx.get(f"{sim.url}/v1/models").json()["data"][0]["id"] == "judge"
        assert httpx.get(f"{sim.url}/get_model_info").json()["model_path"] == "judge-sim"
        for path in ("/get_server_info", "/server_info"):
            info = httpx.get(f"{sim.url}{path}").json()
            assert info["random_seed"] == 1
            assert info["enable_deterministic_inference"] is False
        assert httpx.get(f"{sim.url}/get_load").json() == [
            {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
        metrics = httpx.get(f"{sim.url}/metrics").text
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                     "sglang:gen_throughput", "sglang:time_to_first_token_seconds_bucket",
                     "sglang:e2e_request_latency_seconds_bucket"):
            assert name in metrics
        assert httpx.get(f"{sim.url}/health_generate").status_code == 200
        assert httpx.post(f"{sim.url}/generate", content=b"{nope").status_code == 400


def test_startup_queueing_and_abort() -> None:
    with run_sim("--sim-startup-seconds", "1.0", "--sim-ttft-ms", "400", "--sim-max-running", "1",
                 ready_path="/v1/models") as sim:
        assert httpx.get(f"{sim.url}/health").status_code == 503
        wait_ready(f"{sim.url}/health", seconds=5)
        results: list[dict[str, object]] = []
        threads = [threading.Thread(target=lambda rid=rid: results.append(httpx.post(
            f"{sim.url}/generate", json={"text": "x", "rid": rid}, timeout=10).json())) for rid in ("a", "b")]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        load = httpx.get(f"{sim.url}/get_load").json()[0]
        assert (load["num_reqs"], load["num_waiting_reqs"]) == (2, 1)
        httpx.post(f"{sim.url}/abort_request", json={"abort_all": True})
        for thread in threads:
            thread.join()
        reasons = {r["meta_info"]["finish_reason"]["type"] for r in results}  # type: ignore[index]
        assert "abort" in reasons


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


def test_unknown_sglang_flags_are_ignored_with_one_warning() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "genrm_sim", "--model-path", "m", "--port", str(port), "--mem-fraction-static",
         "0.8", "--attention-backend", "fa3", "--tp-size", "1", "--skip-server-warmup"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health")
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404  # no --enable-metrics
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    warnings = [line for line in stderr.splitlines() if "ignoring SGLang flags" in line]
    assert len(warnings) == 1 and "--attention-backend" in warnings[0]


def test_sigterm_turns_health_503_finishes_running_requests_then_exits() -> None:
    with run_sim("--sim-ttft-ms", "1000") as sim:
        result: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: result.append(
            httpx.post(f"{sim.url}/generate", json={"text": "x"}, timeout=10)))
        thread.start()
        time.sleep(0.3)
        sim.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert httpx.get(f"{sim.url}/health").status_code == 503
        assert sim.process.poll() is None
        thread.join()
        assert result[0].status_code == 200
        assert sim.process.wait(5) == 0

"""The real engine on this machine: SGLang 0.5.23 on CPU with a tiny local model, for the real-engine lane.

Why one module: the lane's cluster tests, the simulator's differential test, ``make dev ENGINE=sglang``
and the gateway benchmark all need the same three things, made once and cached outside the checkout:
the engine's environment (``hack/engine-env.sh``, 7 GB), the CPU stand-in for ``sgl_kernel``
(``hack/sglang_engine/sgl_kernel``, copied into that environment so it behaves as a CPU image of
SGLang would) and the tiny models (``hack/sglang_engine/tiny_model.py``). And the same flags: the
ones SGLang needs on a CPU without AMX, given the way a user of the operator would give them.

A failure to install is an error with SGLang's or pip's own words, never a skip: the lane exists to
prove things against the real engine.
"""

from __future__ import annotations

import fcntl
import filecmp
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from genrm_cluster import procutil

from genrm_testing import RunningSim, free_port, wait_ready

HERE = Path(__file__).resolve().parent.parent / "sglang_engine"
ENV_SCRIPT = HERE.parent / "engine-env.sh"
SHIM = HERE / "sgl_kernel"
MODEL_MAKER = HERE / "tiny_model.py"

IMAGE = "lmsysorg/sglang:v0.5.23"
"""The engine image the operator's pods name by default; the local cluster maps it to the environment."""

SERVED_NAME = "tiny-judge"
MODEL_SEEDS = {"tiny-judge": 0, "tiny-judge-other": 1}
"""Two models of one shape: the second has other weights (a verification must tell them apart)."""

SETTINGS_VARIANT = ("tiny-judge-eps", "tiny-judge", {"rms_norm_eps": 1.0})
"""The first model's weights under another setting of its config (a verification must tell it apart too;
the setting is one that changes greedy answers of this model: its RoPE base, for one, does not)."""

EXAMPLE = HERE.parents[1] / "examples" / "genrmpool-sglang-cpu.yaml"
"""The pool a user would write for SGLang on CPU; its engine env and flags are the ones used here too."""


def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded


CPU_ENV: dict[str, str] = {e["name"]: e["value"] for e in example()["spec"]["engine"]["env"]}
"""SGLang's switch to its CPU engine; the model is local, so no hub is ever asked."""

CPU_ARGS: tuple[str, ...] = tuple(example()["spec"]["engine"]["extraArgs"])
"""SGLang's flags for a CPU without AMX (its default attention backend needs AMX); ``--sleep-on-idle``
because an idle scheduler otherwise busy-polls a whole core of the machine's two."""

SIGTERM_GRACE_SECONDS = 20.0
"""SGLang's process group outlives a SIGTERM by 10-12 s here; past this it is killed."""


def cache_root() -> Path:
    return Path(os.environ.get("GENRM_CACHE", Path.home() / ".cache" / "genrm-operator"))


def environment() -> Path:
    """The engine's environment (installed on first use; minutes), with the stand-in in place."""
    done = subprocess.run([str(ENV_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the real engine's environment did not install ({ENV_SCRIPT} exit "
                           f"{done.returncode}; its log is above): the real-engine lane cannot run")
    env = Path(done.stdout.strip())
    _install_shim(env)
    return env


def _install_shim(env: Path) -> None:
    """Copy the stand-in into the environment's site-packages when it differs (so edits reach it)."""
    site = next(env.glob("lib/python3*/site-packages"))
    target = site / "sgl_kernel"
    source = SHIM / "__init__.py"
    if (target / "__init__.py").is_file() and filecmp.cmp(source, target / "__init__.py", shallow=False):
        return
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    shutil.copy2(source, target / "__init__.py")


def models(env: Path) -> Path:
    """The directory holding the tiny models (one sub-directory per name in ``MODEL_SEEDS``, and the
    settings variant), made once: keyed by the maker and the model list, each model written aside and
    renamed into place, under a lock (the lane and ``make dev`` may ask at once)."""
    recipe = MODEL_MAKER.read_bytes() + json.dumps([MODEL_SEEDS, SETTINGS_VARIANT]).encode()
    root = cache_root() / "engine" / f"models-{hashlib.sha1(recipe).hexdigest()[:10]}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, seed in MODEL_SEEDS.items():
            if not (root / name).is_dir():
                staging = _staging(root, name)
                subprocess.run([str(env / "bin" / "python"), str(MODEL_MAKER), str(staging), "--seed", str(seed)],
                               check=True, env=_clean_env(), stdout=subprocess.DEVNULL)
                staging.rename(root / name)
        variant, base, overrides = SETTINGS_VARIANT
        if not (root / variant).is_dir():
            staging = _staging(root, variant)
            shutil.copytree(root / base, staging)
            config = json.loads((staging / "config.json").read_text())
            (staging / "config.json").write_text(json.dumps({**config, **overrides}, indent=2))
            staging.rename(root / variant)
    return root


def _staging(root: Path, name: str) -> Path:
    """An empty place to write a model before it is renamed into ``root / name`` (a crash leaves no half model)."""
    staging = root / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _clean_env() -> dict[str, str]:
    """The caller's environment without the project's virtualenv on PATH (the engine has its own)."""
    return {**{k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}, **CPU_ENV}


@dataclass(frozen=True)
class RunningEngine(RunningSim):
    """A running real engine: the simulator's handle, and where its log goes."""

    log: Path


@contextmanager
def run_engine(log: Path, *args: str, model: str = "tiny-judge", ready_seconds: float = 180.0
               ) -> Iterator[RunningEngine]:
    """``python -m sglang.launch_server`` of ``model`` on a free loopback port, as its own process group,
    yielded once ``/health_generate`` answers; SIGTERM to its first process on exit, SIGKILL to what is left
    once that one exits or after ``SIGTERM_GRACE_SECONDS``."""
    env = environment()
    port = free_port()
    command = [str(env / "bin" / "python"), "-m", "sglang.launch_server",
               "--model-path", str(models(env) / model), "--served-model-name", SERVED_NAME,
               "--host", "127.0.0.1", "--port", str(port), "--random-seed", "0", "--enable-metrics",
               *CPU_ARGS, *args]
    proc = procutil.spawn(command, log, env=_clean_env())
    running = RunningEngine(proc, port, log)
    try:
        wait_ready(f"{running.url}/health_generate", seconds=ready_seconds)
        yield running
    finally:
        # As a container runtime stops it: signalling SGLang's workers too sends it down its crash path.
        procutil.stop_container(proc, SIGTERM_GRACE_SECONDS)

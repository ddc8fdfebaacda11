"""Static checks of the Dockerfile, which hold for every builder (test_built_images.py runs what buildah built).

What must hold so that the images run what CI tested: every install uses constraints.txt,
the four targets exist and run as non-root, their entry points are console scripts the
project declares, and .dockerignore lets every needed source into the build context.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = set(PYPROJECT["project"]["scripts"])
TARGETS = {"operator": "genrm-operator", "gateway": "genrm-gateway", "sim": "genrm-sim"}


@dataclass
class Stage:
    """One FROM block: its base and instructions (continuation lines joined)."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str | None:
        values = [arg for kw, arg in self.instructions if kw == keyword]
        return values[-1] if values else None


def parse_dockerfile(text: str) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, argument = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = argument.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"stage{len(stages)}"
            current = stages[name] = Stage(name, words[0])
        elif current is not None:
            current.instructions.append((keyword, argument.strip()))
    return stages


STAGES = parse_dockerfile(DOCKERFILE.read_text())


def effective(stage: Stage, keyword: str) -> str | None:
    """The instruction's value as the image inherits it through FROM <stage> chains."""
    while True:
        value = stage.last(keyword)
        if value is not None or stage.base not in STAGES:
            return value
        stage = STAGES[stage.base]


def exec_form(value: str | None) -> list[str]:
    assert value is not None and value.startswith("["), f"use the exec form, got {value!r}"
    words: list[str] = json.loads(value)
    return words


def test_the_four_targets_exist() -> None:
    assert {"operator", "gateway", "sim", "engine"} <= set(STAGES)


@pytest.mark.parametrize("target", ["operator", "gateway", "sim", "engine"])
def test_targets_run_as_a_fixed_non_root_user(target: str) -> None:
    user = effective(STAGES[target], "USER")
    assert user is not None
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric UID, so runAsNonRoot can verify it"
    assert uid == "10001", "the Helm chart's podSecurityContext.runAsUser"


@pytest.mark.parametrize("target, script", sorted(TARGETS.items()))
def test_entry_points_are_declared_console_scripts(target: str, script: str) -> None:
    entrypoint = exec_form(effective(STAGES[target], "ENTRYPOINT"))
    assert entrypoint == [script] and script in SCRIPTS


def test_gateway_default_command_is_what_the_operator_runs() -> None:
    assert exec_form(STAGES["gateway"].last("CMD")) == ["serve"]


def test_engine_image_is_sglang_with_the_gateway_installed() -> None:
    engine = STAGES["engine"]
    assert engine.base == "${SGLANG_IMAGE}"
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang:", DOCKERFILE.read_text(), re.M)
    runs = " ".join(arg for kw, arg in engine.instructions if kw == "RUN")
    assert "/usr/local/bin/genrm-gateway" in runs
    assert exec_form(engine.last("ENTRYPOINT")) == ["python3", "-m", "sglang.launch_server"]


def test_every_install_uses_the_ci_constraints() -> None:
    """pip install of the project anywhere in the file must pin with constraints.txt, as `make venv` does."""
    installs = [(stage.name, arg) for stage in STAGES.values() for kw, arg in stage.instructions
                if kw == "RUN" and "pip install" in arg]
    assert installs
    for name, run in installs:
        for command in run.split("&&"):
            if "pip install" in command:
                words = shlex.split(command)
                assert "-c" in words and words[words.index("-c") + 1].endswith("constraints.txt"), (name, command)
    copies = " ".join(arg for stage in STAGES.values() for kw, arg in stage.instructions if kw == "COPY")
    assert "constraints.txt" in copies


def test_build_copies_every_package_root() -> None:
    where = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
    copies = [arg for kw, arg in STAGES["build"].instructions if kw == "COPY"]
    for root in where:
        packages = [p.relative_to(REPO).as_posix() for p in (REPO / root).glob("genrm_*") if p.is_dir()]
        for package in packages:
            assert any(c.split()[0].rstrip("/") in (root, package) for c in copies), package


def test_no_image_copies_the_development_tools() -> None:
    """hack/ holds the local cluster, the benchmarks and the test helpers (genrm-tools): never shipped."""
    sources = [word for stage in STAGES.values() for kw, arg in stage.instructions if kw == "COPY"
               for word in shlex.split(arg)[:-1] if not word.startswith("--")]
    assert sources
    assert not [s for s in sources if s.rstrip("/").split("/")[0] == "hack"], sources


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: `**` spans directories, `*` and `?` stay within one."""
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    wildcards = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcards.get(part, re.escape(part)) for part in parts))


def dockerignored(path: str) -> bool:
    """Docker's rule: a pattern matches a path or one of its parent directories; the last match wins."""
    prefixes = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 2)]
    ignored = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        regex = _pattern_regex(pattern.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not pattern.startswith("!")
    return ignored


def test_dockerignore_keeps_the_sources_and_drops_the_rest() -> None:
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "operator/genrm_operator/__main__.py",
                   "gateway/genrm_gateway/cli.py", "contract/genrm_contract/drained.py", "engine/genrm_sim/cli.py"):
        assert not dockerignored(needed), needed
    for dropped in (".venv/bin/python", ".git/HEAD", "tests/chart/conftest.py", "charts/genrm-operator/Chart.yaml",
                    "hack/genrm_cluster/__init__.py", "bench/gateway.py", "hack/genrm_testing/__init__.py"):
        assert dockerignored(dropped), dropped

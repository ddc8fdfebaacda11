"""What the project's wheel (and so every image, which installs it) carries: the operator, the gateway,
its contract and the simulator, nothing of the development tools (hack/pyproject.toml's genrm-tools).

Read from the setuptools configuration `pip wheel .` uses, without building (offline and fast):
pyproject.toml's package discovery, and the console scripts, whose modules must ship.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FIND = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
SHIPPED = {"genrm_operator", "genrm_gateway", "genrm_contract", "genrm_sim"}


def wheel_packages() -> dict[str, Path]:
    """Every package of the wheel and its directory."""
    packages: dict[str, Path] = {}
    for where in FIND["where"]:
        found = find_packages(where=str(REPO / where), include=FIND.get("include", ["*"]),
                              exclude=FIND.get("exclude", ()))
        packages |= {name: REPO / where / name.replace(".", "/") for name in found}
    return packages


def test_the_wheel_holds_only_the_operator_the_gateway_and_the_simulator() -> None:
    packages = wheel_packages()
    assert {name.split(".")[0] for name in packages} == SHIPPED, sorted(packages)
    assert {"genrm_operator.api", "genrm_operator.core", "genrm_operator.shell",
            "genrm_operator.autoscaling"} <= set(packages)


def test_every_console_script_ships() -> None:
    packages = wheel_packages()
    for name, target in PYPROJECT["project"]["scripts"].items():
        package, _, module = target.split(":")[0].rpartition(".")
        assert package in packages, (name, target)
        assert (packages[package] / f"{module}.py").is_file(), (name, target)

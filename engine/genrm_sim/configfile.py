"""SGLang's ``--config <file>.yaml``: a YAML mapping of flags merged into the command line.

Why the simulator reads it exactly as SGLang 0.5.23 does (``prepare_server_args`` and
``utils/server_args_config_parser.py``): the operator hands an engine its API key through such a
file, so that the key is on no process's command line, and a file SGLang would refuse, or read
differently, must fail here too. The rules:

- only the separate token ``--config`` starts a merge (``--config=f.yaml`` is parsed as a flag
  and the file is never read); two of them, or one without a path after it, is a ``ValueError``;
- the path must end in ``.yaml`` or ``.yml`` and exist; the document must be a mapping (empty is
  ``{}``);
- each key becomes ``--<key>`` exactly as written (``api-key``; ``api_key`` becomes ``--api_key``,
  which the parser then refuses); a true boolean of a ``store_true`` flag becomes the bare flag, a
  false one nothing, any other boolean ``true``/``false``; a list its items (nothing when empty);
  a mapping its JSON; anything else ``str(value)``; a key of a flag that takes no single value
  (``--no-``/``--foo`` pairs) is refused;
- the file's flags go first and the rest of the command line after them, so the command line wins.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

FLAG = "--config"


def _keys(action: argparse.Action) -> set[str]:
    """The spellings a file may use for a flag, dashes as underscores (SGLang's ``_config_keys``)."""
    return {action.dest} | {option[2:].replace("-", "_") for option in action.option_strings
                            if option.startswith("--")}


class ConfigMerger:
    """Merges a ``--config`` file into a command line, against one parser's flags."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        actions = [a for a in parser._actions if a.option_strings]
        self._switches = {key for a in actions if isinstance(a, argparse._StoreTrueAction) for key in _keys(a)}
        supported = [a for a in actions
                     if isinstance(a, (argparse._StoreTrueAction, argparse._StoreAction)) or a.nargs is None]
        readable = {key for a in supported for key in _keys(a)}
        self._unsupported = {key: a for a in actions if a not in supported
                             and not {FLAG, "--help", "-h"} & set(a.option_strings)
                             for key in _keys(a) if key not in readable}

    def merge(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with the file's flags in front of it and ``--config <path>`` taken out."""
        at = [i for i, token in enumerate(argv) if token == FLAG]
        if not at:
            return list(argv)
        if len(at) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        index = at[0]
        if index == len(argv) - 1:
            raise ValueError("No config file specified after --config flag!")
        return [*self._flags(_read(argv[index + 1])), *argv[:index], *argv[index + 2:]]

    def _flags(self, config: dict[Any, Any]) -> list[str]:
        flags: list[str] = []
        for key, value in config.items():
            name = str(key).replace("-", "_")
            if name in self._unsupported:
                action = self._unsupported[name]
                raise ValueError(f"Unsupported config option '{name}' with action '{type(action).__name__}'")
            if isinstance(value, bool):
                if name not in self._switches:
                    flags += [f"--{key}", str(value).lower()]
                elif value:
                    flags.append(f"--{key}")
            elif isinstance(value, list):
                if value:
                    flags += [f"--{key}", *(str(item) for item in value)]
            elif isinstance(value, dict):
                flags += [f"--{key}", json.dumps(value)]
            else:
                flags += [f"--{key}", str(value)]
        return flags


def _read(path: str) -> dict[Any, Any]:
    file = Path(path)
    if file.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {file.suffix}")
    if not file.exists():
        raise ValueError(f"Config file not found: {path}")
    config = yaml.safe_load(file.read_text())
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    return config

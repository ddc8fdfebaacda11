"""``make sglang-contract``: SGLang's public contract, read from the pinned SGLang wheel's own source.

Why: every test of this project runs against ``genrm-sim``, so the simulator defines what "works"
means. A simulator written from memory drifts from SGLang (a renamed route, a removed flag, a
request key SGLang now rejects) and then every test passes while real pods crash-loop. This script
downloads the pinned SGLang wheel without its dependencies, parses the source with ``ast`` (no
import: SGLang needs torch and a GPU) and writes ``engine/genrm_sim/sglang_contract.json``:

- ``flags``: every ``sglang.launch_server`` flag with its spellings, arity, type and choices
  (``choices: null`` where SGLang computes them at run time);
- ``routes``: every HTTP route of the server with its methods, and whether it demands
  ``Content-Type: application/json``;
- ``metrics``: the Prometheus series of the metrics collectors, with their label names;
- ``sampling_params``: the keys ``/generate`` accepts in ``sampling_params`` (others are a 400);
- ``sampling_param_types``: for the keys the schema holds to one JSON scalar type, the check
  (``int``, ``number``, ``bool``, ``str``) and the ``expected`` text of its 400;
- the attention backends deterministic inference allows, and the health check's timeout.

The file is committed and lives inside the simulator's package because the simulator builds its
command line and strictness from it and the tests check the operator, the gateway and the examples
against it; ``make test`` therefore never needs the network. The generator lives in ``hack/``,
outside the shipped packages, because only a maintainer bumping SGLang runs it: change
``SGLANG_VERSION``, run ``make sglang-contract``, and the contract tests name every place
(engine image tag, examples, simulator) that must follow.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
"""The one SGLang version of the project: engine image tag, examples and simulator follow it."""

CONTRACT_PATH = Path(__file__).resolve().parent.parent / "engine" / "genrm_sim" / "sglang_contract.json"
SERVER_ARGS = "sglang/srt/server_args.py"
ARGPARSE_ACTIONS = "sglang/srt/arg_groups/argparse_actions.py"
CHOICES = "sglang/srt/arg_groups/choices.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
ROUTERS = {"v1_loads_router": "sglang/srt/entrypoints/v1_loads.py",
           "elastic_ep_router": "sglang/srt/entrypoints/elastic_ep.py"}
MOUNTS = "sglang/srt/utils/common.py"
"""Where ``--enable-metrics`` mounts Prometheus' ``/metrics`` app on the server."""
API_TYPES = "sglang/api/v1/api_types.py"
METRICS_DIR = "sglang/srt/observability/"
METRIC_TYPES = ("Counter", "Gauge", "Histogram", "Summary")
HTTP_METHODS = ("get", "post", "put", "delete", "patch", "head")


class Unresolved(Exception):
    """An expression whose value SGLang computes at run time."""


class Sources:
    """The wheel's Python files, parsed on demand."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self._wheel = wheel
        self._trees: dict[str, ast.Module] = {}

    def names(self) -> list[str]:
        return self._wheel.namelist()

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._wheel.read(path).decode(), filename=path)
        return self._trees[path]

    def module_path(self, module: str) -> str:
        """``a.b.c`` → ``a/b/c.py`` (or its package ``__init__``)."""
        base = module.replace(".", "/")
        return f"{base}.py" if f"{base}.py" in self._wheel.namelist() else f"{base}/__init__.py"

    def evaluate(self, path: str, node: ast.expr) -> Any:
        """The value of a constant expression, following module-level names and imports."""
        match node:
            case ast.Constant(value=value):
                return value
            case ast.List(elts=elts) | ast.Tuple(elts=elts) | ast.Set(elts=elts):
                return [self.evaluate(path, e) for e in elts]
            case ast.UnaryOp(op=ast.USub(), operand=operand):
                return -self.evaluate(path, operand)
            case ast.BinOp(left=left, op=ast.Add(), right=right):
                return self.evaluate(path, left) + self.evaluate(path, right)
            case ast.Call(func=ast.Name(id="set" | "frozenset" | "list" | "sorted" | "tuple"), args=[arg]):
                return sorted(self.evaluate(path, arg), key=str)
            case ast.Name(id=name):
                return self.evaluate_name(path, name)
        raise Unresolved(ast.unparse(node))

    def evaluate_name(self, path: str, name: str) -> Any:
        for stmt in self.tree(path).body:
            match stmt:
                case ast.Assign(targets=[ast.Name(id=target)], value=value) if target == name:
                    return self.evaluate(path, value)
                case ast.AnnAssign(target=ast.Name(id=target), value=value) if target == name and value:
                    return self.evaluate(path, value)
                case ast.ImportFrom(module=module, names=aliases) if module and module.startswith("sglang"):
                    for alias in aliases:
                        if (alias.asname or alias.name) == name:
                            return self.evaluate_name(self.module_path(module), alias.name)
        raise Unresolved(name)


@dataclass
class Flag:
    """One argparse option as ``sglang.launch_server`` registers it."""

    dest: str
    names: list[str]
    action: str = "store"
    """``store`` (takes ``nargs`` values), ``store_true``, or ``boolean_optional`` (``--x``/``--no-x``)."""
    nargs: str | None = None
    type: str | None = "str"
    """``int``/``float``/``str``; None where SGLang parses the value with its own function."""
    choices: list[Any] | None = None
    choices_dynamic: bool = False
    required: bool = False
    default: Any = None

    def as_json(self) -> dict[str, Any]:
        return dict(sorted(self.__dict__.items()))


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _unwrap_optional(node: ast.expr) -> ast.expr:
    match node:
        case ast.Subscript(value=ast.Name(id="Optional"), slice=inner):
            return inner
        case ast.BinOp(op=ast.BitOr(), left=left, right=ast.Constant(value=None)):
            return left
        case ast.Subscript(value=ast.Name(id="Union"), slice=ast.Tuple(elts=elts)):
            rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
            return rest[0] if len(rest) == 1 else node
    return node


def _type_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) and node.id in ("int", "float", "str") else "str"


class FlagReader:
    """Reproduces ``add_cli_args_from_dataclass`` and ``ServerArgs.add_cli_args`` on the AST."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def flags(self) -> list[Flag]:
        flags = [*self._dataclass_flags(), *self._explicit_flags()]
        seen: set[str] = set()
        for flag in flags:
            duplicate = seen.intersection(flag.names)
            if duplicate:
                raise SystemExit(f"flag {sorted(duplicate)} registered twice: the reader is out of date")
            seen.update(flag.names)
        return sorted(flags, key=lambda f: f.names[0])

    def _namespaces(self) -> Iterator[tuple[str, ast.ClassDef]]:
        """The classes of ``_INPUT_NAMESPACES``, each with the file that defines it."""
        tree = self.sources.tree(SERVER_ARGS)
        imports = {alias.asname or alias.name: stmt.module for stmt in tree.body
                   if isinstance(stmt, ast.ImportFrom) and stmt.module for alias in stmt.names}
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "_INPUT_NAMESPACES":
                assert isinstance(stmt.value, ast.List)
                for element in stmt.value.elts:
                    assert isinstance(element, ast.Name)
                    path = self.sources.module_path(imports[element.id])
                    yield path, next(node for node in self.sources.tree(path).body
                                     if isinstance(node, ast.ClassDef) and node.name == element.id)
                return
        raise SystemExit("_INPUT_NAMESPACES not found in server_args.py: the reader is out of date")

    def _dataclass_flags(self) -> Iterator[Flag]:
        for path, cls in self._namespaces():
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    flag = self._field_flag(path, stmt.target.id, stmt.annotation, stmt.value)
                    if flag is not None:
                        yield flag

    def _field_flag(self, path: str, name: str, annotation: ast.expr, value: ast.expr | None) -> Flag | None:
        if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
                and annotation.value.id in ("A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
            return None
        hint, *metadata = annotation.slice.elts
        arg: dict[str, ast.expr] | None = None
        for meta in metadata:
            if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                arg = {}
                break
            if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
                arg = _keywords(meta)
                break
        if arg is None or self._literal(path, arg.get("no_cli"), False):
            return None
        cli_name = self._literal(path, arg.get("cli_name"), None) or "--" + name.replace("_", "-")
        names = [cli_name, *(self._literal(path, arg.get("aliases"), None) or [])]
        flag = Flag(dest=name, names=names, default=self._literal(path, value, None))
        inner = _unwrap_optional(hint)
        if "action" in arg:
            extra = arg.get("action_kwargs")
            pairs = zip(extra.keys, extra.values, strict=True) if isinstance(extra, ast.Dict) else iter(())
            nargs = next((v for k, v in pairs if isinstance(k, ast.Constant) and k.value == "nargs"), None)
            self._custom_action(path, flag, arg["action"], nargs)
        elif isinstance(inner, ast.Subscript) and ast.unparse(inner.value) in ("Literal", "typing.Literal"):
            literal = self.sources.evaluate(path, inner.slice)
            literal = literal if isinstance(literal, list) else [literal]
            kind = type(literal[0]).__name__ if literal else "str"
            flag.type = kind if kind in ("int", "float") else "str"  # SGLang's _infer_type_func
            self._choices(path, flag, arg.get("choices"), literal)
        elif (isinstance(inner, ast.Subscript) and ast.unparse(inner.value) in ("List", "list")
              and "type_parser" not in arg):
            flag.nargs = self._literal(path, arg.get("nargs"), None) or "+"
            flag.type = _type_name(inner.slice)
            self._choices(path, flag, arg.get("choices"))
        elif isinstance(inner, ast.Name) and inner.id == "bool":
            flag.action, flag.type = "store_true", None
        else:
            flag.type = None if "type_parser" in arg else _type_name(inner)
            flag.nargs = self._literal(path, arg.get("nargs"), None)
            self._choices(path, flag, arg.get("choices"))
        required = self._literal(path, arg.get("required"), None)
        flag.required = flag.action == "store" and (required is True or (required is None and value is None))
        return flag

    def _custom_action(self, path: str, flag: Flag, action: ast.expr, nargs: ast.expr | None) -> None:
        """``nargs`` is the expression the registration passes, if any (else the action's default)."""
        spelled = ast.unparse(action)
        if spelled.endswith("BooleanOptionalAction"):
            flag.action, flag.type = "boolean_optional", None
        elif spelled.strip("'\"") == "store_true":
            flag.action, flag.type = "store_true", None
        else:
            arity = self.sources.evaluate(path, nargs) if nargs is not None else self._action_nargs(spelled)
            flag.action = "store_true" if arity == 0 else "store"
            flag.nargs = None if arity == 0 else arity
            flag.type = None

    def _action_nargs(self, class_name: str) -> Any:
        """The ``nargs`` default of one of SGLang's argparse actions (0 = a switch)."""
        for node in self.sources.tree(ARGPARSE_ACTIONS).body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        args = item.args
                        named = args.args[len(args.args) - len(args.defaults):]
                        for arg, default in zip(named, args.defaults, strict=True):
                            if arg.arg == "nargs":
                                return self.sources.evaluate(ARGPARSE_ACTIONS, default)
                        for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                            if arg.arg == "nargs" and kw_default is not None:
                                return self.sources.evaluate(ARGPARSE_ACTIONS, kw_default)
        return None

    def _choices(self, path: str, flag: Flag, node: ast.expr | None, fallback: list[Any] | None = None) -> None:
        if node is None:
            flag.choices = fallback
            return
        try:
            flag.choices = list(self.sources.evaluate(path, node))
        except Unresolved:
            flag.choices, flag.choices_dynamic = None, True

    def _literal(self, path: str, node: ast.expr | None, default: Any) -> Any:
        if node is None:
            return default
        try:
            return self.sources.evaluate(path, node) if not isinstance(node, ast.Dict) else {
                self.sources.evaluate(path, k): self.sources.evaluate(path, v)
                for k, v in zip(node.keys, node.values, strict=True) if k is not None}
        except Unresolved:
            return default

    def _explicit_flags(self) -> Iterator[Flag]:
        """``parser.add_argument`` calls in ``ServerArgs.add_cli_args``."""
        tree = self.sources.tree(SERVER_ARGS)
        method = next(node for node in ast.walk(tree)
                      if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args")
        for node in ast.walk(method):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            kw = _keywords(node)
            dest = self._literal(SERVER_ARGS, kw.get("dest"), None) or names[0].lstrip("-").replace("-", "_")
            flag = Flag(dest=dest, names=names, default=self._literal(SERVER_ARGS, kw.get("default"), None))
            if "action" in kw:
                self._custom_action(SERVER_ARGS, flag, kw["action"], kw.get("nargs"))
            else:
                flag.nargs = self._literal(SERVER_ARGS, kw.get("nargs"), None)
                flag.type = _type_name(kw["type"]) if "type" in kw else "str"
            self._choices(SERVER_ARGS, flag, kw.get("choices"))
            yield flag


def _route_path(node: ast.expr) -> tuple[str, str | None] | None:
    """A route's path, and the environment variable that can rename it."""
    match node:
        case ast.Constant(value=str(path)):
            return path, None
        case ast.Call(func=ast.Attribute(attr="get" | "getenv"),
                      args=[ast.Constant(value=str(env)), ast.Constant(value=str(path))]):
            return path, env
    return None


def _routes_in(tree: ast.Module, owner: str) -> Iterator[dict[str, Any]]:
    """Routes registered by decorators on ``owner`` (``app`` or a router)."""

    def visit(body: list[ast.stmt], conditional: bool) -> Iterator[dict[str, Any]]:
        for stmt in body:
            if isinstance(stmt, ast.If):
                yield from visit(stmt.body, True)
                yield from visit(stmt.orelse, True)
            elif isinstance(stmt, ast.AsyncFunctionDef | ast.FunctionDef):
                for decorator in stmt.decorator_list:
                    route = _route(decorator, owner)
                    if route is not None:
                        yield route | {"conditional": conditional, "handler": stmt.name}

    yield from visit(tree.body, False)


def _route(decorator: ast.expr, owner: str) -> dict[str, Any] | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and isinstance(decorator.func.value, ast.Name) and decorator.func.value.id == owner
            and decorator.args):
        return None
    verb = decorator.func.attr
    if verb not in (*HTTP_METHODS, "api_route", "websocket"):
        return None
    if isinstance(decorator.args[0], ast.Name):
        return None  # a path taken from an environment variable with no default: absent unless set
    located = _route_path(decorator.args[0])
    if located is None:
        raise SystemExit(f"unreadable route path {ast.unparse(decorator.args[0])}: the reader is out of date")
    path, env = located
    kw = _keywords(decorator)
    if verb == "api_route":
        methods = sorted(ast.literal_eval(kw["methods"])) if "methods" in kw else ["GET"]
    elif verb == "websocket":
        methods = ["WEBSOCKET"]
    else:
        methods = [verb.upper()]
    json_only = "validate_json_request" in ast.unparse(kw.get("dependencies", ast.Constant(None)))
    return {"path": path, "methods": methods, "json_only": json_only, "env": env}


def read_routes(sources: Sources) -> list[dict[str, Any]]:
    """Every route of the HTTP server: the app's own and those of the routers it includes."""
    included = {ast.unparse(node.args[0]) for node in ast.walk(sources.tree(HTTP_SERVER))
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "app.include_router"}
    if included != set(ROUTERS):
        raise SystemExit(f"http_server.py includes routers {sorted(included)}, expected {sorted(ROUTERS)}")
    routes = list(_routes_in(sources.tree(HTTP_SERVER), "app"))
    for path in ROUTERS.values():
        routes.extend(_routes_in(sources.tree(path), "router"))
    for node in ast.walk(sources.tree(MOUNTS)):
        if (isinstance(node, ast.Call) and ast.unparse(node.func) == "Mount" and node.args
                and isinstance(node.args[0], ast.Constant)):
            routes.append({"path": node.args[0].value, "methods": ["GET"], "json_only": False, "env": None,
                           "conditional": True, "handler": "mount"})
    merged: dict[str, dict[str, Any]] = {}
    for route in routes:
        known = merged.setdefault(route["path"], route | {"methods": [], "handler": route["handler"]})
        known["methods"] = sorted({*known["methods"], *route["methods"]})
        known["json_only"] = known["json_only"] or route["json_only"]
    return sorted(merged.values(), key=lambda r: r["path"])


@dataclass
class _Collector:
    name: str
    metrics: list[dict[str, Any]] = field(default_factory=list)


def _metric_labels(node: ast.expr | None) -> list[str] | None:
    """Label names beyond the collector's common ones (``[*labels.keys(), "x"]``), None if unreadable."""
    if node is None:
        return []
    text = ast.unparse(node)
    if text in ("labels.keys()", "list(labels.keys())", "self.labels.keys()"):
        return []
    extra: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            extra.append(sub.value)
    return extra if "labels.keys()" in text else None


def read_metrics(sources: Sources) -> list[dict[str, Any]]:
    """``sglang:`` series declared by the metrics collectors, with their label names.

    Each collector gets common labels from a ``labels = {...}`` literal (in its ``init_new`` or in
    a module function ``<prefix>_metric_labels`` for collector ``<Prefix>MetricsCollector``); label
    keys that SGLang adds only under a flag (priority, dp_rank, custom labels) are not listed.
    """
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(n for n in sources.names() if n.startswith(METRICS_DIR) and n.endswith(".py")):
        tree = sources.tree(path)
        common = _common_labels(tree)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in METRIC_TYPES):
                    continue
                kw = _keywords(node)
                name = kw.get("name", node.args[0] if node.args else None)
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)
                        and name.value.startswith("sglang:")):
                    continue
                extra = _metric_labels(kw.get("labelnames"))
                base = common.get(cls.name)
                labels = None if extra is None or base is None else sorted({*base, *extra})
                found[name.value] = {"name": name.value, "type": node.func.id.lower(),
                                     "collector": cls.name, "labels": labels}
    return sorted(found.values(), key=lambda m: m["name"])


def _common_labels(tree: ast.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}

    def keys_of(scope: ast.AST) -> list[str] | None:
        for node in ast.walk(scope):
            if (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "labels"
                    and isinstance(node.value, ast.Dict)):
                keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                if "model_name" in keys:
                    return sorted(keys)
        return None

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "init_new" and keys_of(item):
                    out[node.name] = keys_of(item) or []
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("_metric_labels"):
            keys = keys_of(node)
            if keys:
                prefix = "".join(part.title() for part in node.name.removesuffix("_metric_labels").split("_"))
                out[f"{prefix}MetricsCollector"] = keys
    return out


def read_sampling_params(sources: Sources) -> list[str]:
    """The keys of ``sampling_params`` that ``/generate`` accepts (SGLang rejects unknown keys)."""
    cls = next(n for n in sources.tree(API_TYPES).body if isinstance(n, ast.ClassDef) and n.name == "SamplingParams")
    doc = ast.get_docstring(cls) or ""
    if "unknown keys rejected" not in doc:
        raise SystemExit("api_types.SamplingParams no longer says it rejects unknown keys: review the simulator")
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


_SCALAR_CHECKS = {"_expect_int": "int", "_expect_float": "number", "_expect_bool": "bool", "_expect_str": "str"}


def read_sampling_param_types(sources: Sources) -> dict[str, dict[str, str]]:
    """The scalar type the schema holds each ``sampling_params`` key to (``decode_SamplingParams``:
    ``if key == "k": kw["k"] = <default> if x is None else _expect_<type>(x, expected="...")``);
    keys decoded as lists, maps or structs are left out."""
    decode = next(n for n in sources.tree(API_TYPES).body
                  if isinstance(n, ast.FunctionDef) and n.name == "decode_SamplingParams")
    out: dict[str, dict[str, str]] = {}
    for node in ast.walk(decode):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.comparators[0], ast.Constant)):
            continue
        key = node.test.comparators[0].value
        value = node.body[0].value if isinstance(node.body[0], ast.Assign) else None
        check = value.orelse if isinstance(value, ast.IfExp) else None
        if (isinstance(key, str) and isinstance(check, ast.Call) and isinstance(check.func, ast.Name)
                and check.func.id in _SCALAR_CHECKS):
            expected = next(k.value for k in check.keywords if k.arg == "expected")
            assert isinstance(expected, ast.Constant) and isinstance(expected.value, str)
            out[key] = {"type": _SCALAR_CHECKS[check.func.id], "expected": expected.value}
    if "max_new_tokens" not in out:
        raise SystemExit("decode_SamplingParams no longer checks max_new_tokens' type: review the simulator")
    return out


def read_health_timeout(sources: Sources) -> int:
    """``HEALTH_CHECK_TIMEOUT``: how long ``/health`` waits for its one-token generation."""
    for stmt in sources.tree(HTTP_SERVER).body:
        if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "HEALTH_CHECK_TIMEOUT":
            getenv = next(n for n in ast.walk(stmt.value) if isinstance(n, ast.Call) and n.args
                          and ast.unparse(n.func) == "os.getenv")
            value = sources.evaluate(HTTP_SERVER, getenv.args[1])
            assert isinstance(value, int)
            return value
    raise SystemExit("HEALTH_CHECK_TIMEOUT not found in http_server.py")


def build_contract(wheel_path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel_path) as wheel:
        sources = Sources(wheel)
        return {
            "comment": "Generated by `make sglang-contract` (hack/sglang_contract.py) from SGLang's own source. "
                       "Do not edit.",
            "sglang": {
                "version": SGLANG_VERSION,
                "wheel": wheel_path.name,
                "sha256": hashlib.sha256(wheel_path.read_bytes()).hexdigest(),
            },
            "flags": [flag.as_json() for flag in FlagReader(sources).flags()],
            "deterministic_attention_backends": sources.evaluate_name(
                CHOICES, "DETERMINISTIC_ATTENTION_BACKEND_CHOICES"),
            "radix_deterministic_attention_backends": sources.evaluate_name(
                CHOICES, "RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND"),
            "routes": read_routes(sources),
            "metrics": read_metrics(sources),
            "sampling_params": read_sampling_params(sources),
            "sampling_param_types": read_sampling_param_types(sources),
            "health_check_timeout_seconds": read_health_timeout(sources),
        }


def download(version: str, into: Path) -> Path:
    """The SGLang wheel of ``version``, without dependencies (nothing is installed or imported)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--dest", str(into), f"sglang=={version}"], check=True)
    wheels = sorted(into.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"no sglang {version} wheel was downloaded")
    return wheels[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="read this wheel instead of downloading the pinned one")
    parser.add_argument("--output", type=Path, default=CONTRACT_PATH)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or download(SGLANG_VERSION, Path(tmp))
        contract = build_contract(wheel)
    args.output.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
    print(f"sglang-contract: {len(contract['flags'])} flags, {len(contract['routes'])} routes, "
          f"{len(contract['metrics'])} metrics from {wheel.name} -> {args.output}")


if __name__ == "__main__":
    main()

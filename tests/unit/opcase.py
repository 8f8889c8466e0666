"""Per-operation cases in pyinfra's own style (its ``tests/operations/*/*.json`` and
``tests/test_operations.py``): for each of this project's ``@operation`` functions, a folder
``tests/unit/operations/MODULE.OPERATION/`` of JSON cases, each the operation's arguments and
the facts it reads in, the commands it yields (or its noop text, or the error it raises) out.
``test_operation_cases.py`` runs them; ``operations/README.md`` says how to add one.

As in pyinfra's runner, the operation's generator (``op._inner``) is run in a real pyinfra
State and Host (no connection: a connection attempt fails the case) and ``get_fact`` is
answered from the case: ``facts`` maps a fact (pyinfra's as its tests name them,
``files.File``; this project's by class name) to its arguments (``path=/x``, as pyinfra's
``get_kwargs_str`` writes them) and the processed value (this project's typed facts in their
wire form: ``_fact_value``). A fact read that the case does not
give fails the case, naming it. ``host_state`` is the run's host-state read (the read's
arguments and its JSON state, as ``hoststate.py`` prints it), read before the operation as the
stages read it (``facts.read_host_state``), so an operation that compares with it finds it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pyinfra.api.host as pyinfra_host
import runobj
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import (
    FileDownloadCommand,
    FileUploadCommand,
    FunctionCommand,
    StringCommand,
)
from pyinfra.api.util import get_kwargs_str
from pyinfra.context import ctx_host, ctx_state

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sglang_deploy"
CASES = Path(__file__).resolve().parent / "operations"
#: the package's layer folders, left out of an operation's short name (``operations.x``)
LAYERS = ("integration", "hostops", "stages", "controller")
#: set to 1 to write each case's ``commands`` / ``noop_description`` from what it yields now
UPDATE_ENV = "UPDATE_OPERATION_CASES"


@functools.cache
def operations() -> dict[str, str]:
    """Every ``@operation`` function of the package: ``MODULE.NAME`` (MODULE relative to
    its layer folder, or to ``sglang_deploy``) -> its module's import path."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        short = module.removeprefix("sglang_deploy.")
        short = short.split(".", 1)[1] if short.split(".")[0] in LAYERS else short
        short = short.removeprefix("group.")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", None) == "operation"
                    for d in node.decorator_list):
                out[f"{short}.{node.name}"] = module
    return out


def case_files() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


# ------------------------------------------------------------------ inputs
def parse_value(value: Any) -> Any:
    """A case's JSON value as the operation gets it: ``{"$stringio": TEXT}`` a file-like
    object, ``{"$set": [...]}`` / ``{"$tuple": [...]}``, ``{"$new": "module:Class",
    "kwargs": {...}}`` an object of the package (``sglang_deploy.core.service:Layout``),
    ``{"$repo": PATH}`` the absolute path of a file of this repository."""
    if isinstance(value, list):
        return [parse_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$stringio" in value:
        return io.StringIO(value["$stringio"])
    if "$set" in value:
        return set(parse_value(value["$set"]))
    if "$tuple" in value:
        return tuple(parse_value(value["$tuple"]))
    if "$repo" in value:  # a file of this repository, by its path in it
        return str(REPO / value["$repo"])
    if "$new" in value:
        module, name = value["$new"].split(":")
        return getattr(importlib.import_module(module), name)(**parse_value(value["kwargs"]))
    return {k: parse_value(v) for k, v in value.items()}


def fact_key(cls) -> str:
    if cls.__module__.startswith("pyinfra."):
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"
    return cls.__name__


def _fact_value(key: str, value: Any) -> Any:
    """A fact's processed value from its JSON form in a case: this project's typed facts from
    their wire form (``SglangHostState``: the JSON ``hoststate.py`` prints; ``ServiceStatus``:
    ``systemctl show``'s properties; ``PathStatus``: one entry of its ``paths``)."""
    from sglang_deploy.core.hoststate import HostState, PathState, ServiceState

    if key in ("SglangHostState", "HostState") and isinstance(value, dict):
        return HostState.from_json(value)
    if key == "ServiceStatus":
        return ServiceState.from_json(value)
    if key == "PathStatus":
        return PathState.from_json(value)
    return parse_value(value)


# ------------------------------------------------------------------ outputs
#: what differs from run to run by design: a time stamp the controller writes
PER_RUN = ((re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?"), "<now>"),)


def _per_run(text: str) -> str:
    for pattern, replacement in PER_RUN:
        text = pattern.sub(replacement, text)
    return text


def _name(function) -> str:
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return getattr(function, "__qualname__", repr(function))


def _argument(value: Any) -> Any:
    """A FunctionCommand's argument as JSON: itself, a dataclass's fields, a function's name."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"$dataclass": type(value).__name__, **json.loads(json.dumps(
            dataclasses.asdict(value), default=str))}
    if callable(value):
        return f"python: {_name(value)}"
    try:
        return json.loads(json.dumps(value))
    except TypeError:
        return f"<{type(value).__name__}>"


def describe(command, cwd: Path | None = None) -> Any:
    """A command as pyinfra's operation tests write it: shell text (``[raw, masked]`` when a
    part is masked), ``["upload", CONTENT or SRC, DEST]``, ``["function", NAME]``."""
    if isinstance(command, str):
        command = StringCommand(command.strip())
    if isinstance(command, StringCommand):
        raw, masked = _per_run(command.get_raw_value()), _per_run(command.get_masked_value())
        return raw if raw == masked else [raw, masked]
    if isinstance(command, FileUploadCommand):
        src = command.src
        data = src.getvalue() if hasattr(src, "getvalue") else str(src)
        data = data.decode() if isinstance(data, bytes) else data
        if not hasattr(src, "getvalue"):  # a local file: by its path in the repository/case
            path = Path(src).resolve()
            base = next((b for b in (cwd, REPO) if b and path.is_relative_to(b.resolve())), None)
            data = str(path.relative_to(base.resolve())) if base else data
        return ["upload", data, str(command.dest)]
    if isinstance(command, FileDownloadCommand):
        return ["download", str(command.src), str(command.dest)]
    if isinstance(command, FunctionCommand):
        return ["function", _name(command.function), [_argument(a) for a in command.args]]
    raise AssertionError(f"{command!r} is not a command")


def _error(exc: BaseException) -> dict:
    return {"name": type(exc).__name__, "message": str(exc)}


# ------------------------------------------------------------------ running a case
def run_case(name: str, case: dict, cwd: Path, monkeypatch) -> dict:
    """Run operation NAME (``MODULE.OP``) with CASE's arguments and facts; returns what it
    did: ``commands``, ``noop_description`` (None: none), ``facts`` read, ``exception``."""
    module = importlib.import_module(operations()[name])
    op = getattr(module, name.rsplit(".", 1)[1])
    facts = case.get("facts") or {}
    read: list[str] = []
    noops: list[str] = []
    reading_state: list[Any] = []

    def get_fact(state, host, cls, args=None, kwargs=None, **_):
        key, where = fact_key(cls), get_kwargs_str(dict(kwargs or {}))
        if reading_state:
            return reading_state[0]
        read.append(f"{key}({where})")
        if key not in facts or where not in facts[key]:
            raise KeyError(f"the operation read {key}({where}), which the case does not give "
                           f"(add facts.{key}.{where!r})")
        return _fact_value(key, facts[key][where])

    def never(self, *a, **k):
        raise AssertionError("an operation case never connects")

    monkeypatch.setattr(pyinfra_host, "get_fact", get_fact)
    monkeypatch.setattr(pyinfra_host.Host, "noop", lambda self, text: noops.append(text))
    monkeypatch.setattr(pyinfra_host.Host, "connect", never)
    inventory = Inventory((["somehost"], {}))
    state = State(inventory, Config(TEMP_DIR="/tmp"))  # pyinfra's temp folder: no TmpDir
    state.cwd = str(cwd)
    runobj.start(state, cwd=cwd)  # the run object: the run's reads, its outcome recorder
    host = inventory.get_host("somehost")
    for rel, text in (case.get("local_files") or {}).items():  # files on the controller
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(text)
    out: dict[str, Any] = {}
    with ctx_state.use(state), ctx_host.use(host):
        if case.get("host_state"):  # the run's host-state read, made before the operation
            from sglang_deploy.hostops import facts as factsmod
            spec = case["host_state"]
            reading_state.append(_fact_value("HostState", spec["state"]))
            factsmod.read_host_state(host, getattr(factsmod, spec.get("fact", "SglangHostState")),
                                     **spec.get("kwargs", {}))
            reading_state.clear()
        try:
            commands = list(op._inner(*parse_value(case.get("args", [])),
                                      **parse_value(case.get("kwargs", {}))))
            out["commands"] = [describe(c, cwd) for c in commands]
        except Exception as exc:  # noqa: BLE001 - the error a case expects is its outcome
            out["exception"] = _error(exc)
    out["noop_description"] = noops[0] if noops else None
    out["facts"] = read
    return out


# ------------------------------------------------------------------ cases on disk
def load(path: Path) -> dict:
    return json.loads(path.read_text())


def dump(case: dict) -> str:
    return json.dumps(case, indent=4, ensure_ascii=False) + "\n"


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def expected_of(case: dict) -> dict:
    """What CASE says the operation does (the keys ``run_case`` returns)."""
    out: dict[str, Any] = {}
    if "exception" in case:
        out["exception"] = case["exception"]
    else:
        out["commands"] = case.get("commands", [])
    out["noop_description"] = case.get("noop_description")
    out["facts"] = case.get("facts_read", [])
    return out


def matches(got: dict, want: dict) -> bool:
    """GOT is WANT; an expected exception's message is a regular expression (full match)."""
    if "exception" in want or "exception" in got:
        w, g = want.get("exception"), got.get("exception")
        if not (w and g and w["name"] == g["name"] and re.fullmatch(w["message"], g["message"],
                                                                      re.DOTALL)):
            return False
        return {k: v for k, v in got.items() if k != "exception"} == \
            {k: v for k, v in want.items() if k != "exception"}
    return got == want

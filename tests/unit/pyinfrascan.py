"""Every use of pyinfra in the package, found by reading its source (``ast``), for the list of
pyinfra internals the package touches (``pyinfra_internals.py``, pinned by
``test_integration.py``).

A use is a key:

- what the package imports from pyinfra or ``pyinfra_cli``, and the attributes it reads
  through those names: their dotted path (``pyinfra.api.util.print_host_combined_output``,
  ``pyinfra.operations.files.link._inner``);
- a member of one of pyinfra's classes (``MEMBER_CLASSES``) read, written, or named to
  ``getattr``/``hasattr``/``setattr``: ``Class.member`` (``State.ops``, ``Host.connector``).
  A member is found on an object named ``host``/``state``/``config`` (a variable, a
  parameter, or an attribute: ``run.state``, ``h.state``), where it is a member of Host, State
  or Config; or on any object, by a member name only pyinfra's classes define (one the
  package does not define itself, ``_commands``, ``op_hash_order``, ``operation_meta``);
- an attribute of the package's own put on a pyinfra State or Host (``setattr(state, NAME,
  ...)`` with NAME a module constant): ``own attribute NAME``.

The scan is deliberately wide (a name shared by one of our objects and pyinfra's classes
reads as pyinfra's): the list says which of its keys are public API and which internals.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def package_files() -> list[Path]:
    """The package's Python files and the deploy/config files beside it (what pyinfra loads)."""
    return sorted([*(REPO / "sglang_deploy").rglob("*.py"), *REPO.glob("*.py")])


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _classes() -> dict[str, type]:
    from pyinfra.api.config import Config
    from pyinfra.api.host import Host, HostData
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.operation import OperationMeta
    from pyinfra.api.state import State, StateOperationHostData, StateOperationMeta
    from pyinfra.connectors.ssh import SSHConnector
    from pyinfra.connectors.util import CommandOutput

    return {c.__name__: c for c in (Host, State, Config, Inventory, HostData, CommandOutput,
                                    OperationMeta, StateOperationMeta, StateOperationHostData,
                                    SSHConnector)}


#: receiver name -> the class whose members it has
RECEIVERS = {"host": "Host", "state": "State", "config": "Config", "inventory": "Inventory",
             "connector": "SSHConnector"}
#: the classes whose members are looked for
MEMBER_CLASSES = tuple(_classes())


@functools.cache
def members(cls_name: str) -> frozenset[str]:
    """CLS_NAME's members: its attributes, annotations, and what its methods set on self."""
    cls = _classes()[cls_name]
    names = set(dir(cls))
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(n for n in names if not re.fullmatch(r"__\w+__", n))


@functools.cache
def own_names() -> frozenset[str]:
    """Attribute and method names the package defines itself (on its own objects)."""
    out: set[str] = set()
    for path in package_files():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        out.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        out |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                out.add(node.attr)
    return frozenset(out)


#: member names too common to mean pyinfra's class on an object of any name
COMMON = frozenset({"name", "data", "get", "args", "kwargs", "items", "keys", "values",
                    "update", "copy", "dict", "state", "host", "config", "inventory",
                    "groups", "connected", "path", "run", "init", "client", "connect",
                    "stdout", "stderr"})


@functools.cache
def distinctive() -> dict[str, str]:
    """Member name -> its class, for the names only pyinfra's classes define."""
    out: dict[str, str] = {}
    for cls_name in MEMBER_CLASSES:
        for name in members(cls_name):
            if name not in COMMON and name not in own_names():
                out.setdefault(name, cls_name)
    return out


def _constants(tree: ast.Module) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


@functools.cache
def package_constants() -> dict[str, str]:
    """The package's module-level string constants by name (for ``routing.FLEET_ATTR``)."""
    out: dict[str, str] = {}
    for path in package_files():
        out.update(_constants(_tree(path)))
    return out


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the pyinfra path it was imported as (anywhere in the module)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "pyinfra", "pyinfra_cli"):
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("pyinfra", "pyinfra_cli"):
                    out[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(
                        ".")[0]
    return out


def _own_modules(tree: ast.Module) -> set[str]:
    """Local names of the package's own modules (``from sglang_deploy.hostops import facts``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang_deploy"):
            out |= {a.asname or a.name for a in node.names}
    return out


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _receiver(node: ast.expr) -> str | None:
    """The last name of an object expression: ``host``, ``run.state`` -> ``state``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _member(receiver: ast.expr, attr: str) -> str | None:
    cls = RECEIVERS.get(_receiver(receiver) or "")
    if cls is not None and attr in members(cls):
        return f"{cls}.{attr}"
    if attr in distinctive():
        return f"{distinctive()[attr]}.{attr}"
    return None


_ATTR_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def uses_in(tree: ast.Module) -> Iterator[str]:
    """Every use of pyinfra in one module (the keys of the module docstring)."""
    aliases, constants, own = _aliases(tree), _constants(tree), _own_modules(tree)
    proxies = {n for n, path in aliases.items() if path in (
        "pyinfra.host", "pyinfra.state", "pyinfra.config")}
    yield from (p for n, p in aliases.items() if n not in proxies)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in aliases and chain[0] not in proxies:
                yield ".".join([aliases[chain[0]], *chain[1:]])
            elif chain and chain[0] in own:
                continue  # one of our modules' names (``pyinfrafast.global_arguments``)
            elif (key := _member(node.value, node.attr)) is not None:
                yield key
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"pyinfra(_cli)?(\.\w+)+", node.value):
            yield node.value  # a pyinfra object named by its path (the speed-ups' places)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _ATTR_CALLS and len(node.args) >= 2:
            target, name = node.args[0], node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if (key := _member(target, name.value)) is not None:
                    yield key
            elif isinstance(name, ast.Name) and name.id in constants \
                    and _receiver(target) in RECEIVERS:
                yield f"own attribute {constants[name.id]}"
            elif isinstance(name, ast.Attribute) and _receiver(target) in RECEIVERS:
                yield f"own attribute {package_constants().get(name.attr, name.attr)}"


@functools.cache
def scan() -> dict[str, tuple[str, ...]]:
    """Every key -> the files (relative to the repository) that use it."""
    found: dict[str, set[str]] = {}
    for path in package_files():
        for key in uses_in(_tree(path)):
            found.setdefault(key, set()).add(str(path.relative_to(REPO)))
    return {k: tuple(sorted(v)) for k, v in sorted(found.items())}

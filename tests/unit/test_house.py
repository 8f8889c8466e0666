"""The house rules a newcomer may rely on (issue 33): core imports no pyinfra and reads no
environment, docs/design.md's map of the code names only paths that exist, and the package
keeps no module-level mutable state but the documented caches below, and
no function over 60 lines nor module over 500 (split by concern).

The imports and the state are read from the source (``ast``), function-level code included;
core's freedom from pyinfra is also checked by importing every core module in a fresh
interpreter."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import sglang_deploy

PACKAGE = Path(sglang_deploy.__file__).resolve().parent
REPO = PACKAGE.parent
CORE = PACKAGE / "core"
DESIGN = REPO / "docs" / "design.md"

#: what core must never import: pyinfra and what it runs on, and the layers above core
NOT_IN_CORE = ("pyinfra", "pyinfra_cli", "gevent", "paramiko", "fabric", "sglang_deploy.integration",
               "sglang_deploy.hostops", "sglang_deploy.stages", "sglang_deploy.controller",
               "sglang_deploy.lxchost", "sglang_deploy.commands")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module PATH imports, anywhere in it (relative imports made absolute)."""
    name, out = module_name(path), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[:len(name.split(".")) - node.level
                                             + (path.name == "__init__.py")]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def test_core_imports_no_pyinfra_nor_a_layer_above_it():
    found = {f"{module_name(p)} imports {m}" for p in sorted(CORE.rglob("*.py"))
             for m in imported(p) if m.startswith(NOT_IN_CORE)
             and (m in NOT_IN_CORE or m.startswith(tuple(n + "." for n in NOT_IN_CORE)))}
    assert not found, "\n".join(sorted(found))


def test_importing_all_of_core_loads_no_pyinfra():
    names = sorted(module_name(p) for p in CORE.rglob("*.py"))
    code = ("import importlib, sys\n"
            f"for n in {names!r}: importlib.import_module(n)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyinfra', 'pyinfra_cli', 'gevent', 'paramiko', 'fabric')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]", out


def test_core_errors_are_plain_exceptions():
    from sglang_deploy.core import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert all(base.__module__ in ("builtins", errors.__name__) for base in cls.__mro__), name


def test_core_reads_no_environment():
    found = []
    for p in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "os" and node.attr in ("environ", "getenv", "putenv")):
                found.append(f"{module_name(p)}:{node.lineno} os.{node.attr}")
    assert not found, found


# --- docs/design.md's map of the code ---------------------------------------------------------

def layout_section() -> str:
    text = DESIGN.read_text()
    return text[text.index("\n## Layout\n"):text.index("\n## Multi-node groups")]


def fenced_blocks(section: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)


def exists(path: Path) -> bool:
    return path.exists() or path.with_name(path.name + ".py").exists()


def diagram_paths(block: str) -> list[str]:
    """The package paths the diagram names (`stages/stages.py`, `core/flags/`, `core/patch`),
    placeholders (`<command>`) and globs (`*.py`) aside, and the deploy files at its left."""
    names = [m.rstrip(".,:;)") for m in re.findall(r"\b(?:core|integration|hostops|stages|controller|lxchost|commands|remote)/[\w/.]*", block)]
    missing = [n for n in names if not exists(PACKAGE / n)]
    files = re.findall(r"^(\w+\.py)\b", block, re.MULTILINE)
    return missing + [f for f in files if not (REPO / f).is_file()]


#: files the map names that are not this repository's
FOREIGN = {"server_args.py"}  # sglang's


def repo_py_names() -> set[str]:
    """The names of the repository's .py files, its hidden folders (.venv, .git, a testbed's
    state with its containers' root file systems, changing while a testbed runs) left out."""
    found = set()
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        found.update(f for f in files if f.endswith(".py"))
    return found


def tree_paths(block: str) -> list[str]:
    """The names in the tree's first column, each under the folder its indentation puts it
    in; and every `name.py` of the right-hand column, somewhere in the repository."""
    missing, folders = [], {}  # indentation -> the folder open at it
    everywhere = repo_py_names()
    for line in block.splitlines():
        column, rest = line[:26], line[26:]
        if column.strip():
            indent = len(column) - len(column.lstrip())
            parent = folders.get(indent - 2, REPO) if indent else REPO
            for name in (n.strip() for n in column.strip().split(",")):
                if name and not exists(parent / name):
                    missing.append(str((parent / name).relative_to(REPO)))
                if name.endswith("/"):
                    folders[indent] = parent / name
        missing += [n for n in re.findall(r"\b(\w+\.py)\b", rest)
                    if n not in everywhere and n not in FOREIGN]
    return missing


def glance_paths(section: str) -> list[str]:
    text = section[section.index("### The repository at a glance"):]
    names = re.findall(r"^    (\S+)", text, re.MULTILINE)
    return [n for n in names if not exists(REPO / n)]


def test_design_map_names_only_paths_that_exist():
    section = layout_section()
    diagram, tree = fenced_blocks(section)
    missing = diagram_paths(diagram) + tree_paths(tree) + glance_paths(section)
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_the_map_check_sees_a_stale_name():
    assert diagram_paths("deploy.py --> stages/benchhost.py, stages/stages.py") == \
        ["stages/benchhost.py"]
    assert diagram_paths("nodeploy.py --> core/patch, unit") == ["nodeploy.py"]
    tree = "\n".join(f"{name:<26}{text}" for name, text in [
        ("sglang_deploy/", ""), ("  core/", "pure"), ("    data.py, bench.py", "the keys"),
        ("  stages/", "benchhost.py, stages.py and sglang's server_args.py")])
    assert tree_paths(tree) == ["sglang_deploy/core/bench.py", "benchhost.py"]


# --- module-level mutable state -------------------------------------------------------------

#: The module-level state the package keeps (module, name): caches only, each of something
#: that never changes within a process (and said to be a cache where it is defined). Per-run
#: state goes in the run object on its pyinfra State (``integration.ThisRun``), an explicit
#: parameter or the command's environment (``runner.VERBOSITY_ENV``), never into a module.
CACHES = {
    ("sglang_deploy.controller.flagcache", "_MEMORY"):
        "parsed server_args.py specs by sha256: a release's file never changes",
    ("sglang_deploy.core.lockfile", "_parsed"): "a lock's parse, by its text (lru_cache)",
    ("sglang_deploy.core.unit", "_compiled"): "the unit template compiled once (lru_cache)",
    ("sglang_deploy.controller.lockedflags", "_locked_flags_once"):
        "the locked wheel's flags, by the lock file's path and mtime (lru_cache)",
    ("sglang_deploy.stages.p2pview", "colour_terminal"): "whether stdout is a colour terminal",
    ("sglang_deploy.integration.pyinfrafast", "_global_argument_table"):
        "pyinfra's global argument table, built once (functools.cache)",
}
DOCUMENTED = CACHES

_MUTATORS = {"append", "add", "update", "setdefault", "pop", "clear", "extend", "insert",
             "remove", "discard", "popitem", "appendleft"}


def _top_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _package_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> module of the package, for `from sglang_deploy.x import mod` imports."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang_deploy"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if (REPO / Path(*full.split("."))).with_suffix(".py").is_file():
                    out[alias.asname or alias.name] = full
    return out


def state_written(path: Path, name: str | None = None) -> set[tuple[str, str]]:
    """(module, name) of the module-level state PATH's functions write: `global` names,
    items or mutating calls of its module-level names, attributes of the package's modules,
    and its functools caches."""
    tree, name = ast.parse(path.read_text(), str(path)), name or module_name(path)
    top, aliases, found = _top_names(tree), _package_aliases(tree), set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        if any(re.search(r"\b(lru_)?cache\b", ast.unparse(d)) for d in fn.decorator_list):
            found.add((name, fn.name))
        for n in ast.walk(fn):
            if isinstance(n, ast.Global):
                found.update((name, g) for g in n.names)
            elif (isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del))
                  and isinstance(n.value, ast.Name) and n.value.id in top):
                found.add((name, n.value.id))
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr in _MUTATORS and isinstance(n.func.value, ast.Name)
                  and n.func.value.id in top):
                found.add((name, n.func.value.id))
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and isinstance(n.value, ast.Name) and n.value.id in aliases):
                found.add((aliases[n.value.id], n.attr))
    return found


def test_no_module_level_state_but_the_documented():
    found = set().union(*(state_written(p) for p in sorted(PACKAGE.rglob("*.py"))))
    undocumented = sorted(found - set(DOCUMENTED))
    assert not undocumented, f"module-level state not in DOCUMENTED (say why): {undocumented}"


def test_every_documented_cache_is_still_one():
    found = set().union(*(state_written(p) for p in sorted(PACKAGE.rglob("*.py"))))
    gone = sorted(set(CACHES) - found)
    assert not gone, f"no longer module-level state: take them out of CACHES: {gone}"


def test_the_state_check_sees_state(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text("import functools\nfrom sglang_deploy.controller import runner\nSEEN = {}\n"
                   "TABLE = {'a': 1}\nN = 0\n\n\ndef f(k):\n    global N\n    N += 1\n"
                   "    SEEN[k] = TABLE['a']\n    runner.VERBOSITY_ENV = 'X'\n\n\n"
                   "@functools.lru_cache\ndef g():\n    return 1\n")
    assert state_written(src, "probe") == {("probe", "N"), ("probe", "SEEN"), ("probe", "g"),
                                           ("sglang_deploy.controller.runner", "VERBOSITY_ENV")}


# ------------------------------------------------------------------ sizes: split by concern
#: the longest function and module the package keeps (issue 33): beyond them a piece holds
#: more than one concern
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def long_pieces(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of PATH itself when over MAX_MODULE_LINES and of each function or method
    in it over MAX_FUNCTION_LINES (its decorators aside, its docstring included)."""
    text = path.read_text()
    out = [(str(path.name), n) for n in [len(text.splitlines())] if n > MAX_MODULE_LINES]
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append((f"{path.name}:{node.name}", n))
    return out


def test_no_function_over_60_lines_and_no_module_over_500():
    found = [piece for p in sorted(PACKAGE.rglob("*.py")) for piece in long_pieces(p)]
    assert not found, f"split by concern: {found}"


def test_the_size_check_sees_a_long_function_and_a_long_module(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    long_fn = tmp_path / "long.py"
    long_fn.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}")
    assert long_pieces(long_fn) == [("long.py:long", MAX_FUNCTION_LINES + 1)]
    long_mod = tmp_path / "big.py"
    long_mod.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_pieces(long_mod) == [("big.py", MAX_MODULE_LINES + 1)]

"""The import graph of the ``sglang_deploy`` package has no cycle: every arrow points one way.

The graph is read from the source (``ast``), not by importing. What counts as an arrow from
module A to module B of the package:

- ``import B`` and ``from B import name`` anywhere in A: at module level, inside functions
  and methods, under ``if TYPE_CHECKING:`` and in ``try`` blocks alike (a function-level
  import is still a dependency; deferring it only hides a circle until that function runs);
- ``from P import name`` where ``P.name`` is a module of the package counts as an arrow to
  ``P.name`` (as ``from sglang_deploy.controller import runner``), otherwise to ``P``;
- relative imports (``from . import x``) resolved against A's package.

Not counted: the implicit import of a parent package's ``__init__`` (Python runs it first, but
those files import nothing of the package here), and imports of anything outside the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_deploy

PACKAGE = Path(sglang_deploy.__file__).resolve().parent
NAME = PACKAGE.name


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that module NAME (file PATH) imports, as counted above."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` binds a.b.c; the nearest module of the package it names
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of EDGES as [a, b, ..., a], or None (depth-first search, sorted order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_is_read_from_the_source():
    """The walk sees module-level, function-level and `from P import module` imports (a
    graph that came out empty would pass the cycle test for nothing)."""
    edges = graph()
    assert f"{NAME}.core.errors" in edges[f"{NAME}.controller.hosts"]          # from x import y
    assert f"{NAME}.controller.runner" in edges[f"{NAME}.commands.doctor_remote"]  # from P import mod
    assert f"{NAME}.commands.common" in edges[f"{NAME}.commands.doctor"]   # inside a function
    assert sum(len(v) for v in edges.values()) > 100


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])

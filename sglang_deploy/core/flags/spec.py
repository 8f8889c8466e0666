"""SGLang's own flag declarations, read STATICALLY (``ast``) out of ``sglang/srt/server_args.py``
(no torch import): :func:`parse_server_args` -> :class:`FlagSpec`. From 0.5.2x most flags are
declared as annotated dataclass fields in ``sglang/srt/arg_groups/fields/*.py`` (registered by
``add_cli_args_from_dataclass``); pass those sources as ``extra_sources`` (:func:`spec_from_wheel`
does it for a wheel file). Pure but for :func:`spec_from_wheel`, which reads a local wheel.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_BARE_ACTIONS = {
    "store_true", "store_false", "store_const", "count", "help", "version",
    "DeprecatedAction", "DeprecatedStoreTrueAction", "DeprecatedStoreConstAction",
    "BooleanOptionalAction",
}
_DEPRECATED_ACTIONS = {"DeprecatedAction", "DeprecatedStoreTrueAction",
                       "DeprecatedStoreConstAction"}


# --------------------------------------------------------------------------------------
# spec
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgInfo:
    """One ``add_argument`` declaration, as far as it can be read statically."""

    option_strings: tuple[str, ...]
    dest: str
    action: str | None = None          # None/"store", "store_true", "BooleanOptionalAction", ...
    nargs: str | int | None = None     # "+", "*", "?", 0, ... ; "?dynamic" if not literal
    choices: tuple[Any, ...] | None = None   # None: unrestricted or not resolvable
    type: str | None = None            # "int", "float", "str", "json.loads", ...
    help: str = ""
    deprecated: bool = False
    new_flag: str | None = None        # replacement named by a Deprecated*Action
    source: str = "add_argument"       # or "dataclass"
    #: a custom/const action declared with an explicit ``nargs=None`` takes one value
    #: (0.5.23 ``--monokernel-backend amd``)
    explicit_value: bool = False

    @property
    def name(self) -> str:
        longs = [o for o in self.option_strings if o.startswith("--")]
        return longs[0] if longs else self.option_strings[0]

    @property
    def action_name(self) -> str:
        return self.action or "store"

    @property
    def takes_value(self) -> bool:
        if self.nargs == 0:
            return False
        if self.action_name in _BARE_ACTIONS:
            return self.explicit_value
        return True

    @property
    def value_optional(self) -> bool:
        return self.nargs in ("?", "*")

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1) \
            or self.action_name in ("append", "extend")

    @property
    def no_effect(self) -> bool:
        """A DeprecatedAction accepts the flag and does nothing (only a warning)."""
        return self.action_name == "DeprecatedAction"


class FlagSpec(Mapping[str, ArgInfo]):
    """``{"--tp-size": ArgInfo, "--tensor-parallel-size": <same ArgInfo>, ...}``."""

    def __init__(self, args: Iterable[ArgInfo], version: str | None = None) -> None:
        self._by_opt: dict[str, ArgInfo] = {}
        self.version = version
        for info in args:
            for opt in info.option_strings:
                # argparse refuses a second declaration of an option: the first one wins here
                self._by_opt.setdefault(opt, info)

    def __getitem__(self, key: str) -> ArgInfo:
        return self._by_opt[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_opt)

    def __len__(self) -> int:
        return len(self._by_opt)

    def long_options(self) -> list[str]:
        return sorted(o for o in self._by_opt if o.startswith("--"))

    def prefix_matches(self, flag: str) -> list[str]:
        """Options that argparse would accept ``flag`` as an abbreviation of."""
        by_dest: dict[str, str] = {}
        for o in sorted(self._by_opt, key=len):
            if o.startswith(flag) and o != flag and o.startswith("--"):
                by_dest.setdefault(self._by_opt[o].dest, o)
        return sorted(by_dest.values())

    def __repr__(self) -> str:
        return f"FlagSpec(version={self.version!r}, {len(self._by_opt)} option strings)"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able copy that :meth:`from_json` turns back into an equal spec (the
        controller's cache of parsed ``server_args.py`` files, see ``flagcache``)."""
        infos = list({id(i): i for i in self._by_opt.values()}.values())  # aliases share one
        index = {id(info): n for n, info in enumerate(infos)}
        return {"version": self.version,
                "by_opt": {opt: index[id(info)] for opt, info in self._by_opt.items()},
                "infos": [dataclasses.asdict(i) for i in infos]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FlagSpec:
        def info(d: dict[str, Any]) -> ArgInfo:
            d = dict(d)
            d["option_strings"] = tuple(d["option_strings"])
            if d.get("choices") is not None:
                d["choices"] = tuple(d["choices"])
            return ArgInfo(**d)

        infos = [info(d) for d in obj["infos"]]
        spec = cls((), version=obj.get("version"))
        spec._by_opt = {opt: infos[i] for opt, i in obj["by_opt"].items()}
        return spec

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FlagSpec) and self.version == other.version
                and list(self._by_opt.items()) == list(other._by_opt.items()))

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------
# static reading of server_args.py
# --------------------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def _text(node: ast.AST | None) -> str:
    """Best-effort text of a help string: constants, f-strings ({...}), concatenations."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{...}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "format":
        return _text(node.func.value)
    return ""


_UNRESOLVED = object()


class _Names:
    """Module-level literal assignments (lists, tuples, sets, constants) over all sources."""

    def __init__(self) -> None:
        self.nodes: dict[str, ast.AST] = {}

    def add_module(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                self.nodes.setdefault(stmt.targets[0].id, stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and stmt.value is not None:
                self.nodes.setdefault(stmt.target.id, stmt.value)

    def resolve(self, node: ast.AST, local: dict[str, ast.AST] | None = None,
                depth: int = 0) -> Any:
        if depth > 8:
            return _UNRESOLVED
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out: list[Any] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    val = self.resolve(elt.value, local, depth + 1)
                    if val is _UNRESOLVED or not isinstance(val, (list, tuple)):
                        return _UNRESOLVED
                    out.extend(val)
                    continue
                val = self.resolve(elt, local, depth + 1)
                if val is _UNRESOLVED:
                    return _UNRESOLVED
                out.append(val)
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = self.resolve(node.left, local, depth + 1)
            right = self.resolve(node.right, local, depth + 1)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return _UNRESOLVED
        if isinstance(node, ast.Call) and _dotted(node.func) in ("list", "tuple", "sorted") \
                and len(node.args) == 1 and not node.keywords:
            val = self.resolve(node.args[0], local, depth + 1)
            if isinstance(val, list):
                return sorted(val) if _dotted(node.func) == "sorted" else val
            return _UNRESOLVED
        if isinstance(node, ast.Name):
            if local and node.id in local:
                return self.resolve(local[node.id], None, depth + 1)
            if node.id in self.nodes:
                return self.resolve(self.nodes[node.id], None, depth + 1)
        return _UNRESOLVED


def _action(node: ast.AST) -> str | None:
    """``action="store_true"`` or ``action=argparse.BooleanOptionalAction`` -> its last name;
    ``action=None`` is argparse's default (store), as no ``action`` at all: None."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    action = str(node.value) if isinstance(node, ast.Constant) else (_dotted(node) or "?")
    return action.rsplit(".", 1)[-1]


def _deprecated(action: str | None, help_text: str) -> bool:
    return action in _DEPRECATED_ACTIONS or "deprecated" in help_text.lower()


def _literal_nargs(node: ast.AST | None) -> str | int | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | None):
        return node.value
    return "?dynamic"


def _info_from_add_argument(call: ast.Call, names: _Names,
                            local: dict[str, ast.AST]) -> ArgInfo | None:
    opts = [a.value for a in call.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not opts or not all(o.startswith("-") for o in opts):
        return None  # positional or dynamic option strings: not a launch flag we can use
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _action(kw["action"]) if "action" in kw else None
    nargs = _literal_nargs(kw.get("nargs"))
    choices = names.resolve(kw["choices"], local) if "choices" in kw else None
    typ = _dotted(kw["type"]) if "type" in kw else None
    help_text = _text(kw.get("help"))
    new_flag = _text(kw.get("new_flag")) or None
    if "dest" in kw and isinstance(kw["dest"], ast.Constant) \
            and isinstance(kw["dest"].value, str):
        dest = kw["dest"].value
    else:
        longs = [o for o in opts if o.startswith("--")]
        dest = (longs[0] if longs else opts[0]).lstrip("-").replace("-", "_")
    if action == "BooleanOptionalAction":
        opts += ["--no-" + o[2:] for o in opts if o.startswith("--")]
    explicit_value = "nargs" in kw and isinstance(kw["nargs"], ast.Constant) \
        and kw["nargs"].value is None and action not in ("store_true", "store_false",
                                                          "BooleanOptionalAction")
    return ArgInfo(tuple(opts), dest, action, nargs,
                   tuple(choices) if isinstance(choices, list) else None, typ, help_text,
                   _deprecated(action, help_text), new_flag, "add_argument", explicit_value)


def _walk_add_argument(tree: ast.AST, names: _Names) -> list[ArgInfo]:
    out: list[ArgInfo] = []

    def visit_function(fn: ast.AST) -> None:
        local: dict[str, ast.AST] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                local.setdefault(node.targets[0].id, node.value)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "add_argument":
                info = _info_from_add_argument(node, names, local)
                if info is not None:
                    out.append(info)

    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # only the outermost functions (nested ones are walked as part of their parent)
    nested = {id(c) for f in funcs for c in ast.walk(f) if c is not f
              and isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for fn in funcs:
        if id(fn) not in nested:
            visit_function(fn)
    return out


# ---- 0.5.2x: annotated dataclass fields -------------------------------------------------


def _subscript_parts(node: ast.Subscript) -> tuple[str | None, list[ast.expr]]:
    base = _dotted(node.value)
    sl = node.slice
    parts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
    return (base.rsplit(".", 1)[-1] if base else None), parts


def _unwrap_optional(node: ast.AST) -> ast.AST:
    """``Optional[X]``, ``Union[X, None]`` and ``X | None`` -> ``X``."""
    if isinstance(node, ast.Subscript):
        base, parts = _subscript_parts(node)
        if base not in ("Optional", "Union"):
            return node
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [node.left, node.right]
    else:
        return node
    rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
    return rest[0] if len(rest) == 1 else node


def _field_arg(meta: list[ast.expr]) -> tuple[dict[str, ast.expr], str] | None:
    """The ``Arg(...)`` keywords of a field's metadata (or none, for a plain help string) and
    its help text; None when the field has neither (``Derived(...)``, ``NS(...)``)."""
    for m in meta:
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return {}, m.value
        if isinstance(m, ast.Call) and _dotted(m.func) in ("Arg", "arg_utils.Arg"):
            arg = {k.arg: k.value for k in m.keywords if k.arg}
            return arg, _text(arg.get("help"))
    return None


def _field_opts(name: str, arg: dict[str, ast.expr], names: _Names) -> list[str]:
    """The option strings of field NAME: its CLI name and aliases."""
    cli_name = _text(arg["cli_name"]) if "cli_name" in arg else "--" + name.replace("_", "-")
    aliases: list[str] = []
    if "aliases" in arg:
        val = names.resolve(arg["aliases"])
        if isinstance(val, list):
            aliases = [a for a in val if isinstance(a, str)]
    return [cli_name, *aliases]


def _typed_field(typ_node: ast.AST, arg: dict[str, ast.expr], names: _Names,
                 choices: tuple[Any, ...] | None
                 ) -> tuple[str | None, str | int | None, str | None, tuple[Any, ...] | None]:
    """(action, nargs, type, choices) of a field without an explicit action: from its type
    annotation (Literal, list, bool, a scalar)."""
    action = nargs = typ = None
    inner = _unwrap_optional(typ_node)
    inner_base, inner_parts = (_subscript_parts(inner) if isinstance(inner, ast.Subscript)
                               else (None, []))
    if "type_parser" in arg:
        typ = _dotted(arg["type_parser"])
    if inner_base == "Literal":
        lit = names.resolve(ast.List(elts=inner_parts, ctx=ast.Load()))
        if choices is None and isinstance(lit, list):
            choices = tuple(lit)
        typ = typ or (type(lit[0]).__name__ if isinstance(lit, list) and lit else "str")
    elif inner_base in ("list", "List") and "type_parser" not in arg:
        nargs = _literal_nargs(arg.get("nargs")) or "+"
        elem = _dotted(inner_parts[0]) if inner_parts else "str"
        typ = elem if elem in ("int", "float", "str") else "str"
    elif _dotted(inner) == "bool":
        action = "store_true"
    else:
        nargs = _literal_nargs(arg.get("nargs"))
        if typ is None:
            d = _dotted(inner)
            typ = d if d in ("int", "float", "str") else "str"
    return action, nargs, typ, choices


def _info_from_field(name: str, ann: ast.Subscript, names: _Names) -> ArgInfo | None:
    base, parts = _subscript_parts(ann)
    if base not in ("A", "Annotated") or len(parts) < 2:
        return None
    found = _field_arg(parts[1:])
    if found is None:
        return None  # Derived(...) / NS(...) only: not a CLI flag
    arg, help_text = found
    no_cli = arg.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return None
    opts = _field_opts(name, arg, names)
    choices = names.resolve(arg["choices"]) if "choices" in arg else None
    choices = tuple(choices) if isinstance(choices, list) else None
    kwargs = arg.get("action_kwargs")
    action_kw = {k.value: v for k, v in zip(kwargs.keys, kwargs.values)
                 if isinstance(k, ast.Constant)} if isinstance(kwargs, ast.Dict) else {}
    action: str | None
    if "action" in arg:
        action = _action(arg["action"])
        nargs = _literal_nargs(action_kw["nargs"]) if "nargs" in action_kw else None
        typ = _dotted(action_kw["type"]) if "type" in action_kw else None
        if action == "BooleanOptionalAction":
            opts += ["--no-" + o[2:] for o in opts if o.startswith("--")]
    else:
        action, nargs, typ, choices = _typed_field(parts[0], arg, names, choices)
    return ArgInfo(tuple(opts), name, action, nargs, choices, typ, help_text,
                   _deprecated(action, help_text), _text(action_kw.get("new_flag")) or None,
                   "dataclass")


def _namespace_classes(server_args_tree: ast.Module) -> set[str] | None:
    for stmt in server_args_tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id == "_INPUT_NAMESPACES" \
                and isinstance(stmt.value, (ast.List, ast.Tuple)):
            return {n.id for n in stmt.value.elts if isinstance(n, ast.Name)}
    return None


def _is_namespace(cls: ast.ClassDef, wanted: set[str] | None) -> bool:
    """A class of flag fields: named in ``_INPUT_NAMESPACES``, or (without that list) one
    that declares ``_NS_PATH``."""
    if wanted is not None:
        return cls.name in wanted
    return any(isinstance(s, ast.Assign) and any(isinstance(x, ast.Name) and x.id == "_NS_PATH"
                                                 for x in s.targets) for s in cls.body)


def _uses_dataclass_registration(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Call) and _dotted(n.func) == "add_cli_args_from_dataclass"
               for n in ast.walk(tree))


def parse_server_args(source: str, extra_sources: Mapping[str, str] | None = None,
                      version: str | None = None) -> FlagSpec:
    """Read every flag declaration of ``sglang/srt/server_args.py`` statically.

    ``extra_sources`` (``{member path: text}``) are the 0.5.2x field modules
    (``sglang/srt/arg_groups/fields/*.py``) and ``sglang/srt/arg_groups/choices.py``;
    they are required when ``source`` registers its flags from dataclass fields, and they
    also serve to resolve ``choices=SOME_NAME`` imported from another module.
    """
    tree = ast.parse(source)
    names = _Names()
    names.add_module(tree)
    extra_trees = {path: ast.parse(text) for path, text in (extra_sources or {}).items()}
    for t in extra_trees.values():
        names.add_module(t)
    infos: list[ArgInfo] = []
    if _uses_dataclass_registration(tree):
        field_trees = {p: t for p, t in extra_trees.items() if "/fields/" in p
                       or p.rsplit("/", 1)[-1] not in ("choices.py",)}
        wanted = _namespace_classes(tree)
        seen_classes = 0
        for t in [tree, *field_trees.values()]:
            for cls in (n for n in t.body if isinstance(n, ast.ClassDef)):
                if not _is_namespace(cls, wanted):
                    continue
                seen_classes += 1
                for stmt in cls.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                            and isinstance(stmt.annotation, ast.Subscript):
                        info = _info_from_field(stmt.target.id, stmt.annotation, names)
                        if info is not None:
                            infos.append(info)
        if not seen_classes:
            raise ValueError(
                "this server_args.py registers its flags from dataclass fields "
                "(sglang 0.5.2x layout): pass the sources of "
                "sglang/srt/arg_groups/fields/*.py as extra_sources (see spec_from_wheel)")
    infos.extend(_walk_add_argument(tree, names))
    return FlagSpec(infos, version=version)


def spec_members(names: Iterable[str]) -> list[str]:
    """The wheel members :func:`spec_from_wheel` reads, out of a wheel's member list."""
    return sorted(n for n in names if n in ("sglang/srt/server_args.py",
                                            "sglang/srt/arg_groups/choices.py")
                  or (n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")))


def spec_from_wheel(wheel_path: Any, version: str | None = None) -> FlagSpec:
    """Build the spec from an sglang wheel file (reads it; imports nothing)."""
    import zipfile

    with zipfile.ZipFile(wheel_path) as zf:
        members = spec_members(zf.namelist())
        texts = {m: zf.read(m).decode("utf-8") for m in members}
    main = texts.pop("sglang/srt/server_args.py")
    return parse_server_args(main, texts, version=version)



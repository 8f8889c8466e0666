"""Launch flags: group data mapping -> argv, checked against SGLang's own flag declarations.

Pure module (no I/O except :func:`spec_from_wheel`, which reads a local wheel file).

* :func:`render_flags` turns ``{"tp-size": 8, "disable-cuda-graph": True}`` into
  ``["--disable-cuda-graph", "--tp-size", "8"]``.  Rules:

  - keys may be written ``--kebab-case``, ``kebab-case`` or ``snake_case``; they are
    normalised to ``--kebab-case``; two keys that normalise to the same flag are refused;
  - ``True`` -> bare flag; ``False``/``None`` -> omitted (with a spec: ``False`` on an
    ``argparse.BooleanOptionalAction`` flag -> ``--no-flag``);
  - numbers -> ``str()``; dicts -> compact JSON (sorted keys);
  - lists -> ONE flag followed by the items (``--flag a b``): every list option of SGLang
    0.5.9 .. 0.5.23 is ``nargs="+"``/``"*"`` and none is ``action="append"`` (repeating a
    ``nargs="+"`` flag keeps only the last occurrence).  With a spec whose flag is declared
    ``action="append"`` the flag is repeated once per item instead;
  - the output is sorted by flag name, so re-renders are byte-identical and diffs stay small.

* :func:`parse_server_args` reads the flag declarations STATICALLY (``ast``) out of
  ``sglang/srt/server_args.py``.  From 0.5.2x most flags are declared as annotated
  dataclass fields in ``sglang/srt/arg_groups/fields/*.py`` (registered by
  ``add_cli_args_from_dataclass``); pass those sources as ``extra_sources``
  (:func:`spec_from_wheel` does it for you).

* :func:`validate_flags` / :func:`check_flags` check a mapping against a spec.

"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


from sglang_deploy.core.errors import FlagError

__all__ = [
    "FORBIDDEN",
    "KNOWN_CHANGES",
    "ArgInfo",
    "FlagSpec",
    "Problem",
    "check_flags",
    "check_shape",
    "normalise",
    "normalise_name",
    "normalise_names",
    "parse_server_args",
    "render_flags",
    "spec_from_wheel",
    "spec_members",
    "validate_flags",
]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")

#: flags the deploy renders itself (or must never render), with the data key to use instead
FORBIDDEN: dict[str, str] = {
    "--host": "set `sglang_host` instead (the deploy renders --host)",
    "--port": "set `sglang_port` instead (the deploy renders --port)",
    "--api-key": "name the controller environment variable holding the key in "
                 "`sglang_api_key_env`; a key on the command line is readable by every "
                 "local user in /proc/PID/cmdline",
    "--admin-api-key": "secrets never go on the command line (readable in /proc/PID/cmdline)",
    "--config": "the deploy owns the --config file; put the options into `sglang_flags`",
}

#: flags whose fate we read off the real wheels (used when no other spec knows them)
KNOWN_CHANGES: dict[str, str] = {
    "--cuda-graph-max-bs": "removed in 0.5.20; 0.5.23 has --cuda-graph-max-bs-decode and "
                           "--cuda-graph-max-bs-prefill",
    "--disable-cuda-graph": "deprecated in 0.5.23: use --cuda-graph-backend-decode disabled "
                            "and --cuda-graph-backend-prefill disabled",
}

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
    choices_resolved: bool = True      # False: declared but not resolvable statically
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

    def canonical(self, flag: str) -> str:
        return self._by_opt[flag].name

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

    def to_json(self) -> dict:
        """A JSON-able copy that :meth:`from_json` turns back into an equal spec (the
        controller's cache of parsed ``server_args.py`` files, see ``flagcache``)."""
        infos: list[ArgInfo] = []
        index: dict[int, int] = {}
        by_opt = {}
        for opt, info in self._by_opt.items():
            if id(info) not in index:
                index[id(info)] = len(infos)
                infos.append(info)
            by_opt[opt] = index[id(info)]
        return {"version": self.version, "by_opt": by_opt,
                "infos": [dataclasses.asdict(i) for i in infos]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> FlagSpec:
        def info(d: dict) -> ArgInfo:
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
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
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
            out = []
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


def _literal_nargs(node: ast.AST | None) -> str | int | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    return "?dynamic"


def _info_from_add_argument(call: ast.Call, names: _Names,
                            local: dict[str, ast.AST]) -> ArgInfo | None:
    opts = [a.value for a in call.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not opts or not all(o.startswith("-") for o in opts):
        return None  # positional or dynamic option strings: not a launch flag we can use
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = None
    if "action" in kw:
        a = kw["action"]
        action = a.value if isinstance(a, ast.Constant) else (_dotted(a) or "?")
        action = action.rsplit(".", 1)[-1] if action else action
    nargs = _literal_nargs(kw.get("nargs"))
    choices, resolved = None, True
    if "choices" in kw:
        val = names.resolve(kw["choices"], local)
        if val is _UNRESOLVED or not isinstance(val, list):
            resolved = False
        else:
            choices = tuple(val)
    typ = _dotted(kw["type"]) if "type" in kw else None
    help_text = _text(kw.get("help"))
    new_flag = None
    if "new_flag" in kw:
        new_flag = _text(kw["new_flag"]) or None
    deprecated = (action in _DEPRECATED_ACTIONS) or ("deprecated" in help_text.lower())
    if "dest" in kw and isinstance(kw["dest"], ast.Constant):
        dest = kw["dest"].value
    else:
        longs = [o for o in opts if o.startswith("--")]
        dest = (longs[0] if longs else opts[0]).lstrip("-").replace("-", "_")
    option_strings = list(opts)
    if action == "BooleanOptionalAction":
        option_strings += ["--no-" + o[2:] for o in opts if o.startswith("--")]
    explicit_value = "nargs" in kw and isinstance(kw["nargs"], ast.Constant) \
        and kw["nargs"].value is None and action not in ("store_true", "store_false",
                                                          "BooleanOptionalAction")
    return ArgInfo(tuple(option_strings), dest, action, nargs, choices, resolved, typ,
                   help_text, deprecated, new_flag, "add_argument", explicit_value)


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


def _subscript_parts(node: ast.Subscript) -> tuple[str | None, list[ast.AST]]:
    base = _dotted(node.value)
    sl = node.slice
    parts = list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]
    return (base.rsplit(".", 1)[-1] if base else None), parts


def _unwrap_optional(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Subscript):
        base, parts = _subscript_parts(node)
        if base == "Optional" and len(parts) == 1:
            return parts[0]
        if base == "Union":
            rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
            if len(rest) == 1:
                return rest[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0]
    return node


def _info_from_field(name: str, ann: ast.Subscript, names: _Names) -> ArgInfo | None:
    base, parts = _subscript_parts(ann)
    if base not in ("A", "Annotated") or len(parts) < 2:
        return None
    typ_node, meta = parts[0], parts[1:]
    arg: dict[str, ast.AST] | None = None
    help_text = ""
    for m in meta:
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            arg, help_text = {}, m.value
            break
        if isinstance(m, ast.Call) and _dotted(m.func) in ("Arg", "arg_utils.Arg"):
            arg = {k.arg: k.value for k in m.keywords if k.arg}
            help_text = _text(arg.get("help"))
            break
    if arg is None:
        return None  # Derived(...) / NS(...) only: not a CLI flag
    if isinstance(arg.get("no_cli"), ast.Constant) and arg["no_cli"].value is True:
        return None
    cli_name = _text(arg["cli_name"]) if "cli_name" in arg else "--" + name.replace("_", "-")
    aliases: list[str] = []
    if "aliases" in arg:
        val = names.resolve(arg["aliases"])
        if isinstance(val, list):
            aliases = [a for a in val if isinstance(a, str)]
    opts = [cli_name, *aliases]
    action = None
    nargs: str | int | None = None
    typ: str | None = None
    choices, resolved = None, True
    if "choices" in arg:
        val = names.resolve(arg["choices"])
        if isinstance(val, list):
            choices = tuple(val)
        else:
            resolved = False
    if "action" in arg:
        a = arg["action"]
        action = a.value if isinstance(a, ast.Constant) else (_dotted(a) or "?")
        action = action.rsplit(".", 1)[-1]
        kwargs = arg.get("action_kwargs")
        if isinstance(kwargs, ast.Dict):
            for k, v in zip(kwargs.keys, kwargs.values):
                if isinstance(k, ast.Constant) and k.value == "nargs":
                    nargs = _literal_nargs(v)
                if isinstance(k, ast.Constant) and k.value == "type":
                    typ = _dotted(v)
        if action == "BooleanOptionalAction":
            opts += ["--no-" + o[2:] for o in list(opts) if o.startswith("--")]
    else:
        inner = _unwrap_optional(typ_node)
        inner_base = None
        inner_parts: list[ast.AST] = []
        if isinstance(inner, ast.Subscript):
            inner_base, inner_parts = _subscript_parts(inner)
        if "type_parser" in arg:
            typ = _dotted(arg["type_parser"])
        if inner_base == "Literal":
            lit = names.resolve(ast.List(elts=inner_parts, ctx=ast.Load()))
            if choices is None and isinstance(lit, list):
                choices, resolved = tuple(lit), True
            typ = typ or (type(lit[0]).__name__ if isinstance(lit, list) and lit else "str")
        elif inner_base in ("list", "List") and "type_parser" not in arg:
            nargs = _literal_nargs(arg.get("nargs")) or "+"
            elem = _dotted(inner_parts[0]) if inner_parts else "str"
            typ = elem if elem in ("int", "float", "str") else "str"
        elif _dotted(inner) == "bool":
            action = "store_true"
        else:
            if "nargs" in arg:
                nargs = _literal_nargs(arg["nargs"])
            if typ is None:
                d = _dotted(inner)
                typ = d if d in ("int", "float", "str") else "str"
    new_flag = None
    if "action_kwargs" in arg and isinstance(arg["action_kwargs"], ast.Dict):
        for k, v in zip(arg["action_kwargs"].keys, arg["action_kwargs"].values):
            if isinstance(k, ast.Constant) and k.value == "new_flag":
                new_flag = _text(v) or None
    deprecated = (action in _DEPRECATED_ACTIONS) or ("deprecated" in help_text.lower())
    return ArgInfo(tuple(opts), name, action, nargs, choices, resolved, typ, help_text,
                   deprecated, new_flag, "dataclass")


def _namespace_classes(server_args_tree: ast.Module) -> set[str] | None:
    for stmt in server_args_tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id == "_INPUT_NAMESPACES" \
                and isinstance(stmt.value, (ast.List, ast.Tuple)):
            return {n.id for n in stmt.value.elts if isinstance(n, ast.Name)}
    return None


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
                if wanted is not None and cls.name not in wanted:
                    continue
                if wanted is None and not any(
                        isinstance(s, ast.Assign) and any(isinstance(x, ast.Name)
                                                          and x.id == "_NS_PATH"
                                                          for x in s.targets)
                        for s in cls.body):
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
    out = []
    for n in names:
        if n == "sglang/srt/server_args.py" or n == "sglang/srt/arg_groups/choices.py" or (
                n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")):
            out.append(n)
    return sorted(out)


def spec_from_wheel(wheel_path: Any, version: str | None = None) -> FlagSpec:
    """Build the spec from an sglang wheel file (reads it; imports nothing)."""
    import zipfile

    with zipfile.ZipFile(wheel_path) as zf:
        members = spec_members(zf.namelist())
        texts = {m: zf.read(m).decode("utf-8") for m in members}
    main = texts.pop("sglang/srt/server_args.py")
    return parse_server_args(main, texts, version=version)


# --------------------------------------------------------------------------------------
# shape and names
# --------------------------------------------------------------------------------------


def normalise_name(key: str) -> str:
    """``tp_size`` / ``tp-size`` / ``--tp-size`` -> ``--tp-size`` (no validation)."""
    k = str(key).strip()
    k = k.removeprefix("--")
    return "--" + k.replace("_", "-")


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _json_ok(v: Any) -> bool:
    if _scalar(v):
        return not (isinstance(v, float) and not math.isfinite(v))
    if isinstance(v, list):
        return all(_json_ok(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_ok(x) for k, x in v.items())
    return False


def _shape_error(key: Any, what: str, found: str, fix: str) -> FlagError:
    return FlagError(what=what, found=found, fix=fix,
                     details={"key": str(key), "data_key": "sglang_flags"})


def _has_control(s: str) -> bool:
    return any(c in s for c in "\n\r\0")


def check_shape(mapping: Any) -> None:
    """Raise :class:`FlagError` (naming the key) unless ``mapping`` is a well-formed
    ``{flag: value}``: value str/int/float/bool/None, a list of those (no None/bool), or a
    JSON-able dict (rendered as JSON); no empty names, no newlines, no duplicates."""
    if not isinstance(mapping, Mapping):
        raise _shape_error("sglang_flags", "a mapping of flag name to value",
                           f"{type(mapping).__name__}", "write `sglang_flags` as a dict")
    seen: dict[str, str] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key.strip().lstrip("-").strip():
            raise _shape_error(key, "a non-empty flag name", f"key {key!r}",
                               "write the full flag name, e.g. `tp-size`")
        name = normalise_name(key)
        bare = name[2:]
        if not _NAME_RE.match(bare) or key != key.strip():
            raise _shape_error(key, "a flag name of lower-case letters, digits, `-` or `_`",
                               f"`{key}`", "write the full flag name, e.g. `tp-size`")
        if name in seen:
            raise _shape_error(key, "each flag once",
                               f"`{seen[name]}` and `{key}` are both {name}",
                               "keep one of them")
        seen[name] = key
        if isinstance(value, dict):
            if not _json_ok(value):
                raise _shape_error(key, f"`{key}`: a JSON-able dict",
                                   repr(value)[:200], "use strings, numbers, lists, dicts")
            continue
        if isinstance(value, (list, tuple)):
            for item in value:
                if item is None or isinstance(item, bool) or not _scalar(item):
                    raise _shape_error(key, f"`{key}`: a list of strings or numbers",
                                       f"item {item!r} ({type(item).__name__})",
                                       "write the items as strings or numbers")
                if isinstance(item, str) and (_has_control(item) or not item):
                    raise _shape_error(key, f"`{key}`: one-line, non-empty list items",
                                       repr(item)[:200], "remove the newline")
            if not value:
                raise _shape_error(key, f"`{key}`: a non-empty list", "[]",
                                   "remove the key or give at least one item")
            continue
        if not _scalar(value):
            raise _shape_error(key, f"`{key}`: a string, number, boolean, null or list",
                               f"{type(value).__name__} {value!r}"[:200],
                               "write a plain value")
        if isinstance(value, float) and not math.isfinite(value):
            raise _shape_error(key, f"`{key}`: a finite number", repr(value),
                               "write a finite number")
        if isinstance(value, str) and _has_control(value):
            raise _shape_error(key, f"`{key}`: a one-line value", repr(value)[:200],
                               "remove the newline")


def normalise_names(mapping: Mapping[str, Any]) -> list[str]:
    """The normalised flag names of ``mapping`` (checks the shape first)."""
    check_shape(mapping)
    return [normalise_name(k) for k in mapping]


def normalise(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``{--kebab-name: value}`` sorted by name (checks the shape first)."""
    check_shape(mapping)
    return {normalise_name(k): mapping[k] for k in sorted(mapping, key=normalise_name)}


# --------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _looks_negative_number(s: str) -> bool:
    return bool(re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+", s))


def render_flags(mapping: Mapping[str, Any], spec: FlagSpec | None = None) -> list[str]:
    """Render launch flags to argv words, sorted by flag name (see module docstring)."""
    norm = normalise(mapping)
    argv: list[str] = []
    for name, value in norm.items():
        info = spec.get(name) if spec is not None else None
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                argv.append(name)
            elif info is not None and info.action_name == "BooleanOptionalAction" \
                    and not name.startswith("--no-"):
                argv.append("--no-" + name[2:])
            continue
        if isinstance(value, (list, tuple)):
            items = [_word(v) for v in value]
            for it in items:
                if it.startswith("-") and not _looks_negative_number(it):
                    raise _shape_error(name, f"`{name}`: list items that do not start with `-`",
                                       repr(it), "argparse would read the item as a flag")
            if info is not None and info.action_name in ("append",):
                for it in items:
                    argv += [name, it]
            else:
                argv += [name, *items]
            continue
        word = _word(value)
        if word.startswith("-") and not _looks_negative_number(word):
            argv.append(f"{name}={word}")  # argparse would take `-x` for an option
        else:
            argv += [name, word]
    return argv


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    level: str          # "error" | "warning"
    key: str            # the key as written in the data
    flag: str           # normalised flag name
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.flag}: {self.message}" + (f" ({self.fix})" if self.fix else "")


def _close(name: str, candidates: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.75)


def _convertible(value: Any, typ: str | None) -> bool:
    if typ == "int" or typ == "human_readable_int":
        if isinstance(value, bool):
            return False
        if isinstance(value, int):
            return True
        if isinstance(value, str):
            if typ == "human_readable_int":
                return bool(re.fullmatch(r"\s*\d+(\.\d+)?\s*[kKmMgGtT]?\s*", value))
            try:
                int(value)
                return True
            except ValueError:
                return False
        return False
    if typ == "float":
        if isinstance(value, bool):
            return False
        if isinstance(value, (int, float)):
            return True
        try:
            float(str(value))
            return True
        except ValueError:
            return False
    if typ in ("json.loads", "loads"):
        if isinstance(value, (dict, list)):
            return True
        try:
            json.loads(str(value))
            return True
        except ValueError:
            return False
    return True


def _in_choices(value: Any, choices: tuple[Any, ...]) -> bool:
    return str(value) in {str(c) for c in choices}


def validate_flags(mapping: Mapping[str, Any], spec: FlagSpec, version: str | None = None,
                   *, other_specs: Mapping[str, FlagSpec] | None = None,
                   forbidden: Mapping[str, str] | None = None) -> list[Problem]:
    """Check ``mapping`` against ``spec`` (the pinned version's flags); returns problems.

    ``other_specs`` (``{version: spec}``) lets an unknown flag be reported as "exists in
    X" (renamed or removed).  ``forbidden`` defaults to :data:`FORBIDDEN`.
    """
    check_shape(mapping)
    version = version or spec.version or "this version"
    forbidden = FORBIDDEN if forbidden is None else forbidden
    problems: list[Problem] = []
    dests: dict[str, str] = {}
    for key in sorted(mapping, key=normalise_name):
        value = mapping[key]
        name = normalise_name(key)
        if name in forbidden:
            problems.append(Problem("error", key, name,
                                    f"{name} is set by the deploy itself", forbidden[name]))
            continue
        info = spec.get(name)
        if info is None:
            problems.append(_unknown(key, name, spec, version, other_specs))
            continue
        prev = dests.get(info.dest)
        if prev is not None:
            problems.append(Problem("error", key, name,
                                    f"{name} sets the same option as {prev}",
                                    "keep one of them"))
            continue
        dests[info.dest] = name
        if value is None or value is False:
            continue  # omitted
        if info.deprecated:
            hint = f"use {info.new_flag} instead" if info.new_flag else info.help.strip()
            msg = f"{name} is deprecated in SGLang {version}"
            if info.no_effect:
                msg += " and has no effect"
            problems.append(Problem("warning", key, name, msg, hint[:300]))
        if not info.takes_value:
            if value is not True:
                problems.append(Problem("error", key, name,
                                        f"{name} is a bare flag and takes no value "
                                        f"(got {value!r})",
                                        f"write `{key}: true` to set it, `false` to omit it"))
            continue
        if value is True:
            if not info.value_optional:
                problems.append(Problem("error", key, name, f"{name} needs a value "
                                        "(got true)", f"write `{key}: <value>`"))
            continue
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if isinstance(value, (list, tuple)) and not info.is_list:
            problems.append(Problem("error", key, name,
                                    f"{name} takes one value, not a list",
                                    f"write a single value for `{key}`"))
            continue
        for item in items:
            if not _convertible(item, info.type):
                problems.append(Problem("error", key, name,
                                        f"{name} expects {info.type}, got {item!r}",
                                        f"write a {info.type} value"))
                break
            if info.choices is not None and not _in_choices(item, info.choices):
                sugg = _close(str(item), [str(c) for c in info.choices])
                fix = (f"did you mean {sugg[0]!r}? " if sugg else "") + \
                    "valid: " + ", ".join(str(c) for c in info.choices)[:600]
                problems.append(Problem("error", key, name,
                                        f"{item!r} is not a valid value of {name} in SGLang "
                                        f"{version}", fix))
                break
    return problems


def _unknown(key: str, name: str, spec: FlagSpec, version: str,
             other_specs: Mapping[str, FlagSpec] | None) -> Problem:
    prefixes = spec.prefix_matches(name)
    elsewhere = sorted(v for v, s in (other_specs or {}).items() if name in s)
    history = ""
    if elsewhere:
        history = f"it exists in {', '.join(elsewhere)} (renamed or removed since)"
    elif name in KNOWN_CHANGES:
        history = KNOWN_CHANGES[name]
    parts = [f"{name} is not a flag of SGLang {version}"]
    if history:
        parts.append(history)
    if len(prefixes) == 1:
        if history:
            parts.append(f"argparse would silently take it as {prefixes[0]}")
        else:
            parts[0] += f": argparse only accepts it as an abbreviation of {prefixes[0]}"
        return Problem("error", key, name, "; ".join(parts),
                       f"write the full name `{prefixes[0][2:]}`")
    if prefixes:
        parts.append(f"it abbreviates {', '.join(prefixes[:5])}")
        return Problem("error", key, name, "; ".join(parts),
                       f"write the full flag name (one of {', '.join(prefixes[:5])})")
    sugg = _close(name, spec.long_options())
    fix = f"did you mean {sugg[0]}?" if sugg else \
        "see `python -m sglang.launch_server --help` of that version"
    return Problem("error", key, name, "; ".join(parts), fix)


def check_flags(mapping: Mapping[str, Any], spec: FlagSpec, version: str | None = None,
                **kw: Any) -> list[Problem]:
    """Like :func:`validate_flags` but raises :class:`FlagError` on errors; returns the
    warnings."""
    problems = validate_flags(mapping, spec, version, **kw)
    errors = [p for p in problems if p.level == "error"]
    if errors:
        v = version or spec.version or "the pinned version"
        first = errors[0]
        raise FlagError(
            what=f"launch flags that SGLang {v} accepts",
            found="\n".join(str(p.message) for p in errors),
            fix="\n".join(f"{p.flag}: {p.fix}" for p in errors if p.fix),
            details={"key": first.key, "data_key": "sglang_flags",
                     "problems": [p.__dict__ for p in problems]},
        )
    return [p for p in problems if p.level == "warning"]

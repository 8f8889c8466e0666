"""What the simulator reads off the INSTALLED sglang wheel, without importing sglang: where it
is, its version, the command line parser of ServerArgs (ast), and whether FlashInfer autotune
runs (the allow-list of its decision function)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

_MISSING = object()


# --------------------------------------------------------------------------------------
# Locating the installed sglang without importing it
# --------------------------------------------------------------------------------------
def find_sglang_dir() -> Path:
    spec = importlib.util.find_spec("sglang")  # does not execute sglang/__init__.py
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("launch_server.py (simulator): sglang is not installed in this "
                         "environment")
    return Path(next(iter(spec.submodule_search_locations)))


def _metadata(sgl: Path) -> str:
    """The METADATA of the installed sglang distribution ("" if there is none)."""
    for md in sgl.parent.glob("sglang-*.dist-info/METADATA"):
        return md.read_text(errors="replace")
    return ""


def read_version(sgl: Path) -> str:
    for name in ("version.py", "_version.py"):
        f = sgl / name
        if f.is_file():
            m = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                          f.read_text(), re.MULTILINE)
            if m:
                return m.group(1)
    m = re.search(r"^Version:\s*(\S+)", _metadata(sgl), re.MULTILINE)
    return m.group(1) if m else "0.0.0"


def version_tuple(v: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", v)
    if not m:
        return (0, 0, 0, 0)
    return tuple(int(x or 0) for x in m.groups())


def flashinfer_version(sgl: Path) -> str:
    m = re.search(r"^Requires-Dist:\s*flashinfer[_-]python(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)",
                  _metadata(sgl), re.MULTILINE)
    return m.group(1) if m else "unknown"


# --------------------------------------------------------------------------------------
# The command line parser, read statically from sglang/srt/server_args.py
# --------------------------------------------------------------------------------------
def _literal(node, default=_MISSING):
    """The value of a literal expression node, else DEFAULT."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return default


def _literal_list(node, lists: dict) -> list:
    """[literal, ...], a module-level list of LISTS by name, or a + of such; else ValueError."""
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant)
                                                       for e in node.elts):
        return [e.value for e in node.elts]
    if isinstance(node, ast.Name) and node.id in lists:
        return list(lists[node.id])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_list(node.left, lists) + _literal_list(node.right, lists)
    raise ValueError(node)


def _module_lists(tree: ast.Module) -> dict:
    """Module-level NAME = [literal, ...] (also list + list of such)."""
    out: dict = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                out[stmt.targets[0].id] = _literal_list(stmt.value, out)
            except ValueError:
                pass
    return out


def _server_args_fields(tree: ast.Module) -> tuple[list, dict]:
    """The fields of the ServerArgs dataclass in order, and their literal defaults."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            fields = [st for st in node.body
                      if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)]
            defaults = {st.target.id: _literal(st.value) for st in fields if st.value is not None}
            return ([st.target.id for st in fields],
                    {k: v for k, v in defaults.items() if v is not _MISSING})
    return [], {}


def _function(tree: ast.AST, name: str):
    """The first definition of function NAME in TREE, else None."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return next((node for node in ast.walk(tree) if isinstance(node, kinds) and node.name == name),
                None)


def _cli_aliases(tree: ast.Module) -> list:
    """`args.tp_size = args.tensor_parallel_size` lines of ServerArgs.from_cli_args."""
    fn = _function(tree, "from_cli_args")
    return [(st.targets[0].attr, st.value.attr) for st in (ast.walk(fn) if fn else ())
            if isinstance(st, ast.Assign) and len(st.targets) == 1
            and isinstance(st.targets[0], ast.Attribute) and isinstance(st.value, ast.Attribute)]


def _nargs0_actions(tree: ast.Module) -> set:
    """Custom argparse.Action classes whose __init__ defaults nargs to 0 (flag-like)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.FunctionDef) and st.name == "__init__":
                    a = st.args
                    args = a.args[len(a.args) - len(a.defaults):]
                    for arg, d in zip(args, a.defaults):
                        if arg.arg == "nargs" and isinstance(d, ast.Constant) and d.value == 0:
                            names.add(node.name)
    return names


def _find_prog(tree: ast.Module):
    fn = _function(tree, "prepare_server_args")
    for sub in ast.walk(fn) if fn else ():
        if isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) == "ArgumentParser":
            for kw in sub.keywords:
                if kw.arg == "prog" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
    return None


def build_parser(server_args_src: str):
    """Return (parser, defaults-of-ServerArgs). Mirrors `prepare_server_args`."""
    tree = ast.parse(server_args_src)
    lists = _module_lists(tree)
    fields, defaults = _server_args_fields(tree)
    flag_actions = _nargs0_actions(tree)
    prog = _find_prog(tree)  # None -> argparse default = basename(argv[0]) = launch_server.py
    parser = argparse.ArgumentParser(prog=prog)
    parser.sim_fields = fields
    # 0.5.23 builds most flags from dataclass metadata (add_cli_args_from_dataclass): not
    # modelled statically -> permissive parsing (see parse_server_args).
    parser.sim_incomplete = "add_cli_args_from_dataclass" in server_args_src
    parser.sim_aliases = _cli_aliases(tree)

    scope = _function(tree, "add_cli_args") or tree
    seen: set = set()
    for call in ast.walk(scope):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            continue
        opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not opts or not all(o.startswith("-") for o in opts) or any(o in seen for o in opts):
            continue
        seen.update(opts)
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        spec: dict = {}
        action = kw.get("action")
        if isinstance(action, ast.Constant):
            spec["action"] = action.value
        elif isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
            spec["action"] = argparse.BooleanOptionalAction
        elif isinstance(action, ast.Name) and action.id in flag_actions and "nargs" not in kw:
            spec["action"] = "store_true"
        # other custom actions (LoRAPathAction, ...): plain store with the given nargs
        if "nargs" in kw:
            spec["nargs"] = _literal(kw["nargs"], "*")
        if "const" in kw and spec.get("action") in ("store_const", "append_const"):
            spec["const"] = _literal(kw["const"], True)
        if "dest" in kw and isinstance(kw["dest"], ast.Constant):
            spec["dest"] = kw["dest"].value
        flaglike = spec.get("action") in ("store_true", "store_false", "store_const", "count",
                                          "append_const", argparse.BooleanOptionalAction)
        if not flaglike:
            t = kw.get("type")
            if isinstance(t, ast.Name) and t.id in ("int", "float", "str"):
                spec["type"] = {"int": int, "float": float, "str": str}[t.id]
            try:
                choices = _literal_list(kw["choices"], lists) if "choices" in kw else None
            except ValueError:
                choices = None
            # choices of a flag without a type are compared as strings
            if choices is not None and ("type" in spec or all(isinstance(c, str) for c in choices)):
                spec["choices"] = choices
        d = kw.get("default")
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == "ServerArgs":
            default = defaults.get(d.attr, _MISSING)
        else:
            default = _MISSING if d is None else _literal(d)
        if default is not _MISSING:
            spec["default"] = default
        try:
            parser.add_argument(*opts, **spec)
        except (ValueError, TypeError, argparse.ArgumentError):
            try:
                parser.add_argument(*opts, nargs="?", const=True)
            except Exception:
                pass
    return parser, defaults


def _number(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_server_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ARGV as `prepare_server_args` does, then copy the from_cli_args aliases
    (tp_size = tensor_parallel_size, ...). A parser that cannot know all the flags
    (sim_incomplete) accepts unknown `--name[=value]` / `--name value` / `--name` (True)."""
    if parser.sim_incomplete:
        sys.stderr.write("sglang-sim: this version declares its flags via dataclass metadata; "
                         "accepting unknown flags without checking them\n")
        _, rest = parser.parse_known_args(argv)
        for name in dict.fromkeys(tok.split("=", 1)[0] for tok in rest if tok.startswith("--")):
            parser.add_argument(name, nargs="?", const=True, type=_number)
        args = parser.parse_known_args(argv)[0]
    else:
        args = parser.parse_args(argv)
    for dst, src_name in parser.sim_aliases:
        if hasattr(args, src_name):
            setattr(args, dst, getattr(args, src_name))
    return args


# --------------------------------------------------------------------------------------
# FlashInfer autotune decision, read from the installed sources
# --------------------------------------------------------------------------------------
AUTOTUNE_LOCATIONS = [
    ("srt/model_executor/runner/flashinfer_autotune.py", "should_run_flashinfer_autotune"),  # 0.5.15+
    ("srt/model_executor/runner/base_runner.py", "_should_run_flashinfer_autotune"),         # 0.5.14
    ("srt/model_executor/model_runner.py", "_should_run_flashinfer_autotune"),               # 0.5.6-0.5.13.post1
]
SIM_GPU_MAJOR = 12  # the simulated GPU is SM120 (RTX PRO 6000 Blackwell)


def find_autotune_function(sgl: Path):
    for rel, name in AUTOTUNE_LOCATIONS:
        f = sgl / rel
        if not f.is_file():
            continue
        src = f.read_text()
        fn = _function(ast.parse(src), name)
        if fn:
            return rel, fn, ast.get_source_segment(src, fn) or ""
    return None, None, ""


def autotune_decision(sgl: Path, args) -> tuple[bool, str]:
    rel, fn, text = find_autotune_function(sgl)
    if fn is None:
        return False, "no FlashInfer autotune in this version"
    backend = getattr(args, "moe_runner_backend", None) or "auto"
    if "disable_flashinfer_autotune" in text and getattr(args, "disable_flashinfer_autotune", False):
        return False, "--disable-flashinfer-autotune"
    if "enable_deterministic_inference" in text and getattr(args, "enable_deterministic_inference", False):
        return False, "--enable-deterministic-inference"
    if backend == "flashinfer_cutedsl" and getattr(args, "moe_a2a_backend", None) == "deepep" \
            and "deepep" in text:
        return False, "cutedsl + deepep"
    allow = None
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and isinstance(node.comparators[0], (ast.List, ast.Tuple, ast.Set)) \
                and isinstance(node.left, ast.Name) and "backend" in node.left.id:
            allow = [e.value for e in node.comparators[0].elts if isinstance(e, ast.Constant)]
            break
    if allow is None:
        # 0.5.6 scheme: opt-in flag, no MoE list
        if "enable_flashinfer_autotune" in text:
            return bool(getattr(args, "enable_flashinfer_autotune", False)), "--enable-flashinfer-autotune"
        return False, "no allow-list found"
    if backend not in allow:
        return False, f"{backend!r} not in the allow-list of {rel}"
    if SIM_GPU_MAJOR < 9:
        return False, "compute capability < 9"
    return True, f"{backend!r} allowed by {rel}"



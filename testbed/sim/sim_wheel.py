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


# --------------------------------------------------------------------------------------
# Locating the installed sglang without importing it
# --------------------------------------------------------------------------------------
def find_sglang_dir() -> Path:
    try:
        spec = importlib.util.find_spec("sglang")  # does not execute sglang/__init__.py
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    for entry in sys.path:
        cand = Path(entry or ".") / "sglang"
        if (cand / "srt" / "server_args.py").is_file():
            return cand
    raise SystemExit("launch_server.py (simulator): sglang is not installed in this environment")


def read_version(sgl: Path) -> str:
    for name in ("version.py", "_version.py"):
        f = sgl / name
        if f.is_file():
            m = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                          f.read_text(), re.MULTILINE)
            if m:
                return m.group(1)
    for md in sgl.parent.glob("sglang-*.dist-info/METADATA"):
        m = re.search(r"^Version:\s*(\S+)", md.read_text(errors="replace"), re.MULTILINE)
        if m:
            return m.group(1)
    return "0.0.0"


def version_tuple(v: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", v)
    if not m:
        return (0, 0, 0, 0)
    return tuple(int(x or 0) for x in m.groups())


def flashinfer_version(sgl: Path) -> str:
    for md in sgl.parent.glob("sglang-*.dist-info/METADATA"):
        m = re.search(r"^Requires-Dist:\s*flashinfer[_-]python(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)",
                      md.read_text(errors="replace"), re.MULTILINE)
        if m:
            return m.group(1)
    return "unknown"


# --------------------------------------------------------------------------------------
# The command line parser, read statically from sglang/srt/server_args.py
# --------------------------------------------------------------------------------------
def _module_lists(tree: ast.Module) -> dict:
    """Module-level NAME = [literal, ...] (also list + list of such)."""
    out: dict = {}

    def ev(node):
        if isinstance(node, (ast.List, ast.Tuple)):
            vals = []
            for e in node.elts:
                if isinstance(e, ast.Constant):
                    vals.append(e.value)
                else:
                    raise ValueError
            return vals
        if isinstance(node, ast.Name) and node.id in out:
            return list(out[node.id])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ev(node.left) + ev(node.right)
        raise ValueError

    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                out[stmt.targets[0].id] = ev(stmt.value)
            except ValueError:
                pass
    out["__ev__"] = ev
    return out


def _class_defaults(tree: ast.Module, cls_name: str = "ServerArgs") -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    try:
                        out[st.target.id] = ast.literal_eval(st.value)
                    except Exception:
                        pass
    return out


def _class_fields(tree: ast.Module, cls_name: str = "ServerArgs") -> list:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            return [st.target.id for st in node.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)]
    return []


def _cli_aliases(tree: ast.Module) -> list:
    """`args.tp_size = args.tensor_parallel_size` lines of ServerArgs.from_cli_args."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "from_cli_args":
            for st in ast.walk(node):
                if isinstance(st, ast.Assign) and len(st.targets) == 1 \
                        and isinstance(st.targets[0], ast.Attribute) and isinstance(st.value, ast.Attribute):
                    out.append((st.targets[0].attr, st.value.attr))
    return out


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
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "prepare_server_args":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and getattr(sub.func, "attr", None) == "ArgumentParser":
                    for kw in sub.keywords:
                        if kw.arg == "prog" and isinstance(kw.value, ast.Constant):
                            return kw.value.value
    return None


def build_parser(server_args_src: str):
    """Return (parser, defaults-of-ServerArgs). Mirrors `prepare_server_args`."""
    tree = ast.parse(server_args_src)
    lists = _module_lists(tree)
    ev = lists.pop("__ev__")
    defaults = _class_defaults(tree)
    flag_actions = _nargs0_actions(tree)
    prog = _find_prog(tree)  # None -> argparse default = basename(argv[0]) = launch_server.py
    parser = argparse.ArgumentParser(prog=prog)
    parser.sim_fields = _class_fields(tree)
    # 0.5.23 builds most flags from dataclass metadata (add_cli_args_from_dataclass): not
    # modelled statically -> permissive parsing (see Sim.__init__).
    parser.sim_incomplete = "add_cli_args_from_dataclass" in server_args_src
    parser.sim_aliases = _cli_aliases(tree)

    scope = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            scope = node
            break
    seen: set = set()
    for call in ast.walk(scope or tree):
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
        elif isinstance(action, ast.Name):
            if action.id in flag_actions and "nargs" not in kw:
                spec["action"] = "store_true"
            # other custom actions (LoRAPathAction, ...): plain store with the given nargs
        if "nargs" in kw:
            try:
                spec["nargs"] = ast.literal_eval(kw["nargs"])
            except Exception:
                spec["nargs"] = "*"
        if "const" in kw and spec.get("action") in ("store_const", "append_const"):
            try:
                spec["const"] = ast.literal_eval(kw["const"])
            except Exception:
                spec["const"] = True
        if "dest" in kw and isinstance(kw["dest"], ast.Constant):
            spec["dest"] = kw["dest"].value
        flaglike = spec.get("action") in ("store_true", "store_false", "store_const", "count",
                                          "append_const", argparse.BooleanOptionalAction)
        if not flaglike:
            t = kw.get("type")
            if isinstance(t, ast.Name) and t.id in ("int", "float", "str"):
                spec["type"] = {"int": int, "float": float, "str": str}[t.id]
            if "choices" in kw:
                try:
                    spec["choices"] = ev(kw["choices"])
                except ValueError:
                    pass
                if "choices" in spec and "type" not in spec:
                    if not all(isinstance(c, str) for c in spec["choices"]):
                        spec.pop("choices")
        d = kw.get("default")
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == "ServerArgs":
            if d.attr in defaults:
                spec["default"] = defaults[d.attr]
        elif d is not None:
            try:
                spec["default"] = ast.literal_eval(d)
            except Exception:
                pass
        try:
            parser.add_argument(*opts, **spec)
        except (ValueError, TypeError, argparse.ArgumentError):
            try:
                parser.add_argument(*opts, nargs="?", const=True)
            except Exception:
                pass
    return parser, defaults


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
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return rel, node, ast.get_source_segment(src, node) or ""
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



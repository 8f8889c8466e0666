"""SGLang server simulator: stands in for `python -m sglang.launch_server` in the testbed.

Runs with the release venv's python (the real sglang wheel installed WITHOUT its heavy
dependencies); stdlib only, Python 3.11. It never imports sglang: it reads the installed
files (located with importlib.util.find_spec, which does not execute sglang/__init__.py).

    <venv>/bin/python /opt/sglang-sim/launch_server.py <argv of python -m sglang.launch_server>

What is derived from the INSTALLED wheel (so a different version behaves differently):
  * the command line parser: every `*.add_argument(...)` of `ServerArgs.add_cli_args` in
    sglang/srt/server_args.py (ast), the program name of `prepare_server_args`'s
    ArgumentParser(prog=...) (0.5.10+: "sglang serve"; before: argparse default, i.e.
    "launch_server.py"), literal defaults of the ServerArgs dataclass (host, port, ...);
  * whether FlashInfer autotune runs: the allow-list of `_should_run_flashinfer_autotune`
    (model_runner.py 0.5.7-0.5.13.post1, runner/base_runner.py 0.5.14) or
    `should_run_flashinfer_autotune` (runner/flashinfer_autotune.py 0.5.15+), evaluated with
    ast (commented-out entries do not exist for ast, exactly as for Python);
  * wording variants (autotune start line; tqdm "\r" vs "\n" from 0.5.10), the auth-exempt
    path prefixes (srt/utils/auth.py), the SIGTERM end (<= 0.5.18 SIGKILLs itself).

Config: /etc/testbed/sim.env (or $TESTBED_SIM_ENV), KEY=VALUE lines:
  SCENARIO=healthy|autotune-crash|load-hang|oom|slow-start
  TIME_SCALE=0.05       multiplies the real-ish durations below (slow-start: x5 more)
  TOKENS_PER_S=5000     simulated output throughput of one request (re-read while running)
  SLOW_WHEN=, SLOW_FACTOR=0.5  rates x SLOW_FACTOR when launched with the SLOW_WHEN arguments
  MAX_TOKENS_PER_S=0    aggregate output throughput cap of the server, 0 = none (re-read
                        while running): throughput = min(concurrency x TOKENS_PER_S, cap)
  READY_FILE=$SGLANG_CACHE_DIR/sglang-sim/ready.json   wall-clock ready moment, written atomically
                        (default under the cache dir: the unit's ProtectSystem=strict leaves it writable)
  EXIT_FILE=<beside READY_FILE>/exit.json   wall-clock moment of a crash exit (autotune-crash, oom)
  WARMUP_GATE=          optional path: warmup (health 503) lasts until this file exists
  HANG_AT_SHARD=        load-hang: shard index where progress stops (default: half)
  GPU_MEMORY_MIB=       simulated GPU memory (default: GPU_MEMORY_MIB of /etc/testbed/gpu.env, else 97887)

Observable exit statuses (documented in README.md):
  healthy/slow-start: runs until stopped; SIGTERM before the first request (incl. the
    internal warmup request, i.e. while loading) -> default action, killed by SIGTERM (-15);
    after it: drain, then <= 0.5.18 killed by SIGKILL (-9, systemd status=9/KILL), 0.5.19+ exit 0.
  autotune-crash, oom: "Scheduler hit an exception: ..." then the main process' launch-phase
    SIGQUIT handler logs "Received sigquit from a child process..." and kill_process_tree()
    SIGKILLs the main process itself -> killed by SIGKILL (-9).
  load-hang: never exits by itself.

Where the printed strings come from (paths in the 0.5.12.post1 wheel); see MESSAGES below,
each entry names its source file:
  log format "[%(asctime)s{prefix}] %(message)s", datefmt "%Y-%m-%d %H:%M:%S"  srt/utils/common.py configure_logger
  scheduler prefix " TP{tp_rank}" (only if tp_size > 1), " EP.." etc.     srt/managers/scheduler.py configure_scheduler_process
  server_args=ServerArgs(...)                                              srt/entrypoints/engine.py
  Init torch distributed begin./ends.                                      srt/model_executor/model_runner.py
  Load weight begin./end.                                                  srt/model_executor/model_runner.py load_model
  Loading safetensors checkpoint shards (tqdm, BAR_FORMAT)                 srt/model_loader/weight_utils.py, srt/utils/common.py
  KV Cache is allocated. #tokens: .., KV size: ..                          srt/mem_cache/memory_pool.py
  Not enough memory. Please try to increase --mem-fraction-static.         srt/model_executor/pool_configurator.py
  Running FlashInfer autotune with cache: / Running FlashInfer autotune... srt/model_executor/model_runner.py
  FlashInfer autotune completed.                                           srt/model_executor/model_runner.py
  Capture cuda graph begin./end.                                           srt/model_executor/model_runner.py init_device_graphs
  max_total_num_tokens=..                                                  srt/managers/scheduler.py
  Prefill batch, ...                                                       srt/observability/scheduler_metrics_mixin.py
  The server is fired up and ready to roll!                                srt/entrypoints/http_server.py
  Scheduler hit an exception:                                              srt/managers/scheduler.py run_scheduler_process
  Received sigquit from a child process. It usually means the child failed. srt/entrypoints/engine.py
  SIGTERM received. ... Draining requests and shutting down...             srt/managers/tokenizer_manager.py SignalHandler
  Gracefully exiting... Remaining number of requests ..                    srt/managers/tokenizer_manager.py sigterm_watchdog
  Health check request received during shutdown. Returning 503.           srt/entrypoints/http_server.py
  {"error": "Unauthorized"} (401)                                          srt/utils/auth.py
Not from the sglang wheel: uvicorn's own lines ("INFO:     Uvicorn running on ...", access log),
tqdm's layout, and FlashInfer's JIT failure (flashinfer/jit/cpp_ext.py run_ninja:
"RuntimeError: Ninja build failed.").
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# --------------------------------------------------------------------------------------
# Message templates. key -> (template, source in the sglang wheel or "<outside: ...>").
# Templates use str.format fields; the literal parts are exactly the real wording.
# --------------------------------------------------------------------------------------
MESSAGES: dict[str, tuple] = {
    # key: (template, source file in the wheel or "<outside: ...>", first version, last version)
    "server_args": ("server_args={server_args}", "sglang/srt/entrypoints/engine.py", None, None),
    "dist_begin": ("Init torch distributed begin.", "sglang/srt/model_executor/model_runner.py", None, None),
    "dist_end": ("Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB",
                 "sglang/srt/model_executor/model_runner.py", None, None),
    "load_begin": ("Load weight begin. avail mem={avail:.2f} GB", "sglang/srt/model_executor/model_runner.py",
                   None, None),
    "shards_desc": ("Loading safetensors checkpoint shards", "sglang/srt/model_loader/weight_utils.py", None, None),
    "bar_format": ("{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]",
                   "sglang/srt/utils/common.py", (0, 5, 9), None),
    "load_end": ("Load weight end. elapsed={elapsed:.2f} s, type={arch}, {quant}avail mem={avail:.2f} GB, "
                 "mem usage={usage:.2f} GB.", "sglang/srt/model_executor/model_runner.py", (0, 5, 12), None),
    "kv_alloc": ("KV Cache is allocated. #tokens: {tokens}, KV size: {size:.2f} GB",
                 "sglang/srt/mem_cache/memory_pool.py", None, None),
    "oom": ("Not enough memory. Please try to increase --mem-fraction-static.",
            "sglang/srt/model_executor/pool_configurator.py", (0, 5, 12), None),
    "oom_value": (" Current value: mem_fraction_static={value}", "sglang/srt/model_executor/pool_configurator.py",
                  (0, 5, 12), None),
    "autotune_begin": ("Running FlashInfer autotune...", "sglang/srt/model_executor/model_runner.py",
                       (0, 5, 6), (0, 5, 11, 99)),
    "autotune_begin_cache": ("Running FlashInfer autotune with cache: {path}",
                             "sglang/srt/model_executor/model_runner.py", (0, 5, 12), (0, 5, 13, 99)),
    "autotune_end": ("FlashInfer autotune completed.", "sglang/srt/model_executor/model_runner.py",
                     (0, 5, 6), (0, 5, 13, 99)),
    "graph_begin": ("Capture {backend} begin. This can take up to several minutes. avail mem={avail:.2f} GB",
                    "sglang/srt/model_executor/model_runner.py", None, (0, 5, 13, 99)),
    "graph_end": ("Capture {backend} end. Time elapsed: {elapsed:.2f} s. mem usage={usage:.2f} GB. "
                  "avail mem={avail:.2f} GB.", "sglang/srt/model_executor/model_runner.py", None, (0, 5, 13, 99)),
    "max_tokens": ("max_total_num_tokens={tokens}, chunked_prefill_size={chunked}, max_prefill_tokens={prefill}, "
                   "max_running_requests={running}, context_len={ctx}, {mem_label}={avail:.2f} GB",
                   "sglang/srt/managers/scheduler.py", (0, 5, 12), None),
    "prefill_batch": ("Prefill batch{iter}, #new-seq: {seqs}, #new-token: {tokens}, #cached-token: {cached}, "
                      "{usage}#running-req: {running}, #queue-req: {queue}, #pending-token: {pending}, ",
                      "sglang/srt/observability/scheduler_metrics_mixin.py", (0, 5, 12), None),
    "prefill_graph": ("{label}: {can}, ", "sglang/srt/observability/scheduler_metrics_mixin.py", (0, 5, 12), None),
    "prefill_tput": ("input throughput (token/s): {tput:.2f}", "sglang/srt/observability/scheduler_metrics_mixin.py",
                     (0, 5, 12), None),
    "ready": ("The server is fired up and ready to roll!", "sglang/srt/entrypoints/http_server.py", None, None),
    "sched_exc": ("Scheduler hit an exception: {traceback}", "sglang/srt/managers/scheduler.py", None, None),
    "sigquit": ("Received sigquit from a child process. It usually means the child failed.",
                "sglang/srt/entrypoints/engine.py", None, None),
    "sigterm": ("SIGTERM received. signum={signum} frame={frame}. Draining requests and shutting down...",
                "sglang/srt/managers/tokenizer_manager.py", None, None),
    "draining": ("Gracefully exiting... Remaining number of requests {n}. Remaining requests remaining_rids={rids}.",
                 "sglang/srt/managers/tokenizer_manager.py", None, None),
    "health_shutdown": ("Health check request received during shutdown. Returning 503.",
                        "sglang/srt/entrypoints/http_server.py", None, None),
    # outside the sglang wheel (uvicorn's default log config; flashinfer's JIT)
    "uv_started": ("INFO:     Started server process [{pid}]", "<uvicorn>", None, None),
    "uv_waiting": ("INFO:     Waiting for application startup.", "<uvicorn>", None, None),
    "uv_complete": ("INFO:     Application startup complete.", "<uvicorn>", None, None),
    "uv_running": ("INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", "<uvicorn>", None, None),
    "uv_access": ('INFO:     {client} - "{method} {path} HTTP/1.1" {status} {phrase}', "<uvicorn>", None, None),
    "init_failed": ("Initialization failed. warmup error: {traceback}", "sglang/srt/entrypoints/http_server.py",
                    None, None),
    # asyncio's create_server error, logged by uvicorn's Server.startup before sys.exit(1)
    "uv_bind_error": ("ERROR:    [Errno {errno}] error while attempting to bind on address ('{host}', {port}): "
                      "{reason}", "<uvicorn>", None, None),
    "uv_shutdown_wait": ("INFO:     Waiting for application shutdown.", "<uvicorn>", None, None),
    "ninja_failed": ("RuntimeError: Ninja build failed.", "<flashinfer/jit/cpp_ext.py run_ninja>", None, None),
}

REAL_DURATIONS = {          # seconds on a real 8-GPU host, multiplied by TIME_SCALE
    "dist_init": 6.0,
    "per_shard": 4.0,
    "kv_alloc": 3.0,
    "autotune": 120.0,
    "autotune_cached": 6.0,  # every rank finds its tactics in SGLANG_CACHE_DIR: no profiling
    "autotune_fail": 40.0,
    "graph": 60.0,
    "http_start": 2.0,
    "warmup": 3.0,
    "drain_poll": 5.0,       # sigterm_watchdog polls every 5 s
}

_out_lock = threading.Lock()


def _write(stream, text: str) -> None:
    with _out_lock:
        stream.write(text)
        stream.flush()


def log(msg: str, prefix: str = "") -> None:
    """A logging line in sglang's format: `[YYYY-mm-dd HH:MM:SS{prefix}] msg` on stderr."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    _write(sys.stderr, f"[{ts}{prefix}] {msg}\n")


def M(key: str, **kw) -> str:
    return MESSAGES[key][0].format(**kw)


def messages_for(version) -> dict:
    """The templates that apply to VERSION (a version tuple): key -> (template, source)."""
    out = {}
    for key, (tmpl, src, since, until) in MESSAGES.items():
        if (since is None or version >= since) and (until is None or version <= until):
            out[key] = (tmpl, src)
    return out


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


# --------------------------------------------------------------------------------------
# Configuration and the model directory
# --------------------------------------------------------------------------------------
def read_env_file(path: str) -> dict:
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            line = "" if line.lstrip().startswith("#") else re.sub(r"\s+#.*$", "", line).strip()
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip().strip('"').strip("'")
    except OSError:
        pass
    return out


class Config:
    def __init__(self):
        env = read_env_file(os.environ.get("TESTBED_SIM_ENV", "/etc/testbed/sim.env"))
        gpu = read_env_file(os.environ.get("TESTBED_GPU_ENV", "/etc/testbed/gpu.env"))
        self.scenario = env.get("SCENARIO", "healthy") or "healthy"
        # SCENARIO_WHEN="--flag value": the scenario hits only a server launched with those
        # arguments (a configuration that fails), any other launch is healthy.
        when = env.get("SCENARIO_WHEN", "")
        if when and f" {when} " not in " " + " ".join(sys.argv[1:]) + " ":
            self.scenario = "healthy"
        self.time_scale = float(env.get("TIME_SCALE", "0.05") or 0.05)
        if self.scenario == "slow-start":
            self.time_scale *= 5
        self.path = os.environ.get("TESTBED_SIM_ENV", "/etc/testbed/sim.env")
        self._rates_checked = 0.0
        self._rates_mtime = None
        self._apply_rates(env)
        cache = os.environ.get("SGLANG_CACHE_DIR") or os.path.expanduser("~/.cache/sglang")
        self.ready_file = env.get("READY_FILE") or os.path.join(cache, "sglang-sim", "ready.json")
        self.exit_file = env.get("EXIT_FILE") or os.path.join(os.path.dirname(self.ready_file), "exit.json")
        self.warmup_gate = env.get("WARMUP_GATE", "")
        self.hang_at = env.get("HANG_AT_SHARD", "")
        self.gpu_mib = int(env.get("GPU_MEMORY_MIB") or gpu.get("GPU_MEMORY_MIB") or 97887)

    def _apply_rates(self, env: dict) -> None:
        self.tokens_per_s = float(env.get("TOKENS_PER_S", "5000") or 5000)
        self.max_tokens_per_s = float(env.get("MAX_TOKENS_PER_S", "0") or 0)
        # SLOW_WHEN="--flag value", SLOW_FACTOR=0.5: a configuration that is slower than
        # the previous one (the benchmark gate's test); other launches keep the rates.
        when = env.get("SLOW_WHEN", "")
        if when and f" {when} " in " " + " ".join(sys.argv[1:]) + " ":
            factor = float(env.get("SLOW_FACTOR", "0.5") or 0.5)
            self.tokens_per_s *= factor
            self.max_tokens_per_s *= factor

    def refresh_rates(self) -> None:
        """TOKENS_PER_S / MAX_TOKENS_PER_S follow sim.env while running (checked at most 2x/s)."""
        now = time.monotonic()
        if now - self._rates_checked < 0.5:
            return
        self._rates_checked = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if mtime != self._rates_mtime:
            self._rates_mtime = mtime
            self._apply_rates(read_env_file(self.path))

    def sleep(self, what: str, factor: float = 1.0):
        time.sleep(REAL_DURATIONS[what] * factor * self.time_scale)


def read_model(model_path: str) -> dict:
    p = Path(model_path)
    info = {"arch": "LlamaForCausalLM", "shards": 1, "total_size": 0, "quant": "", "ctx": 4096,
            "model_type": None}
    try:
        cfg = json.loads((p / "config.json").read_text())
        info["arch"] = (cfg.get("architectures") or [info["arch"]])[0]
        info["ctx"] = int(cfg.get("max_position_embeddings") or info["ctx"])
        info["model_type"] = cfg.get("model_type")
        q = cfg.get("quantization_config") or {}
        if q:
            s = f"quant={q.get('quant_method', 'quantized')}"
            for field in ("bits", "quant_algo", "fmt"):
                if field in q:
                    s += f", {field}={q[field]}"
            info["quant"] = s + ", "
    except (OSError, ValueError):
        pass
    try:
        idx = json.loads((p / "model.safetensors.index.json").read_text())
        info["shards"] = max(1, len(set(idx.get("weight_map", {}).values())))
        info["total_size"] = int((idx.get("metadata") or {}).get("total_size") or 0)
    except (OSError, ValueError):
        info["shards"] = max(1, len(list(p.glob("*.safetensors"))))
    return info


# --------------------------------------------------------------------------------------
# tqdm line (bar_format = BAR_FORMAT of srt/utils/common.py)
# --------------------------------------------------------------------------------------
def _fmt_interval(t: float) -> str:
    mins, s = divmod(int(t), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def tqdm_line(n: int, total: int, elapsed: float) -> str:
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        rate_fmt, remaining = "?it/s", "?"
    else:
        rate_fmt = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
        remaining = _fmt_interval((total - n) / rate)
    return M("bar_format", desc=M("shards_desc"), percentage=100.0 * n / total, n_fmt=n, total_fmt=total,
             elapsed=_fmt_interval(elapsed), remaining=remaining, rate_fmt=rate_fmt)


# --------------------------------------------------------------------------------------
# The simulated server
# --------------------------------------------------------------------------------------
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "sglang", "serves", "tokens", "from", "eight", "simulated", "blackwell", "gpus", "in", "a", "small", "testbed"]


class Sim:
    def __init__(self, argv: list[str]):
        self.sgl = find_sglang_dir()
        self.version = read_version(self.sgl)
        self.vt = version_tuple(self.version)
        src = (self.sgl / "srt" / "server_args.py").read_text()
        self.parser, self.defaults = build_parser(src)
        if getattr(self.parser, "sim_incomplete", False):
            _write(sys.stderr, "sglang-sim: this version declares its flags via dataclass metadata; "
                               "accepting unknown flags without checking them\n")
            self.args, rest = self.parser.parse_known_args(argv)
            i = 0
            while i < len(rest):
                tok = rest[i]
                if tok.startswith("--"):
                    name, _, val = tok[2:].partition("=")
                    if not _ and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                        val, i = rest[i + 1], i + 1
                    elif not _:
                        val = True
                    if isinstance(val, str):
                        for conv in (int, float):
                            try:
                                val = conv(val)
                                break
                            except ValueError:
                                pass
                    setattr(self.args, name.replace("-", "_"), val)
                i += 1
        else:
            self.args = self.parser.parse_args(argv)
        for dst, src_name in getattr(self.parser, "sim_aliases", []):
            if hasattr(self.args, src_name):
                setattr(self.args, dst, getattr(self.args, src_name))
        self.cfg = Config()
        a = self.args
        self.tp = int(getattr(a, "tp_size", 1) or 1)
        self.ep = int(getattr(a, "ep_size", 1) or 1)
        self.pp = int(getattr(a, "pp_size", 1) or 1)
        self.host = getattr(a, "host", None) or self.defaults.get("host", "127.0.0.1")
        self.port = int(getattr(a, "port", None) or self.defaults.get("port", 30000))
        self.model_path = getattr(a, "model_path", None) or ""
        self.served = getattr(a, "served_model_name", None) or self.model_path
        self.api_key = getattr(a, "api_key", None)
        self.model = read_model(self.model_path)
        self.status = "starting"   # starting -> up
        self.shutting_down = False
        self.first_request_done = False
        self.inflight: dict[str, float] = {}
        self.lock = threading.Lock()
        self.counters = {"prompt": 0, "gen": 0, "requests": 0}
        self.pace_lock = threading.Lock()
        self.next_slot = 0.0   # aggregate pacing: the earliest moment the next token may leave
        self.started = time.time()
        self.exempt = self._auth_exempt_prefixes()
        self.httpd = None

    # ----- helpers
    def prefix(self, rank: int) -> str:
        p = ""
        if self.pp > 1:
            p += " PP0"
        if self.tp > 1:
            p += f" TP{rank}"
        if self.ep > 1:
            p += f" EP{rank % self.ep}"
        return p

    def all_ranks(self, key: str, **kw):
        for r in range(self.tp):
            log(M(key, **kw), self.prefix(r))

    def _auth_exempt_prefixes(self) -> tuple:
        f = self.sgl / "srt" / "utils" / "auth.py"
        if f.is_file():
            found = re.findall(r'path\.startswith\(\s*"(/[a-z_]+)"\s*\)', f.read_text())
            if found:
                return tuple(dict.fromkeys(found))
        return ("/health", "/metrics")

    def avail_gb(self) -> float:
        return self.cfg.gpu_mib / 1024.0 - 0.6

    def weight_gb(self) -> float:
        total = self.model["total_size"]
        per = total / self.tp / (1 << 30) if total else 0.0
        return per if per >= 1.0 else 55.12

    def crash(self, frames: list[tuple[str, str, str]], exc_lines: list[str]):
        """Scheduler exception path: traceback, SIGQUIT to the parent, parent SIGKILLs itself."""
        tb = ["Traceback (most recent call last):"]
        for path, func, code in frames:
            lineno = self._lineno(path, code)
            full = str(self.sgl.parent / path) if path.startswith("sglang/") else path
            tb.append(f'  File "{full}", line {lineno}, in {func}')
            tb.append(f"    {code}")
        tb.extend(exc_lines)
        for r in range(self.tp):
            log(M("sched_exc", traceback="\n".join(tb) + "\n"), self.prefix(r))
        log(M("sigquit"))
        self.write_record(self.cfg.exit_file, {"exited_at": time.time(), "how": "SIGKILL",
                                               "phase": exc_lines[-1] if exc_lines else ""})
        os.kill(os.getpid(), signal.SIGKILL)

    def _lineno(self, path: str, code: str):
        if path.startswith("sglang/"):
            try:
                for i, line in enumerate((self.sgl.parent / path).read_text().splitlines(), 1):
                    if line.strip().startswith(code):
                        return i
            except OSError:
                pass
        return int(hashlib.sha256(code.encode()).hexdigest()[:3], 16) % 900 + 30

    # ----- startup
    def run(self):
        a = self.args
        ns = vars(a)
        names = [f for f in getattr(self.parser, "sim_fields", []) if f in ns] or list(ns)
        fields = ", ".join(f"{k}={ns[k]!r}" for k in names)
        log(M("server_args", server_args=f"ServerArgs({fields})"))
        for r in range(self.tp):
            log(M("dist_begin"), self.prefix(r))
        self.cfg.sleep("dist_init")
        for r in range(self.tp):
            log(M("dist_end", elapsed=REAL_DURATIONS["dist_init"] * self.cfg.time_scale, usage=0.6),
                self.prefix(r))
        self.load_weights()
        self.alloc_kv()
        self.autotune()
        self.capture_graphs()
        log(M("max_tokens", tokens=self.kv_tokens, chunked=getattr(a, "chunked_prefill_size", None) or 8192,
              prefill=16384, running=getattr(a, "max_running_requests", None) or 2048,
              ctx=getattr(a, "context_length", None) or self.model["ctx"], mem_label="available_gpu_mem",
              avail=self.avail_after_graph),
            self.prefix(0))
        self.serve()

    def load_weights(self):
        avail = self.avail_gb()
        self.all_ranks("load_begin", avail=avail)
        n = self.model["shards"]
        tic = time.monotonic()
        cr = self.vt >= (0, 5, 10)  # from 0.5.10 tqdm updates end with "\r" only
        hang = None
        if self.cfg.scenario == "load-hang":
            hang = int(self.cfg.hang_at) if self.cfg.hang_at else n // 2

        def show(i):
            line = tqdm_line(i, n, time.monotonic() - tic)
            _write(sys.stderr, ("\r" + line) if cr else (line + "\n"))

        show(0)
        for i in range(1, n + 1):
            if hang is not None and i > hang:
                while True:  # progress stops; the process stays alive
                    time.sleep(3600)
            self.cfg.sleep("per_shard")
            show(i)
        if cr:
            _write(sys.stderr, "\n")
        elapsed = time.monotonic() - tic
        usage = self.weight_gb()
        self.avail_after_load = avail - usage
        self.all_ranks("load_end", elapsed=elapsed, arch=self.model["arch"], quant=self.model["quant"],
                       avail=self.avail_after_load, usage=usage)

    def alloc_kv(self):
        self.cfg.sleep("kv_alloc")
        if self.cfg.scenario == "oom":
            mfs = getattr(self.args, "mem_fraction_static", None)
            msg = M("oom") + M("oom_value", value=mfs if mfs is not None else 0.8)
            self.crash([
                ("sglang/srt/managers/scheduler.py", "run_scheduler_process", "scheduler = Scheduler("),
                ("sglang/srt/managers/scheduler.py", "__init__", "self.init_model_worker()"),
                ("sglang/srt/model_executor/model_runner.py", "initialize",
                 "self.init_memory_pool(pre_model_load_memory)"),
                ("sglang/srt/model_executor/pool_configurator.py", "__post_init__", "raise RuntimeError(msg)"),
            ], [f"RuntimeError: {msg}"])
        frac = getattr(self.args, "mem_fraction_static", None) or 0.8
        kv_gb = max(1.0, self.avail_after_load - self.cfg.gpu_mib / 1024.0 * (1 - frac))
        self.kv_tokens = int(kv_gb * (1 << 30) / (61 * 656 * 1))  # MLA-ish bytes per token
        self.all_ranks("kv_alloc", tokens=self.kv_tokens, size=kv_gb)
        self.avail_after_kv = self.avail_after_load - kv_gb

    def autotune_cache_path(self, rank: int) -> str:
        base = Path(os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang")
        a = self.args
        key = "|".join([str(self.model_path), "torch.bfloat16", str(getattr(a, "quantization", None)),
                        str(getattr(a, "moe_runner_backend", None)), str(self.tp), str(self.pp), "1",
                        str(getattr(a, "ep_size", 1) or 1), "PretrainedConfig"])
        d = (base / "flashinfer" / "autotune" / flashinfer_version(self.sgl) / f"sm{SIM_GPU_MAJOR}0"
             / hashlib.sha256(key.encode()).hexdigest()[:16])
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        return str(d / f"rank_tp{rank}_pp0_dp0.json")

    def autotune(self):
        run, self.autotune_reason = autotune_decision(self.sgl, self.args)
        self.autotune_ran = run
        if not run:
            return
        src_mr = (self.sgl / "srt" / "model_executor" / "model_runner.py")
        with_cache = self.vt >= (0, 5, 12) or "Running FlashInfer autotune with cache" in (
            src_mr.read_text() if src_mr.is_file() else "")
        paths = []
        for r in range(self.tp):
            if with_cache:
                paths.append(self.autotune_cache_path(r))
                log(M("autotune_begin_cache", path=paths[-1]), self.prefix(r))
            else:
                log(M("autotune_begin"), self.prefix(r))
        if self.cfg.scenario == "autotune-crash":
            self.cfg.sleep("autotune_fail")
            self.ninja_failure()
        cached = bool(paths) and all(Path(p).is_file() for p in paths)
        self.cfg.sleep("autotune_cached" if cached else "autotune")
        for p in ([] if cached else paths):  # a complete cache has nothing new to save
            try:
                Path(p).write_text("{}\n")
            except OSError:
                pass
        self.all_ranks("autotune_end")

    def ninja_failure(self):
        fi = flashinfer_version(self.sgl)
        ws = os.environ.get("FLASHINFER_WORKSPACE_BASE") or str(Path.home())
        jit = f"{ws}/.cache/flashinfer/{fi}/120a/cached_ops/fused_moe_120"
        site = str(self.sgl.parent)
        # ninja's output goes straight to the process' stdout (subprocess.run(stdout=sys.stdout))
        _write(sys.stdout,
               f"[1/12] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile --dependency-output "
               f"cutlass_fused_moe_instantiation.cuda.o.d -DTORCH_EXTENSION_NAME=fused_moe_120 "
               f"-gencode=arch=compute_120a,code=sm_120a -c {site}/flashinfer/data/csrc/fused_moe/cutlass_backend/"
               f"cutlass_fused_moe_instantiation.cu -o {jit}/cutlass_fused_moe_instantiation.cuda.o\n"
               f"FAILED: {jit}/cutlass_fused_moe_instantiation.cuda.o\n"
               f"{site}/flashinfer/data/include/flashinfer/cutlass_utils.cuh(41): error: identifier "
               f"\"cutlass::arch::Sm120\" is undefined\n"
               f"1 error detected in the compilation of \"{site}/flashinfer/data/csrc/fused_moe/cutlass_backend/"
               f"cutlass_fused_moe_instantiation.cu\".\n"
               f"ninja: build stopped: subcommand failed.\n")
        self.crash([
            ("sglang/srt/managers/scheduler.py", "run_scheduler_process", "scheduler = Scheduler("),
            ("sglang/srt/managers/scheduler.py", "__init__", "self.init_model_worker()"),
            ("sglang/srt/model_executor/model_runner.py", "initialize", "self.kernel_warmup()"),
            ("sglang/srt/model_executor/model_runner.py", "kernel_warmup", "self._flashinfer_autotune()"),
            ("sglang/srt/model_executor/model_runner.py", "_flashinfer_autotune",
             "self._dummy_run(batch_size=self.req_to_token_pool.size)"),
            (f"{site}/flashinfer/fused_moe/core.py", "get_cutlass_fused_moe_module",
             "module = gen_cutlass_fused_moe_sm120_module(use_fast_build).build_and_load()"),
            (f"{site}/flashinfer/jit/core.py", "build_and_load", "self.build(verbose, need_lock=False)"),
            (f"{site}/flashinfer/jit/core.py", "build", "run_ninja(jit_env.FLASHINFER_JIT_DIR, self.ninja_path, verbose)"),
            (f"{site}/flashinfer/jit/cpp_ext.py", "run_ninja", "raise RuntimeError(msg) from e"),
        ], [M("ninja_failed")])

    def capture_graphs(self):
        self.avail_after_graph = self.avail_after_kv
        if getattr(self.args, "disable_cuda_graph", False):
            return
        self.all_ranks("graph_begin", backend="cuda graph", avail=self.avail_after_kv)
        self.cfg.sleep("graph")
        usage = 1.27
        self.avail_after_graph = self.avail_after_kv - usage
        self.all_ranks("graph_end", backend="cuda graph", elapsed=REAL_DURATIONS["graph"] * self.cfg.time_scale, usage=usage,
                       avail=self.avail_after_graph)

    # ----- HTTP
    def serve(self):
        _write(sys.stderr, M("uv_started", pid=os.getpid()) + "\n")
        _write(sys.stderr, M("uv_waiting") + "\n")
        _write(sys.stderr, M("uv_complete") + "\n")
        handler = make_handler(self)
        ThreadingHTTPServer.daemon_threads = True
        try:
            self.httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as exc:
            self.bind_failed(exc)
        _write(sys.stderr, M("uv_running", host=self.host, port=self.port) + "\n")
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.warmup()
        while True:
            time.sleep(3600)

    def bind_failed(self, exc: OSError):
        """The port is taken (0.5.12.post1, uvicorn.run in http_server.py): uvicorn logs the bind
        error and starts its shutdown; the lifespan then joins the warmup thread, which polls
        /model_info on the port (the other process) for 120 x 1 s, logs `Initialization
        failed.` and kills the process tree (this process ends by SIGKILL)."""
        reason = (exc.strerror or str(exc)).lower()
        _write(sys.stderr, M("uv_bind_error", errno=exc.errno, host=self.host, port=self.port,
                             reason=reason) + "\n")
        _write(sys.stderr, M("uv_shutdown_wait") + "\n")
        time.sleep(120)
        log(M("init_failed", traceback=f"AssertionError: res=<Response [404]>, url=http://{self.host}:{self.port}/model_info\n"))
        os.kill(os.getpid(), signal.SIGKILL)

    def warmup(self):
        self.cfg.sleep("http_start")
        client = f"127.0.0.1:{40000 + os.getpid() % 20000}"
        self.access(client, "GET", "/model_info", 200)
        if self.cfg.warmup_gate:
            while not os.path.exists(self.cfg.warmup_gate):
                time.sleep(0.05)
        self.cfg.sleep("warmup")
        log(M("prefill_batch", iter="", seqs=1, tokens=7, cached=0, usage="token usage: 0.00, ", running=0,
              queue=0, pending=0) + M("prefill_graph", label="cuda graph", can=False) + M("prefill_tput", tput=0.0),
            self.prefix(0))
        self.request_seen()   # the warmup request starts the tokenizer manager's handle loop
        self.access(client, "POST", "/generate", 200)
        self.status = "up"
        log(M("ready"))
        self.write_ready()

    def write_ready(self):
        self.write_record(self.cfg.ready_file, {
            "ready_at": time.time(), "ready_at_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started_at": self.started, "pid": os.getpid(), "version": self.version,
            "scenario": self.cfg.scenario, "autotune": self.autotune_ran,
            "autotune_reason": self.autotune_reason, "host": self.host, "port": self.port})

    def write_record(self, file: str, data: dict):
        """Wall-clock moments for the benchmarks (same kernel clock as the controller)."""
        data.setdefault("started_at", self.started)
        data.setdefault("pid", os.getpid())
        path = Path(file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            _write(sys.stderr, f"sglang-sim: cannot write {path}: {e}\n")

    def access(self, client, method, path, status):
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        _write(sys.stdout, M("uv_access", client=client, method=method, path=path, status=status,
                             phrase=phrase) + "\n")

    def request_seen(self):
        """First request: the TokenizerManager installs its SIGTERM handler (drain)."""
        if self.first_request_done:
            return
        self.first_request_done = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self, signum=None, frame=None):
        if self.shutting_down:
            return
        self.shutting_down = True
        log(M("sigterm", signum=None, frame=None))
        threading.Thread(target=self.sigterm_watchdog, daemon=True).start()

    def sigterm_watchdog(self):
        self.cfg.sleep("drain_poll")
        while True:
            with self.lock:
                rids = list(self.inflight)
            log(M("draining", n=len(rids), rids=rids))
            if rids:
                self.cfg.sleep("drain_poll")
                continue
            break
        if self.vt <= (0, 5, 18, 99):
            os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree(include_parent=True) -> itself.kill()
        os._exit(0)

    # ----- generation
    def fake_text(self, n: int) -> list[str]:
        return [(" " if i else "") + WORDS[i % len(WORDS)] for i in range(n)]

    def token_time(self, wanted: float) -> float:
        """When a token wanted at WANTED may leave, given the aggregate cap MAX_TOKENS_PER_S.

        Tokens of all requests share one schedule spaced 1/cap apart (the simulated GPU's
        decode throughput): aggregate throughput = min(concurrency x TOKENS_PER_S, cap).
        """
        cap = self.cfg.max_tokens_per_s
        if cap <= 0:
            return wanted
        with self.pace_lock:
            slot = max(wanted, self.next_slot)
            self.next_slot = slot + 1.0 / cap
            return slot

    def generate_tokens(self, rid: str, n: int, on_token=None):
        self.cfg.refresh_rates()
        delay = 1.0 / self.cfg.tokens_per_s if self.cfg.tokens_per_s > 0 else 0.0
        toks = self.fake_text(n)
        with self.lock:
            self.inflight[rid] = time.time()
        try:
            out = []
            t0 = time.monotonic()
            for i, t in enumerate(toks):
                target = self.token_time(t0 + (i + 1) * delay)
                now = time.monotonic()
                if target > now:
                    time.sleep(target - now)
                out.append(t)
                if on_token:
                    on_token(i, t)
            return out
        finally:
            with self.lock:
                self.inflight.pop(rid, None)
                self.counters["gen"] += n
                self.counters["requests"] += 1


def _count_prompt(obj) -> int:
    if isinstance(obj, str):
        return max(1, len(obj.split()) + len(obj) // 16)
    if isinstance(obj, list):
        if obj and all(isinstance(x, int) for x in obj):
            return len(obj)
        return sum(_count_prompt(x) for x in obj) or 1
    if isinstance(obj, dict):
        return _count_prompt(obj.get("content", "")) + 4
    return 1


def make_handler(sim: Sim):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *args):  # uvicorn-style access log instead
            pass

        def log_request(self, code="-", size="-"):
            try:
                code = int(code)
            except (TypeError, ValueError):
                code = 0
            sim.access(f"{self.client_address[0]}:{self.client_address[1]}", self.command,
                       self.path, code)

        # -- plumbing
        def _send(self, status: int, body=b"", ctype="application/json", headers=None):
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(status)
            if body or status != 200 or ctype != "application/json":
                self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json_body(self):
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            if not raw:
                return {}
            return json.loads(raw)

        def _authorised(self, path: str) -> bool:
            if not sim.api_key or self.command == "OPTIONS":
                return True
            if any(path.startswith(p) for p in sim.exempt):
                return True
            h = self.headers.get("Authorization") or ""
            parts = h.split(" ", 1)
            return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == sim.api_key

        def _route(self):
            path = self.path.split("?", 1)[0]
            if not self._authorised(path):
                return self._send(401, {"error": "Unauthorized"})
            fn = ROUTES.get((self.command if self.command != "HEAD" else "GET", path))
            if fn is None:
                if any(p == path for (_, p) in ROUTES):
                    return self._send(405, {"detail": "Method Not Allowed"})
                return self._send(404, {"detail": "Not Found"})
            try:
                fn(self)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except ValueError as e:
                self._send(400, {"object": "error", "message": str(e), "type": "BadRequest", "code": 400})

        def do_GET(self):
            self._route()

        def do_POST(self):
            self._route()

        def do_HEAD(self):
            self._route()

        # -- endpoints
        def health(self):
            if sim.shutting_down:
                log(M("health_shutdown"))
                return self._send(503)
            if sim.status != "up":
                return self._send(503)
            return self._send(200)

        def ready(self):
            return self._send(200 if sim.status == "up" and not sim.shutting_down else 503)

        def models(self):
            self._send(200, {"object": "list", "data": [{
                "id": sim.served, "object": "model", "created": int(sim.started), "owned_by": "sglang",
                "root": sim.served, "max_model_len": getattr(sim.args, "context_length", None) or sim.model["ctx"]}]})

        def model_info(self):
            self._send(200, {"model_path": sim.model_path,
                             "tokenizer_path": getattr(sim.args, "tokenizer_path", None) or sim.model_path,
                             "is_generation": True, "preferred_sampling_params": None,
                             "weight_version": "default", "has_image_understanding": False,
                             "has_audio_understanding": False, "model_type": sim.model["model_type"],
                             "architectures": [sim.model["arch"]]})

        def server_info(self):
            info = {k: v for k, v in vars(sim.args).items()}
            info.update({"version": sim.version, "status": sim.status,
                         "internal_states": [{"max_total_num_tokens": getattr(sim, "kv_tokens", 0),
                                              "last_gen_throughput": sim.cfg.tokens_per_s}]})
            self._send(200, json.loads(json.dumps(info, default=str)))

        def loads(self):
            """/v1/loads (0.5.12: entrypoints/v1_loads.py): per-rank and aggregate requests; a
            stopping server still reports the requests it drains."""
            with sim.lock:
                running = len(sim.inflight)
            load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0,
                    "num_used_tokens": 0, "num_total_tokens": getattr(sim, "kv_tokens", 0)}
            self._send(200, {"timestamp": time.time(), "version": sim.version, "dp_rank_count": 1,
                             "loads": [load], "aggregate": {"total_running_reqs": running,
                                                            "total_waiting_reqs": 0,
                                                            "total_reqs": running}})

        def metrics(self):
            if not getattr(sim.args, "enable_metrics", False):
                return self._send(404, {"detail": "Not Found"})
            lbl = f'{{model_name="{sim.served}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
            with sim.lock:
                running = len(sim.inflight)
                c = dict(sim.counters)
            text = (
                "# HELP sglang:num_running_reqs The number of running requests.\n"
                "# TYPE sglang:num_running_reqs gauge\n"
                f"sglang:num_running_reqs{lbl} {float(running)}\n"
                "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
                "# TYPE sglang:num_queue_reqs gauge\n"
                f"sglang:num_queue_reqs{lbl} 0.0\n"
                "# HELP sglang:gen_throughput The generation throughput (token/s).\n"
                "# TYPE sglang:gen_throughput gauge\n"
                f"sglang:gen_throughput{lbl} {float(sim.cfg.tokens_per_s if running else 0)}\n"
                "# HELP sglang:token_usage The token usage.\n"
                "# TYPE sglang:token_usage gauge\n"
                f"sglang:token_usage{lbl} 0.0\n"
                "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
                "# TYPE sglang:prompt_tokens_total counter\n"
                f"sglang:prompt_tokens_total{lbl} {float(c['prompt'])}\n"
                "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
                "# TYPE sglang:generation_tokens_total counter\n"
                f"sglang:generation_tokens_total{lbl} {float(c['gen'])}\n"
                "# HELP sglang:num_requests_total Number of requests processed.\n"
                "# TYPE sglang:num_requests_total counter\n"
                f"sglang:num_requests_total{lbl} {float(c['requests'])}\n")
            self._send(200, text, ctype="text/plain; version=0.0.4; charset=utf-8")

        def _sse_start(self):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True

        def _sse(self, obj):
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def generate(self):
            body = self._json_body()
            sp = body.get("sampling_params") or {}
            n = int(sp.get("max_new_tokens", 128) if sp.get("max_new_tokens") is not None else 128)
            prompt = body.get("text", body.get("input_ids", ""))
            ptoks = _count_prompt(prompt)
            rid = body.get("rid") or uuid.uuid4().hex
            sim.counters["prompt"] += ptoks
            tic = time.time()

            def meta(k, done):
                return {"id": rid, "finish_reason": ({"type": "length", "length": k} if done else None),
                        "prompt_tokens": ptoks, "weight_version": "default", "completion_tokens": k,
                        "cached_tokens": 0, "e2e_latency": time.time() - tic}

            if body.get("stream"):
                self._sse_start()
                acc = []

                def on_tok(i, t):
                    acc.append(t)
                    self._sse({"text": "".join(acc), "output_ids": list(range(i + 1)),
                               "meta_info": meta(i + 1, i + 1 == n)})
                sim.generate_tokens(rid, n, on_tok)
                self._sse("[DONE]")
                return
            toks = sim.generate_tokens(rid, n)
            self._send(200, {"text": "".join(toks), "output_ids": list(range(len(toks))),
                             "meta_info": meta(len(toks), True)})

        def _openai(self, chat: bool):
            body = self._json_body()
            n = body.get("max_completion_tokens") or body.get("max_tokens") or 128
            n = int(n)
            ptoks = _count_prompt(body.get("messages") if chat else body.get("prompt", ""))
            sim.counters["prompt"] += ptoks
            rid = uuid.uuid4().hex
            created = int(time.time())
            model = body.get("model") or sim.served
            obj = "chat.completion" if chat else "text_completion"
            usage = {"prompt_tokens": ptoks, "total_tokens": ptoks + n, "completion_tokens": n,
                     "prompt_tokens_details": None, "reasoning_tokens": 0}
            if body.get("stream"):
                self._sse_start()
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

                def chunk(delta_text, finish=None, first=False):
                    if chat:
                        delta = {"role": "assistant", "content": delta_text} if first else {"content": delta_text}
                        if finish:
                            delta = {}
                        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                    else:
                        choice = {"index": 0, "text": delta_text, "logprobs": None, "finish_reason": finish}
                    return {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                            "model": model, "choices": [choice], "usage": None}

                if chat:
                    self._sse(chunk("", first=True))
                sim.generate_tokens(rid, n, lambda i, t: self._sse(chunk(t)))
                self._sse(chunk("", finish="length"))
                if include_usage:
                    self._sse({"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                               "model": model, "choices": [], "usage": usage})
                self._sse("[DONE]")
                return
            text = "".join(sim.generate_tokens(rid, n))
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                                  "tool_calls": None}, "logprobs": None,
                          "finish_reason": "length", "matched_stop": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                          "matched_stop": None}
            self._send(200, {"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [choice], "usage": usage})

        def chat(self):
            self._openai(True)

        def completions(self):
            self._openai(False)

    ROUTES = {
        ("GET", "/health"): Handler.health, ("GET", "/health_generate"): Handler.health,
        ("GET", "/v1/models"): Handler.models,
        ("GET", "/model_info"): Handler.model_info, ("GET", "/get_model_info"): Handler.model_info,
        ("GET", "/server_info"): Handler.server_info, ("GET", "/get_server_info"): Handler.server_info,
        ("GET", "/metrics"): Handler.metrics, ("GET", "/v1/loads"): Handler.loads,
        ("POST", "/generate"): Handler.generate, ("GET", "/generate"): Handler.generate,
        ("POST", "/v1/chat/completions"): Handler.chat,
        ("POST", "/v1/completions"): Handler.completions,
    }
    if sim.vt >= (0, 5, 20):
        ROUTES[("GET", "/ready")] = Handler.ready
    return Handler


def main(argv=None):
    sim = Sim(sys.argv[1:] if argv is None else argv)
    sim.run()


if __name__ == "__main__":
    main()

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

Config: /etc/testbed/sim.env (or $TESTBED_SIM_ENV), its keys listed in sim_config.py.

Observable exit statuses (documented in README.md):
  healthy/slow-start: runs until stopped; SIGTERM before the first request (incl. the
    internal warmup request, i.e. while loading) -> default action, killed by SIGTERM (-15);
    after it: drain, then <= 0.5.18 killed by SIGKILL (-9, systemd status=9/KILL), 0.5.19+ exit 0.
  autotune-crash, oom: "Scheduler hit an exception: ..." then the main process' launch-phase
    SIGQUIT handler logs "Received sigquit from a child process..." and kill_process_tree()
    SIGKILLs the main process itself -> killed by SIGKILL (-9).
  load-hang: never exits by itself.

Where the printed strings come from: MESSAGES (sim_log.py) names the source file of each
template in the 0.5.12.post1 wheel, or marks it as uvicorn's or FlashInfer's. Besides those:
  log format "[%(asctime)s{prefix}] %(message)s", datefmt "%Y-%m-%d %H:%M:%S"  srt/utils/common.py configure_logger
  scheduler prefix " TP{tp_rank}" (only if tp_size > 1), " EP.." etc.     srt/managers/scheduler.py configure_scheduler_process
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import random
import re
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path

if not __package__:  # run as /opt/sglang-sim/launch_server.py on a host (or by path, the tests):
    # the files beside it become the package sglang_sim, so the one import block below
    # serves both this and the unit tests' testbed.sim.launch_server
    _spec = importlib.machinery.ModuleSpec("sglang_sim", None, is_package=True)
    _spec.submodule_search_locations.append(os.path.dirname(os.path.abspath(__file__)))
    sys.modules["sglang_sim"] = importlib.util.module_from_spec(_spec)
    __package__ = "sglang_sim"

from . import sim_faults, sim_group, sim_http
from .model import WORDS
from .sim_config import REAL_DURATIONS, Config, read_model
from .sim_http import make_handler
from .sim_log import (
    PYNVML_WARNING,
    M,
    _write,
    dynamo_warning,
    interleave,
    log,
    messages_for,
    nccl_lines,
    tqdm_default,
    tqdm_line,
)
from .sim_wheel import (
    SIM_GPU_MAJOR,
    autotune_decision,
    build_parser,
    find_sglang_dir,
    flashinfer_version,
    parse_server_args,
    read_version,
    version_tuple,
)

# the tests reach the simulator's parts through this module
__all__ = ["WORDS", "Config", "Sim", "autotune_decision", "build_parser", "find_sglang_dir",
           "main", "messages_for", "read_version", "version_tuple"]


class Sim:
    def __init__(self, argv: list[str]):
        self.sgl = find_sglang_dir()
        self.version = read_version(self.sgl)
        self.vt = version_tuple(self.version)
        src = (self.sgl / "srt" / "server_args.py").read_text()
        self.parser, self.defaults = build_parser(src)
        self.args = parse_server_args(self.parser, argv)
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
        # a multi-node group (--nnodes N --node-rank R --dist-init-addr HOST:PORT): this node
        # runs the TP ranks R*G .. R*G+G-1 (sim_multinode.py, sim_group.py)
        self.argv = list(argv)
        self.nnodes = int(getattr(a, "nnodes", 1) or 1)
        self.node_rank = int(getattr(a, "node_rank", 0) or 0)
        self.local = sim_group.local_ranks(self)
        self.group = None        # sim_group.Group once the rendezvous is done
        self.peer_lost = None    # node 0: when a node's process ended (monotonic)
        self.peer_lost_at = 0.0  # ... and in wall-clock time
        self.status = "starting"   # starting -> up
        self.shutting_down = False
        self.inflight: dict[str, float] = {}
        self.lock = threading.Lock()
        self.counters = {"prompt": 0, "gen": 0, "requests": 0}
        self.served_reqs = 0     # generations asked of this process after ready (leak)
        # latency histograms of /metrics: name -> [count per bucket of sim_http.BUCKETS, sum]
        self.latency = {"time_to_first_token_seconds": [[0] * len(sim_http.BUCKETS), 0.0],
                        "e2e_request_latency_seconds": [[0] * len(sim_http.BUCKETS), 0.0]}
        self.pace_lock = threading.Lock()
        self.next_slot = 0.0   # aggregate pacing: the earliest moment the next token may leave
        self.started = time.time()
        self.exempt = self._auth_exempt_prefixes()
        # the ranks' lines interleave in an order drawn from LOG_SEED (sim.env)
        self.rng = random.Random(self.cfg.log_seed)
        # 0.5.x sets uvicorn's formats to "[%(asctime)s] %(levelprefix)s %(message)s"
        # (utils/common.py set_uvicorn_logging_configs); older ones keep uvicorn's own
        common = self.sgl / "srt" / "utils" / "common.py"
        self.uv_stamped = common.is_file() and "def set_uvicorn_logging_configs" in \
            common.read_text()
        self.site = str(self.sgl.parent)

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
        for r in self.rng.sample(self.local, len(self.local)):
            log(M(key, **kw), self.prefix(r))

    def uv(self, text: str, stream=None) -> None:
        """A uvicorn line (error log on stderr, access log on stdout) with sglang's format."""
        stamp = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] " if self.uv_stamped else ""
        _write(stream or sys.stderr, stamp + text + "\n")

    def _auth_exempt_prefixes(self) -> tuple:
        f = self.sgl / "srt" / "utils" / "auth.py"
        text = f.read_text() if f.is_file() else ""
        found = re.findall(r'path\.startswith\(\s*"(/[a-z_]+)"\s*\)', text)
        return tuple(dict.fromkeys(found)) or ("/health", "/metrics")

    def weight_gb(self) -> float:
        total = self.model["total_size"]
        per = total / self.tp / (1 << 30) if total else 0.0
        return per if per >= 1.0 else 55.12

    def crash(self, frames: list[tuple[str, str, str]], exc_lines: list[str], ranks=None):
        """Scheduler exception path: traceback (on RANKS, default all), SIGQUIT to the parent,
        parent SIGKILLs itself."""
        tb = ["Traceback (most recent call last):"]
        for path, func, code in frames:
            lineno = self._lineno(path, code)
            full = f"{self.site}/{path}" if path.startswith("sglang/") else path
            tb.append(f'  File "{full}", line {lineno}, in {func}')
            tb.append(f"    {code}")
        tb.extend(exc_lines)
        for r in (self.rng.sample(self.local, len(self.local)) if ranks is None else ranks):
            log(M("sched_exc", traceback="\n".join(tb) + "\n"), self.prefix(r))
        log(M("sigquit"))
        self.die(exc_lines[-1])

    def die(self, phase: str):
        """kill_process_tree(): the process SIGKILLs itself, its moment in EXIT_FILE."""
        self.write_record(self.cfg.exit_file, {"exited_at": time.time(), "how": "SIGKILL",
                                               "phase": phase, "started_at": self.started,
                                               "pid": os.getpid()})
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
        names = [f for f in self.parser.sim_fields if f in ns] or list(ns)
        fields = ", ".join(f"{k}={ns[k]!r}" for k in names)
        _write(sys.stderr, PYNVML_WARNING.format(site=self.site) + "\n")
        log(M("server_args", server_args=f"ServerArgs({fields})"))
        # each rank process imports torch (pynvml's warning), then inits torch.distributed
        interleave([[(None, PYNVML_WARNING.format(site=self.site)), (self.prefix(r), M("dist_begin"))]
                    for r in self.local], self.rng)
        self.cfg.sleep("dist_init")
        if self.nnodes > 1:
            self.group = sim_group.rendezvous(self)
        if self.tp > 1:
            host = os.uname().nodename
            interleave([nccl_lines(host, os.getpid() + 1, r, self.host) for r in self.local],
                       self.rng)
        self.all_ranks("dist_end", elapsed=REAL_DURATIONS["dist_init"] * self.cfg.time_scale,
                       usage=0.6)
        self.load_weights()
        self.alloc_kv()
        self.autotune()
        self.capture_graphs()
        if self.group:
            self.group.captured(self)
        if self.node_rank >= 1:  # engine.py: node_rank >= 1 serves only the dummy health server
            sim_group.serve_dummy_health(self)
        log(M("max_tokens", tokens=self.kv_tokens, chunked=getattr(a, "chunked_prefill_size", None) or 8192,
              prefill=16384, running=getattr(a, "max_running_requests", None) or 2048,
              ctx=getattr(a, "context_length", None) or self.model["ctx"], mem_label="available_gpu_mem",
              avail=self.avail_after_graph),
            self.prefix(0))
        self.serve()

    def load_weights(self):
        avail = self.cfg.gpu_mib / 1024.0 - 0.6
        self.all_ranks("load_begin", avail=avail)
        n = self.model["shards"]
        tic = time.monotonic()
        cr = self.vt >= (0, 5, 10)  # from 0.5.10 tqdm updates end with "\r" only
        hang = n
        if self.cfg.scenario == "load-hang":
            hang = int(self.cfg.hang_at) if self.cfg.hang_at else n // 2
        files = self.model.get("shard_files") or []
        self.loaded_bytes, self.load_read_s = 0, 0.0
        for i in range(n + 1):
            if i:
                while i > hang:  # progress stops; the process stays alive
                    time.sleep(3600)
                if i <= len(files):  # the shard's bytes, from the page cache or the disk
                    self.loaded_bytes += self.map_shard(Path(self.model_path) / files[i - 1])
                self.cfg.sleep("per_shard")
            if self.node_rank:  # the bar is torch rank 0's (weight_utils enable_tqdm)
                continue
            line = tqdm_line(i, n, time.monotonic() - tic)
            _write(sys.stderr, ("\r" + line) if cr else (line + "\n"))
        if cr and not self.node_rank:
            _write(sys.stderr, "\n")
        elapsed = time.monotonic() - tic
        usage = self.weight_gb()
        self.avail_after_load = avail - usage
        if self.cfg.scenario == "rank-fail":
            sim_faults.one_rank_fails_loading(self)
        self.all_ranks("load_end", elapsed=elapsed, arch=self.model["arch"], quant=self.model["quant"],
                       avail=self.avail_after_load, usage=usage)

    def map_shard(self, path: Path) -> int:
        """Map the shard read-only and touch every page of it, as safetensors' ``safe_open``
        and the copy to the GPU do: a page in the page cache costs a memory read, any other
        one a read from the disk. Returns its size (0: no such file)."""
        import mmap

        tic = time.monotonic()
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size:
                    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                        _ = m[::mmap.PAGESIZE]  # a byte of every page: each one faulted in
        except OSError:
            return 0
        self.load_read_s += time.monotonic() - tic
        return size

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
        self.avail_after_kv = self.avail_after_load - kv_gb
        interleave([[(self.prefix(r), M("kv_alloc", tokens=self.kv_tokens, size=kv_gb)),
                     (self.prefix(r), M("pool_end", avail=self.avail_after_kv))]
                    for r in self.local], self.rng)

    def config_class(self) -> str:
        """``hf_config.__class__.__name__``: transformers' class for the model type
        (``glm_moe_dsa`` -> ``GlmMoeDsaConfig``), ``PretrainedConfig`` without one."""
        mt = self.model.get("model_type")
        if not mt:
            return "PretrainedConfig"
        return "".join(p[:1].upper() + p[1:] for p in mt.replace("-", "_").split("_") if p) + "Config"

    def autotune_cache_path(self, rank: int) -> str:
        base = Path(os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang")
        a = self.args
        key = "|".join([str(self.model_path), "torch.bfloat16", str(getattr(a, "quantization", None)),
                        str(getattr(a, "moe_runner_backend", None)), str(self.tp), str(self.pp), "1",
                        str(getattr(a, "ep_size", 1) or 1), self.config_class()])
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
        paths = [self.autotune_cache_path(r) for r in self.local] if with_cache else []
        for i, r in enumerate(self.local):
            log(M("autotune_begin_cache", path=paths[i]) if paths else M("autotune_begin"),
                self.prefix(r))
        if self.cfg.scenario == "autotune-crash":
            self.cfg.sleep("autotune_fail")
            sim_faults.ninja_failure(self)
        if paths and all(Path(p).is_file() for p in paths):
            self.cfg.sleep("autotune_cached")  # a complete cache: nothing to profile or save
        else:
            # FlashInfer's AutoTuner shows one tqdm bar per tuned op (rank 0's stderr)
            for op in ("trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"):
                if self.node_rank:
                    self.cfg.sleep("autotune", 0.5)
                    continue
                self.bar([M("autotuner_bar", op=op)] * 14, "autotune", unit="profile", factor=0.5)
            for p in paths:
                try:
                    Path(p).write_text("{}\n")
                except OSError:
                    pass
        self.all_ranks("autotune_end")

    def capture_graphs(self):
        self.avail_after_graph = self.avail_after_kv
        if getattr(self.args, "disable_cuda_graph", False):
            return
        self.all_ranks("graph_begin", backend="cuda graph", avail=self.avail_after_kv)
        max_bs = int(getattr(self.args, "cuda_graph_max_bs", None) or 256)
        all_bs = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 513, 16)]
        bss = [b for b in all_bs if b <= max_bs]
        if self.node_rank:  # capture_bs and the bar are TP rank 0's (node 0)
            fail = self.cfg.scenario == "node-capture-crash"
            self.cfg.sleep("graph", 1 / 3 if fail else 1.0)
            if fail:
                sim_group.node_capture_crash(self)
        else:
            log(M("capture_bs", bs=bss), self.prefix(0))
        # cuda_graph_runner.capture: tqdm over the batch sizes (largest first) on rank 0
        sizes = list(reversed(bss))
        fail_at = len(sizes) // 3 if self.cfg.scenario == "capture-oom" else None
        if not self.node_rank:
            self.bar([M("capturing", bs=b, avail=self.avail_after_kv - 0.02 * i)
                      for i, b in enumerate(sizes)], "graph", stop_at=fail_at)
        if fail_at is not None:
            sim_faults.capture_oom(self)
        if self.tp > 1:
            _write(sys.stderr, dynamo_warning(os.getpid()) + "\n")
        usage = 1.27
        self.avail_after_graph = self.avail_after_kv - usage
        self.all_ranks("graph_end", backend="cuda graph",
                       elapsed=REAL_DURATIONS["graph"] * self.cfg.time_scale, usage=usage,
                       avail=self.avail_after_graph)

    def bar(self, descs: list[str], what: str, unit: str = "it", stop_at=None, factor=1.0):
        """A tqdm bar in its default layout on stderr, one step per description in DESCS,
        updated with "\r" as tqdm does, spending REAL_DURATIONS[what] x FACTOR over its
        steps; STOP_AT: stop there (a crash)."""
        tic = time.monotonic()
        total = len(descs)
        step = REAL_DURATIONS[what] * factor * self.cfg.time_scale / max(total, 1)
        for i in range(total + 1):
            desc = descs[min(i, total - 1)]
            _write(sys.stderr, "\r" + tqdm_default(desc, i, total, time.monotonic() - tic, unit))
            if stop_at is not None and i >= stop_at:
                _write(sys.stderr, "\n")
                return
            if i < total:
                time.sleep(step)
        _write(sys.stderr, "\n")

    # ----- HTTP
    def serve(self):
        self.uv(M("uv_started", pid=os.getpid()))
        self.uv(M("uv_waiting"))
        self.uv(M("uv_complete"))
        handler = make_handler(self)
        ThreadingHTTPServer.daemon_threads = True
        try:
            httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as exc:
            self.bind_failed(exc)
        self.uv(M("uv_running", host=self.host, port=self.port))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.warmup()
        while True:
            time.sleep(3600)

    def bind_failed(self, exc: OSError):
        """The port is taken (0.5.12.post1, uvicorn.run in http_server.py): uvicorn logs the bind
        error and starts its shutdown; the lifespan then joins the warmup thread, which polls
        /model_info on the port (the other process) for 120 x 1 s, logs `Initialization
        failed.` and kills the process tree (this process ends by SIGKILL)."""
        reason = (exc.strerror or str(exc)).lower()
        self.uv(M("uv_bind_error", errno=exc.errno, host=self.host, port=self.port, reason=reason))
        self.uv(M("uv_shutdown_wait"))
        time.sleep(120)
        log(M("init_failed", traceback=f"AssertionError: res=<Response [404]>, url=http://{self.host}:{self.port}/model_info\n"))
        os.kill(os.getpid(), signal.SIGKILL)

    def warmup(self):
        self.cfg.sleep("http_start")
        if self.cfg.scenario == "warmup-502":
            sim_faults.warmup_502(self)
        client = f"127.0.0.1:{40000 + os.getpid() % 20000}"
        self.access(client, "GET", "/model_info", 200)
        if self.cfg.warmup_gate:
            while not os.path.exists(self.cfg.warmup_gate):
                time.sleep(0.05)
        self.cfg.sleep("warmup")
        log(M("prefill_batch", iter="", seqs=1, tokens=7, cached=0, usage="token usage: 0.00, ", running=0,
              queue=0, pending=0) + M("prefill_graph", label="cuda graph", can=False) + M("prefill_tput", tput=0.0),
            self.prefix(0))
        # the first request (this warmup) makes the TokenizerManager install its SIGTERM
        # handler (drain)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        self.access(client, "POST", "/generate", 200)
        self.status = "up"
        log(M("ready"))
        if self.group:
            self.group.ready(self)
        self.write_record(self.cfg.ready_file, {
            "ready_at": time.time(), "ready_at_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started_at": self.started, "pid": os.getpid(), "version": self.version,
            "scenario": self.cfg.scenario, "autotune": self.autotune_ran,
            "autotune_reason": self.autotune_reason, "host": self.host, "port": self.port,
            # the weights' pages read (mapped and touched) and how long that took
            "loaded_bytes": getattr(self, "loaded_bytes", 0),
            "load_read_s": round(getattr(self, "load_read_s", 0.0), 4)})

    def write_record(self, file: str, data: dict):
        """Wall-clock moments for the benchmarks (same kernel clock as the controller)."""
        path = Path(file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            _write(sys.stderr, f"sglang-sim: cannot write {path}: {e}\n")

    def access(self, client, method, path, status: int):
        self.uv(M("uv_access", client=client, method=method, path=path, status=status,
                  phrase=HTTPStatus(status).phrase), sys.stdout)

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
            if not rids:
                break
            self.cfg.sleep("drain_poll")
        if self.vt <= (0, 5, 18, 99):
            os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree(include_parent=True) -> itself.kill()
        os._exit(0)

    # ----- generation
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
        if self.status == "up" and self.cfg.scenario in sim_faults.AFTER_READY:
            sim_faults.after_ready_request(self)
        while self.peer_lost is not None:  # a node is gone: the collectives never complete
            time.sleep(3600)
        self.cfg.refresh_rates()
        serving = self.cfg.serving_scenario() if self.status == "up" else "healthy"
        rate = self.cfg.tokens_per_s * (0.1 if serving == "slow-progress" else 1.0)
        delay = 1.0 / rate if rate > 0 else 0.0
        with self.lock:
            self.served_reqs += 1
            nth = self.served_reqs
        toks = [(" " if i else "") + WORDS[i % len(WORDS)] for i in range(n)]
        with self.lock:
            self.inflight[rid] = time.time()
        try:
            sim_faults.serving_hang(self, serving, nth)
            if serving == "slow-progress":
                time.sleep(self.cfg.progress_delay_s)
            out = []
            t0 = time.monotonic()
            first = None
            for i, t in enumerate(toks):
                if i and serving != "wedge":
                    # a wedge set while this request generates strikes it too (a real engine's
                    # wedge stops every request it holds, not only the next ones)
                    self.cfg.refresh_rates()
                    if self.cfg.serving_scenario() == "wedge":
                        sim_faults.serving_hang(self, "wedge", nth)
                target = self.token_time(t0 + (i + 1) * delay)
                now = time.monotonic()
                if target > now:
                    time.sleep(target - now)
                out.append(t)
                first = first if first is not None else time.monotonic() - t0
                if on_token:
                    on_token(i, t)
            return out
        finally:
            with self.lock:
                self.inflight.pop(rid, None)
                self.counters["gen"] += n
                self.counters["requests"] += 1
                end = time.monotonic() - t0
                for name, v in (("time_to_first_token_seconds", end if first is None else first),
                                ("e2e_request_latency_seconds", end)):
                    sim_http.observe(self.latency[name], v)


def main():
    Sim(sys.argv[1:]).run()


if __name__ == "__main__":
    main()

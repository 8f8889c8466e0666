"""The simulator's output: sglang's real message templates (MESSAGES, each with its source in
the wheel), its log prefix, tqdm bars, the ranks' interleaving and the noise a real 8-GPU
server prints beside sglang's own lines (NCCL, pynvml, torch dynamo)."""

from __future__ import annotations

import random
import sys
import threading
import time

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
    "health_failed": ("Health check failed. Server couldn't get a response from detokenizer for last "
                      "{timeout} seconds. tic start time: {tic}. last_heartbeat time: {last}",
                      "sglang/srt/entrypoints/http_server.py", None, None),
    "dummy_health": ("Dummy health check server started in background thread at {addr}",
                     "sglang/srt/utils/common.py", None, None),
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
    "pool_end": ("Memory pool end. avail mem={avail:.2f} GB",
                 "sglang/srt/model_executor/model_runner_kv_cache_mixin.py", None, None),
    "capture_bs": ("Capture cuda graph bs {bs}", "sglang/srt/model_executor/cuda_graph_runner.py",
                   None, None),
    "capturing": ("Capturing batches (bs={bs} avail_mem={avail:.2f} GB)",
                  "sglang/srt/model_executor/cuda_graph_runner.py", None, None),
    "capture_failed": ("Capture cuda graph failed: {error}\n{msg}",
                       "sglang/srt/model_executor/cuda_graph_runner.py", None, None),
    "autotuner_bar": ("[AutoTuner]: Tuning {op}", "<flashinfer/autotuner.py>", None, None),
    "ninja_failed": ("RuntimeError: Ninja build failed.", "<flashinfer/jit/cpp_ext.py run_ninja>", None, None),
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
# tqdm line (bar_format = BAR_FORMAT of srt/utils/common.py)
# --------------------------------------------------------------------------------------
def _fmt_interval(t: float) -> str:
    mins, s = divmod(int(t), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _rate(n: int, total: int, elapsed: float, unit: str = "it") -> tuple[str, str]:
    """tqdm's rate and remaining time ("?" before the first step)."""
    if not (n and elapsed > 0):
        return f"?{unit}/s", "?"
    rate = n / elapsed
    rate_fmt = f"{rate:5.2f}{unit}/s" if rate >= 1 else f"{1 / rate:5.2f}s/{unit}"
    return rate_fmt, _fmt_interval((total - n) / rate)


def tqdm_line(n: int, total: int, elapsed: float) -> str:
    rate_fmt, remaining = _rate(n, total, elapsed)
    return M("bar_format", desc=M("shards_desc"), percentage=100.0 * n / total, n_fmt=n, total_fmt=total,
             elapsed=_fmt_interval(elapsed), remaining=remaining, rate_fmt=rate_fmt)


# --------------------------------------------------------------------------------------
# Ranks and noise. Each rank is a process: their lines reach the journal in an order no
# one chooses; the simulator draws it from a seeded generator (LOG_SEED in sim.env).
# --------------------------------------------------------------------------------------
#: tqdm's default layout ({l_bar}{bar}{r_bar}, 10-wide bar when the width is unknown)
TQDM_DEFAULT = "{desc}: {pct:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]"
# printed by NCCL itself (stdout of each rank process): "host:pid:tid [cudaDev] NCCL INFO ..."
NCCL_INIT = ("NCCL INFO Bootstrap : Using eth0:{addr}<0>",
             "NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
             "NCCL INFO cudaDriverVersion 13000",
             "transport/net_ib.cc:526 NCCL WARN Could not find real path of mlx5_0 "
             "(/sys/class/infiniband/mlx5_0/device)",
             "NCCL INFO NET/Socket : Using [0]eth0:{addr}<0>",
             "NCCL INFO Using network Socket",
             "NCCL INFO Connected all trees",
             "NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
             "NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, "
             "1 p2p channels per peer")
# torch/cuda/__init__.py imports pynvml (the deprecated shim) in every process
PYNVML_WARNING = ("{site}/torch/cuda/__init__.py:61: FutureWarning: The pynvml package is "
                  "deprecated. Please install nvidia-ml-py instead. If you did not install pynvml "
                  "directly, please report this to the maintainers of the package that installed "
                  "pynvml for you.\n  import pynvml  # type: ignore[import]")
# torch's glog-style warning of dynamo (torch/_dynamo/convert_frame.py)
DYNAMO_WARNING = ("W{mmdd} {hms}.{usec:06d} {tid} torch/_dynamo/convert_frame.py:762] [0/8] "
                  "torch._dynamo hit config.cache_size_limit (8)")


def tqdm_default(desc: str, n: int, total: int, elapsed: float, unit: str = "it") -> str:
    """One update of a tqdm bar in its default layout."""
    filled = int(10 * n / total) if total else 0
    bar = "█" * filled + " " * (10 - filled)
    rate_s, remaining = _rate(n, total, elapsed, unit)
    return TQDM_DEFAULT.format(desc=desc, pct=100.0 * n / total if total else 0, bar=bar, n=n,
                               total=total, elapsed=_fmt_interval(elapsed),
                               remaining=remaining, rate=rate_s)


def interleave(per_rank: list[list[tuple[str, str]]], rng: random.Random) -> None:
    """Print the ranks' lines (``(prefix, message)``; prefix None: printed raw on stdout)
    merged in a random order that keeps each rank's own order."""
    queues = [list(q) for q in per_rank if q]
    while queues:
        q = rng.choice(queues)
        prefix, msg = q.pop(0)
        if prefix is None:
            _write(sys.stdout, msg + "\n")
        else:
            log(msg, prefix)
        if not q:
            queues.remove(q)


def nccl_lines(host: str, pid: int, rank: int, addr: str) -> list[tuple[None, str]]:
    head = f"{host}:{pid + rank}:{pid + rank} [{rank}] "
    return [(None, head + x.format(addr=addr)) for x in NCCL_INIT]


def dynamo_warning(pid: int) -> str:
    now = time.time()
    return DYNAMO_WARNING.format(mmdd=time.strftime("%m%d"), hms=time.strftime("%H:%M:%S"),
                                 usec=int((now % 1) * 1e6), tid=pid)

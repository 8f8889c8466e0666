"""The simulator's failure scenarios (SCENARIO= in sim.env), each printing what a real server
prints when it fails that way (sglang 0.5.12.post1 wording; torch's and FlashInfer's own
messages where they speak):

  autotune-crash  FlashInfer's JIT build (ninja) fails in the autotune: every rank's
                  `Scheduler hit an exception`, then the SIGQUIT teardown
  capture-oom     `Capture cuda graph failed: CUDA out of memory` during graph capture
  rank-fail       one rank (TP5, or the last) runs out of memory loading its weights while
                  the others finish loading
  warmup-502      the warmup request gets 502 from an HTTP proxy: after 120 tries,
                  `Initialization failed. warmup error: ...` and the process tree is killed
  nccl-watchdog   after ready: the first API request hangs in an all-reduce until torch's
                  NCCL watchdog aborts the scheduler (`Watchdog caught collective operation
                  timeout`, `terminate called ...`), then the teardown
  scheduler-exception  after ready: the first API request raises in the scheduler's event
                  loop (`Scheduler hit an exception`), then the SIGQUIT teardown
The after-ready ones strike on the first request after the ready line: the verifier's own
generation check, so the failure lands while the verifier is still checking.

Serving scenarios (SERVING; re-read from sim.env while the server runs, see sim_config.py),
for the watchdog: HTTP and /health stay up, what the server DOES goes wrong:
  wedge           every generation of the running process hangs (SGLang#22779, vLLM#46811)
  leak            generations hang after LEAK_AFTER requests of each process
  slow-progress   requests wait and decode slowly, but finish
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .sim_log import M, _write, log
from .sim_wheel import flashinfer_version

AFTER_READY = ("nccl-watchdog", "scheduler-exception")
SERVING = ("wedge", "leak", "slow-progress")
SCHED = "sglang/srt/managers/scheduler.py"
MR = "sglang/srt/model_executor/model_runner.py"
_INIT = [(SCHED, "run_scheduler_process", "scheduler = Scheduler("),
         (SCHED, "__init__", "self.init_model_worker()"),
         (SCHED, "init_model_worker", "self.init_tp_model_worker()"),
         ("sglang/srt/managers/tp_worker.py", "_init_model_runner", "self._model_runner = ModelRunner("),
         (MR, "__init__", "self.initialize(pre_model_load_memory)")]


def _oom(gib: float, gpu: int, total_gib: float) -> str:
    """torch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp)."""
    return (f"CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU {gpu} has a total capacity "
            f"of {total_gib:.2f} GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
            f"process has {total_gib - 1.1:.2f} GiB memory in use. Of the allocated memory "
            f"{total_gib - 6.2:.2f} GiB is allocated by PyTorch, and 1.35 GiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def capture_oom(sim) -> None:
    """cuda_graph_runner.__init__ turns the capture's RuntimeError into `Capture cuda graph
    failed: <error>` followed by CUDA_GRAPH_CAPTURE_FAILED_MSG."""
    total = sim.cfg.gpu_mib / 1024.0
    hint = ("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or "
            "0.7)\n2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch "
            "compile by not using --enable-torch-compile\n4. disable CUDA graph by "
            "--disable-cuda-graph. (Not recommended. Huge performance loss)\nOpen an issue on "
            "GitHub https://github.com/sgl-project/sglang/issues/new/choose ")
    sim.crash(_INIT + [
        (MR, "initialize", "self.init_device_graphs()"),
        (MR, "init_device_graphs", "self.graph_runner = GraphRunnerCls(self)"),
        ("sglang/srt/model_executor/cuda_graph_runner.py", "__init__", "raise Exception("),
    ], ["Exception: " + M("capture_failed", error=_oom(2.0, 0, total), msg=hint)])


def one_rank_fails_loading(sim) -> None:
    """One rank's weights do not fit: its load_model raises torch.OutOfMemoryError while
    the other ranks finish loading and go on."""
    bad = min(5, sim.tp - 1)
    for r in sim.rng.sample(range(sim.tp), sim.tp):
        if r != bad:
            log(M("load_end", elapsed=1.0, arch=sim.model["arch"], quant=sim.model["quant"],
                  avail=sim.avail_after_load, usage=sim.weight_gb()), sim.prefix(r))
    sim.crash(_INIT + [
        (MR, "initialize", "self.load_model()"),
        (MR, "load_model", "self.model = get_model("),
        ("sglang/srt/model_loader/__init__.py", "get_model", "return loader.load_model("),
        ("sglang/srt/model_loader/loader.py", "load_model", "self.load_weights_and_postprocess("),
    ], ["torch.OutOfMemoryError: " + _oom(1.5, bad, sim.cfg.gpu_mib / 1024.0)], ranks=[bad])


def warmup_502(sim) -> None:
    """_execute_server_warmup: GET /model_info goes through an HTTP proxy that answers 502;
    120 tries a second apart, then the error and kill_process_tree (SIGKILL)."""
    sim.cfg.sleep("warmup_retry")
    tb = ("Traceback (most recent call last):\n"
          f'  File "{sim.site}/sglang/srt/entrypoints/http_server.py", line '
          f'{sim._lineno("sglang/srt/entrypoints/http_server.py", "assert res.status_code == 200")}'
          ", in _execute_server_warmup\n"
          '    assert res.status_code == 200, f"{res=}, {res.text=}"\n'
          "           ^^^^^^^^^^^^^^^^^^^^^^\n"
          "AssertionError: res=<Response [502]>, res.text=''\n")
    log(M("init_failed", traceback=tb))
    sim.die("warmup")


def after_ready_request(sim) -> None:
    """The first request after ready brings the server down (see the module doc)."""
    if sim.cfg.scenario == "nccl-watchdog":
        bad = min(3, sim.tp - 1)
        stamp = time.strftime("%m%d %H:%M:%S") + f".{int(time.time() % 1 * 1e9):09d}"
        work = ("WorkNCCL(SeqNum=9141, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, "
                "Timeout(ms)=600000) ran for 600017 milliseconds before timing out.")
        rank = f"[rank{bad}]:"
        _write(sys.stderr,
               f"{rank}[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {bad}] Watchdog caught "
               f"collective operation timeout: {work}\n"
               f"{rank}[E{stamp} ProcessGroupNCCL.cpp:2271] [PG ID 2 PG GUID 3 Rank {bad}]  "
               "failure detected by watchdog at work sequence id: 9141 PG status: last "
               "enqueued work: 9141, last completed work: 9140\n"
               "terminate called after throwing an instance of 'c10::DistBackendError'\n"
               f"  what():  [PG ID 2 PG GUID 3 Rank {bad}] Process group watchdog thread "
               f"terminated with exception: [Rank {bad}] Watchdog caught collective operation "
               f"timeout: {work}\n")
        log(M("sigquit"))
    else:
        sim.crash([
            (SCHED, "run_scheduler_process", "scheduler.run_event_loop()"),
            (SCHED, "run_event_loop", "dispatch_event_loop(self)"),
            (SCHED, "dispatch_event_loop", "scheduler.event_loop_overlap()"),
            (SCHED, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
            (SCHED, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
        ], ["IndexError: index 4096 is out of bounds for dimension 0 with size 4096"],
            ranks=[0])
    sim.die("serving")


def ninja_failure(sim) -> None:
    """FlashInfer JIT (ninja) fails in the autotune; ninja prints on stdout."""
    fi = flashinfer_version(sim.sgl)
    ws = os.environ.get("FLASHINFER_WORKSPACE_BASE") or str(Path.home())
    jit = f"{ws}/.cache/flashinfer/{fi}/120a/cached_ops/fused_moe_120"
    site = sim.site
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
    sim.crash([
        (SCHED, "run_scheduler_process", "scheduler = Scheduler("),
        (SCHED, "__init__", "self.init_model_worker()"),
        (MR, "initialize", "self.kernel_warmup()"),
        (MR, "kernel_warmup", "self._flashinfer_autotune()"),
        (MR, "_flashinfer_autotune", "self._dummy_run(batch_size=self.req_to_token_pool.size)"),
        (f"{site}/flashinfer/fused_moe/core.py", "get_cutlass_fused_moe_module",
         "module = gen_cutlass_fused_moe_sm120_module(use_fast_build).build_and_load()"),
        (f"{site}/flashinfer/jit/core.py", "build_and_load", "self.build(verbose, need_lock=False)"),
        (f"{site}/flashinfer/jit/core.py", "build", "run_ninja(jit_env.FLASHINFER_JIT_DIR, self.ninja_path, verbose)"),
        (f"{site}/flashinfer/jit/cpp_ext.py", "run_ninja", "raise RuntimeError(msg) from e"),
    ], [M("ninja_failed")])



def serving_hang(sim, scenario: str, nth: int) -> None:
    """A wedged or leaking server: the request (already counted in flight, so /metrics and
    /v1/loads show it running) never gets a token; it hangs until the process ends. A
    scenario lifted in sim.env (SCENARIO=healthy) frees the requests of this process again."""
    if not (scenario == "wedge" or (scenario == "leak" and nth > sim.cfg.leak_after)):
        return
    while True:
        time.sleep(0.2)
        sim.cfg.refresh_rates()
        now = sim.cfg.serving_scenario()
        if now != scenario and now not in SERVING:
            return

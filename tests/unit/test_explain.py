"""explain() and the parser on small logs COMPOSED for these tests (not real logs: the real
ones are in tests/fixtures/logs/real, see test_explain_corpus.py). Each composed log uses
the wording of the real emitters (sglang, torch, NCCL, FlashInfer, uvicorn) and one kind
of prefix or one cause."""

from __future__ import annotations

import json
import random

import pytest

from sglang_deploy.commands.cli import main
from sglang_deploy.core.logs.explain import explain, render_text
from sglang_deploy.core.logs.parse import StartupTracker
from sglang_deploy.core.logs.prefix import parse_ts, split_updates, strip_prefix

TS = "2026-03-01 12:00:00"


# ---------------------------------------------------------------------------------------
# prefixes (composed lines)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, ts, rank, msg", [
    (f"[{TS} TP3] Load weight begin. avail mem=94.1 GB", TS, "TP3", "Load weight begin. avail mem=94.1 GB"),
    (f"[{TS}.123 DP1 TP1 EP1] Capture cuda graph begin.", TS + ".123", "DP1 TP1 EP1", "Capture cuda graph begin."),
    ("[gpu_id=2] Memory pool end. avail mem=2.52 GB", None, "gpu_id=2", "Memory pool end. avail mem=2.52 GB"),
    ("[23:17:01 TP7] Load weight end. type=X", "23:17:01", "TP7", "Load weight end. type=X"),
    ("[12-16 14:27:08] Rank 0 scheduler is dead.", "12-16 14:27:08", None, "Rank 0 scheduler is dead."),
    ("[rank0]:   File \"/x/cuda_graph_runner.py\", line 485, in capture", None, "rank0",
     "  File \"/x/cuda_graph_runner.py\", line 485, in capture"),
    ("[rank8]:[W516 12:46:57.4995 ProcessGroupNCCL.cpp:1826] x", None, "rank8",
     "[W516 12:46:57.4995 ProcessGroupNCCL.cpp:1826] x"),
    (f"ERROR 2026-03-01T12:00:00.123Z [{TS} TP0] Scheduler hit an exception: x", TS, "TP0",
     "Scheduler hit an exception: x"),
    ("2025-10-09T04:13:06.6371779Z [rank0]: Traceback (most recent call last):",
     "2025-10-09T04:13:06.6371779Z", "rank0", "Traceback (most recent call last):"),
    ("2025-11-05T01:56:54.281615Z  INFO model_runner.init_device_graphs: Capture cuda graph end. x",
     "2025-11-05T01:56:54.281615Z", None, "Capture cuda graph end. x"),
    ("2025-03-07 23:50:27,532 - sglang.srt.server - INFO - The server is fired up and ready to roll!",
     "2025-03-07 23:50:27,532", None, "The server is fired up and ready to roll!"),
    (f"(SGLangEngine pid=23901) [{TS} TP1] Load weight end. x [repeated 2x across cluster]",
     TS, "TP1", "Load weight end. x"),
    (f"sglang-1  | [{TS} TP0] KV Cache is allocated. #tokens: 5", TS, "TP0",
     "KV Cache is allocated. #tokens: 5"),
    (f"Mar 01 12:00:00 gpu1 python[4242]: [{TS} TP5] Load weight end. x", TS, "TP5",
     "Load weight end. x"),
    (f"2026-03-01T12:00:00+0000 gpu1 sglang-launch[4242]: [{TS}] Uvicorn x", TS, None, "Uvicorn x"),
    ("May 16, 2026 @ 20:46:57.892    [rank9]:x", "May 16, 2026 @ 20:46:57.892", "rank9", "x"),
    ("INFO 11-26 14:23:34 weight_utils.py:243] Using model weights format", "11-26 14:23:34",
     None, "Using model weights format"),
    ("[1/3] nvcc -c x.cu", None, None, "[1/3] nvcc -c x.cu"),
    # Kubernetes pod logs (containerd/CRI): timestamp, stream, full/partial flag
    (f"2025-07-25T05:09:16.157949381+08:00 stdout F [{TS} TP0] Prefill batch. #new-seq: 1",
     TS, "TP0", "Prefill batch. #new-seq: 1"),
    # a rank prefix pasted without its timestamp
    ("[TP0] Scheduler hit an exception: Traceback (most recent call last):", None, "TP0",
     "Scheduler hit an exception: Traceback (most recent call last):"),
    ("[DP1 TP2] Load weight end. x", None, "DP1 TP2", "Load weight end. x"),
    # docker compose with a container_name: no replica number, padded to the longest name
    (f"my-sglang  | [{TS} TP0] Load weight begin. x", TS, "TP0", "Load weight begin. x"),
    ("my-sglang  |   File \"/x/model_runner.py\", line 1, in initialize", None, None,
     "  File \"/x/model_runner.py\", line 1, in initialize"),
])
def test_every_prefix_kind(line, ts, rank, msg):
    assert strip_prefix(line) == (ts, rank, msg)


def test_timestamps_of_every_kind_parse():
    for text in (TS, TS + ".5", "2025-03-07 23:50:27,532", "23:17:01", "12-16 14:27:08",
                 "2025-10-09T04:13:06.6371779Z", "Mar 01 12:00:00", "May 16, 2026 @ 20:46:57.892"):
        assert parse_ts(text) is not None, text
    assert parse_ts(TS + ".5") - parse_ts(TS) == pytest.approx(0.5)


def test_progress_bars_glued_with_and_without_cr():
    bar = "Capturing batches (bs=8 avail_mem=10.19 GB):  50%|█████     | 3/6 [00:32<00:30]"
    assert split_updates("\r" + bar + "\r" + bar + f"[{TS} TP0] Capture cuda graph end. x")[-1] \
        == f"[{TS} TP0] Capture cuda graph end. x"
    glued = "Capturing batches (avail_mem=12.55 GB):   0%|   | 0/23 [00:00<?, ?it/s]" \
        "2025-03-27 21:33:31,890 - INFO - flashinfer.jit: Loading JIT ops: x"
    assert split_updates(glued)[1].startswith("2025-03-27 21:33:31,890 - INFO")
    assert split_updates(bar + "[gpu_id=0] Capture cuda graph end.")[-1] == \
        "[gpu_id=0] Capture cuda graph end."


# ---------------------------------------------------------------------------------------
# ranks in any order; partial text
# ---------------------------------------------------------------------------------------


def _startup(ranks=8, prefix=lambda r: f"[{TS} TP{r}] ", seed=1):
    per_rank = ["Load weight begin. avail mem=94.10 GB",
                "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=80 GB",
                "KV Cache is allocated. #tokens: 812345, KV size: 51.20 GB",
                "Memory pool end. avail mem=20.00 GB",
                "Capture cuda graph begin. This can take up to several minutes. avail mem=19 GB",
                "Capture cuda graph end. Time elapsed: 12.50 s. mem usage=0.80 GB."]
    rng = random.Random(seed)
    queues = [[prefix(r) + m for m in per_rank] for r in range(ranks)]
    out = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out + [f"[{TS}] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
                  f'[{TS}] INFO:     127.0.0.1:41234 - "GET /model_info HTTP/1.1" 200 OK',
                  f'[{TS}] INFO:     127.0.0.1:41236 - "POST /generate HTTP/1.1" 200 OK',
                  f"[{TS}] The server is fired up and ready to roll!"]


@pytest.mark.parametrize("seed", range(5))
def test_eight_ranks_interleaved_in_any_order_are_ready(seed):
    r = explain(_startup(seed=seed))
    assert (r["outcome"], r["phase"], r["cause"]) == ("ready", "ready", None)
    assert r["ranks"] == [f"TP{i}" for i in range(8)]
    assert [p["name"] for p in r["phases"]] == ["loading", "loaded", "kv_cache", "capture",
                                                "captured", "http", "warmup", "ready"]


def _leader_only_startup(prefix):
    """0.5.x layout: most phase lines come from rank 0 only; the other ranks show up only in
    their KV Cache and 'Registering ... cuda graph addresses' lines."""
    lead = prefix(0)
    lines = [lead + "Load weight begin. avail mem=77.43 GB",
             lead + "Load weight end. type=Grok1ForCausalLM, dtype=torch.bfloat16, avail mem=40 GB"]
    lines += [prefix(r) + "KV Cache is allocated. #tokens: 903439, K size: 13.79 GB, V size: 13.79 GB"
              for r in (3, 6, 1, 2, 4, 0, 5, 7)]
    lines += [lead + "Memory pool end. avail mem=11.22 GB",
              lead + "Capture cuda graph begin. This can take up to several minutes. avail mem=11 GB"]
    lines += [prefix(r) + "Registering 2967 cuda graph addresses" for r in (3, 1, 7, 4, 5, 6, 0, 2)]
    lines += [lead + "Capture cuda graph end. Time elapsed: 17.13 s. mem usage=0.89 GB.",
              f"[{TS}] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
              f'[{TS}] INFO:     127.0.0.1:60032 - "POST /generate HTTP/1.1" 200 OK',
              f"[{TS}] The server is fired up and ready to roll!"]
    return lines


@pytest.mark.parametrize("prefix,names", [
    (lambda r: f"[{TS} TP{r}] ", [f"TP{i}" for i in range(8)]),
    (lambda r: f"[{TS} DP{r} TP{r} EP{r}] ", [f"DP{i} TP{i} EP{i}" for i in range(8)]),
])
def test_phase_lines_from_rank_0_only_still_count_every_rank_and_reach_ready(prefix, names):
    r = explain(_leader_only_startup(prefix))
    assert (r["outcome"], r["phase"], r["cause"]) == ("ready", "ready", None)
    assert r["ranks"] == names


def test_gpu_id_prefix_raises_no_false_order_violation_live():
    t = StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    events = []
    for i, line in enumerate(_startup(ranks=4, prefix=lambda r: f"[gpu_id={r}] ")):
        events += t.feed(line, float(i))
    assert not [e for e in events if e.kind == "violation"], events
    assert t.ready_seen


def test_partial_text_no_violation_offline_strict_live():
    tail = [x for x in _startup() if "Load weight" not in x]  # starts after the loading
    assert explain(tail)["outcome"] == "ready"
    live = StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    events = [e for i, x in enumerate(tail) for e in live.feed(x, float(i))]
    assert [e.data["rule"] for e in events if e.kind == "violation"] == ["no-weights"]
    offline = StartupTracker("0.5.12.post1", expect_autotune=True, cuda_graph=True,
                             strict_order=False)
    events = [e for i, x in enumerate(tail) for e in offline.feed(x, float(i))]
    assert not [e for e in events if e.kind == "violation"]


def test_a_segment_without_verdict_is_incomplete_with_the_phase_reached():
    r = explain(_startup()[:20])
    assert r["outcome"] == "incomplete" and r["cause"] is None
    assert r["phase"] in ("loaded", "kv_cache", "capture")
    assert explain(["just some text", "nothing known"])["phase"] is None


# ---------------------------------------------------------------------------------------
# causes (composed failures, the wording of the real emitters)
# ---------------------------------------------------------------------------------------

SCHED_TB = [
    f"[{TS} TP3] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3118, in run_scheduler_process',
    "    scheduler = Scheduler(",
    '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 495, in initialize',
]
TEARDOWN = [f"[{TS}] Received sigquit from a child process. It usually means the child failed."]


def _until(word):
    lines = _startup()
    i = next(i for i, x in enumerate(lines) if word in x)
    return lines[:i + 1]


def _frame(func, call):
    return [('  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", '
            f"line 100, in {func}"), f"    {call}"]


CASES = {
    "oom-capture": (_startup()[:20] + SCHED_TB + _frame("init_device_graphs", "self.graph_runner = CudaGraphRunner(self)")
                    + _frame("capture", "self.capture_one_batch_size(bs, forward)")
                    + [("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
                       "GPU 3 has a total capacity of 94.97 GiB of which 1.06 GiB is free.")] + TEARDOWN,
                    "capture", "cuda-oom"),
    "oom-loading-hip": (SCHED_TB + _frame("load_model", "self.model = get_model(")
                        + ["torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.00 GiB."],
                        "loading", "cuda-oom"),
    "not-enough-memory": (_startup()[:12] + SCHED_TB + _frame("init_memory_pool", "raise RuntimeError(")
                          + [("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                             "Current value: mem_fraction_static=0.5")] + TEARDOWN,
                          "kv_cache", "not-enough-memory"),
    # NCCL's own words when /dev/shm is full (NVIDIA/nccl#342, pytorch/ci-infra#490), then
    # pynccl's generic error: the shared memory is the cause, not the P2P transport
    "nccl-shm-full": ([("node1:2144:2556 [3] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
                        "/dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)"),
                       ("node1:2144:2556 [3] misc/shmutils.cc:132 NCCL WARN Error while creating shared "
                        "memory segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on "
                        "device (28)"),
                       "node1:2144:2556 [3] NCCL INFO transport/shm.cc:551 -> 2"]
                      + SCHED_TB + _frame("init_torch_distributed", "initialize_model_parallel(")
                      + ["RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"]
                      + TEARDOWN, "starting", "host-memory"),
    "enomem": (SCHED_TB + _frame("load_model", "self.model = get_model(")
               + ["OSError: [Errno 12] Cannot allocate memory"] + TEARDOWN, "loading", "host-memory"),
    "nccl-p2p": (SCHED_TB + _frame("init_torch_distributed", "initialize_model_parallel(")
                 + ["RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"]
                 + TEARDOWN, "starting", "nccl-p2p"),
    "nccl-peer-refused": (["gpu2:77:77 [3] NCCL INFO Bootstrap : Using eth0:10.0.0.12<0>",
                           ("gpu2:77:77 [3] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                           "10.0.0.11<41237> failed : Software caused connection abort")]
                          + SCHED_TB + _frame("init_torch_distributed", "initialize_model_parallel(")
                          + [("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                             "NCCLUtils.hpp:317, remote process exited or there was a network error")] + TEARDOWN,
                          "starting", "nccl-peer-refused"),
    "nccl-watchdog-after-ready": (_startup() + [
        ("[rank5]:[E301 12:10:00.000 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=9141, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600020 milliseconds before timing out."),
        "terminate called after throwing an instance of 'c10::DistBackendError'"],
        "serving", "nccl-watchdog"),
    "gloo": ([("[rank4]:[E421 02:05:38.764 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with "
              "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error")] + SCHED_TB
             + _frame("init_torch_distributed", "initialize_model_parallel("), "starting", "gloo-connection"),
    "jit-build": (_startup()[:16] + [f"[{TS} TP0] Running FlashInfer autotune with cache: /x/rank_tp0.json"]
                  + SCHED_TB + _frame("kernel_warmup", "self._flashinfer_autotune()")
                  + ["RuntimeError: Ninja build failed. Ninja output:", "ninja: build stopped: subcommand failed."],
                  "autotune", "jit-build"),
    "no-nvcc": (["RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"],
                None, "no-nvcc"),
    "autotune-crash": (_startup()[:16] + SCHED_TB + _frame("kernel_warmup", "self._flashinfer_autotune()")
                       + ["RuntimeError: Expected all tensors to be on the same device"] + TEARDOWN,
                       "autotune", "autotune-crash"),
    "unsupported-arch": (_until("Capture cuda graph begin") + [("CUDA Error: no kernel image is available for execution on the device "
                                           "(209) /x/handler.cuh: line 170")], "capture", "unsupported-arch"),
    "capture-generic": (_until("Capture cuda graph begin") + [f"[{TS} TP0] Traceback (most recent call last):"]
                        + _frame("capture", "self.capture_one_batch_size(bs, forward)")
                        + ["TypeError: cannot unpack non-iterable ForwardMetadata object"],
                        "capture", "cuda-graph-capture"),
    "warmup-502": (_startup()[:-1] + [
        f"[{TS}] Initialization failed. warmup error: Traceback (most recent call last):",
        '  File "/x/sglang/srt/entrypoints/http_server.py", line 1434, in _execute_server_warmup',
        '    assert res.status_code == 200, f"{res=}, {res.text=}"',
        "AssertionError: res=<Response [502]>, res.text=''", "Killed"], "warmup", "warmup-failed"),
    "scheduler-after-ready": (_startup() + SCHED_TB[:1] + [
        '  File "/x/sglang/srt/managers/scheduler.py", line 999, in event_loop_overlap',
        "    batch_result = self.run_batch(batch)", "IndexError: index 7 is out of bounds"] + TEARDOWN,
        "serving", "scheduler-exception"),
    "oom-killer": ([f"[{TS} TP0] Load weight begin. avail mem=94.10 GB",
                    f"[{TS}] Rank 0 scheduler is dead. Please check if there are relevant logs.",
                    f"[{TS}] Exit code: -9"], "loading", "oom-killer"),
    # systemd's own words (src/core/unit.c) when the kernel OOM-kills a process of the unit
    "oom-killer-systemd": ([f"[{TS} TP0] Load weight begin. avail mem=94.10 GB",
                            "sglang.service: A process of this unit has been killed by the OOM killer.",
                            "sglang.service: Main process exited, code=killed, status=9/KILL",
                            "sglang.service: Failed with result 'oom-kill'."], "loading", "oom-killer"),
    # SGLang tears itself down with SIGKILL after a child's failure: systemd then says
    # status=9/KILL, which is no OOM kill
    "exception-then-own-sigkill": (SCHED_TB + _frame("load_model", "self.model = get_model(")
                                   + ["ValueError: unexpected key in the checkpoint's index"] + TEARDOWN
                                   + ["sglang.service: Main process exited, code=killed, status=9/KILL",
                                      "sglang.service: Failed with result 'signal'."],
                                   "loading", "ValueError"),
    "port-in-use": (_startup()[:-3] + [("ERROR:    [Errno 98] error while attempting to bind on address "
                                       "('127.0.0.1', 30000): address already in use")], "http", "port-in-use"),
    "model-load": (["ValueError: Model architectures ['FooForCausalLM'] are not supported for now."],
                   "loading", "model-load"),
    # torch's NCCL watchdog reports a kernel's fault it found on its stream: not a timeout
    "illegal-access-watchdog": (_startup() + [
        ("[rank4]:[E219 10:36:52.051413081 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 3 Rank 4] "
         "Process group watchdog thread terminated with exception: CUDA error: an illegal memory "
         "access was encountered"),
        "terminate called after throwing an instance of 'c10::DistBackendError'"],
        "serving", "illegal-memory-access"),
    "launch-failure-watchdog": (_startup() + [
        ("[rank1]:[E616 14:15:35.071 ProcessGroupNCCL.cpp:1595] [PG ID 2 PG GUID 3 Rank 1] "
         "Process group watchdog thread terminated with exception: CUDA error: unspecified "
         "launch failure")], "serving", "illegal-memory-access"),
    # the cause names the line, the capture it also proves names the phase
    "illegal-access-capture": ([("Exception: Capture cuda graph failed: RuntimeError: CUDA error: an "
                                 "illegal memory access was encountered")], "capture",
                               "illegal-memory-access"),
    "hip-memory-fault": ([f"[{TS} TP0] Decode batch. #running-req: 3, #token: 900, token usage: 0.01",
                          ("Memory access fault by GPU node-2 (Agent handle: 0x55d0) on address "
                           "0x7f1c. Reason: Unknown.")], "serving", "illegal-memory-access"),
    # sglang's mem_cache allocators, raised from the scheduler loop
    "kv-pool-prefill": (SCHED_TB[:1] + [
        '  File "/x/sglang/srt/managers/scheduler.py", line 1702, in event_loop_overlap',
        "    batch = self.get_next_batch_to_run()",
        '  File "/x/sglang/srt/mem_cache/common.py", line 412, in alloc_paged_token_slots_extend',
        "    raise RuntimeError(error_msg)",
        "RuntimeError: Prefill out of memory. Try to lower your batch size.",
        "Try to allocate 2048 tokens.",
        "Available full tokens: 704 (full_available_size=704 + full_evictable_size_=0)"] + TEARDOWN,
        "serving", "kv-pool-exhausted"),
    "kv-pool-req-slots": ([("RuntimeError: alloc_req_slots runs out of memory. Please set a smaller "
                            "number for `--max-running-requests`. self.req_to_token_pool."
                            "available_size()=1, num_reqs=2,")], "serving", "kv-pool-exhausted"),
    # the newer wordings of the KV cache that does not fit after the weights
    "not-enough-memory-no-room": ([(f"[{TS} TP0] Load weight end. type=X, avail mem=12.25 GB, "
                                    "mem usage=125.65 GB."),
                                   ("ValueError: Loaded weights leave no GPU memory for the KV cache "
                                    "under --mem-fraction-static=0.88.")], "kv_cache",
                                  "not-enough-memory"),
    "not-enough-memory-to-allocate": (["RuntimeError: Not enough memory to allocate KV cache."],
                                      "kv_cache", "not-enough-memory"),
    # a text that starts mid-way: its `Decode batch` lines say the server was serving
    "oom-after-decode-batch": ([(f"[{TS} TP0] Decode batch. #running-req: 60, #token: 90000, token "
                                 "usage: 0.95, cuda graph: True, gen throughput (token/s): 900.1"),
                                ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                 "2.00 GiB.")], "serving", "cuda-oom"),
    # a scheduler-loop frame marks serving even when later lines show another engine's capture
    "frame-get-model-worker-batch": ([
        f"[{TS} TP1] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/x/sglang/srt/managers/scheduler.py", line 1304, in get_next_batch_to_run',
        "    new_batch = self.get_new_batch_prefill()",
        "IndexError: list index out of range",
        "Capturing batches (avail_mem=28.99 GB): 100%|##########| 23/23 [00:08<00:00,  2.81it/s"],
        "serving", "scheduler-exception"),
    # raised by the scheduler process's entry point itself, before any Scheduler exists
    "enomem-scheduler-entry": (["Process Process-1:", "Traceback (most recent call last):",
                                '  File "/usr/lib/python3.10/multiprocessing/process.py", line 108, in run',
                                "    self._target(*self._args, **self._kwargs)",
                                ('  File "/x/sglang/srt/managers/scheduler.py", line 2238, in '
                                 "run_scheduler_process"),
                                "    faulthandler.enable()",
                                "OSError: [Errno 12] Cannot allocate memory"], "starting", "host-memory"),
    # SGLang's own watchdog (0.5.12 wording, and the older one), the unanswered health check
    "scheduler-watchdog": ([f"[{TS} TP3] Decode batch. #running-req: 109, #token: 90000, token usage: 0.40",
                            f"[{TS} TP3] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"]
                           + TEARDOWN, "serving", "scheduler-hang"),
    "scheduler-watchdog-old": ([f"[{TS} TP0] Watchdog timeout (self.watchdog_timeout=300)"],
                               "serving", "scheduler-hang"),
    # the collective that hung names the cause better than the watchdog that saw no progress
    "hang-with-nccl-timeout": ([(f"[{TS} TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, "
                                 "self.soft=False)"),
                                ("[rank0]:[E301 12:10:00.000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog "
                                 "caught collective operation timeout: WorkNCCL(SeqNum=9141, OpType=ALLREDUCE, "
                                 "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600020 milliseconds before "
                                 "timing out.")], "serving", "nccl-watchdog"),
    # torch c10d waiting for rank 0's store (--dist-init-addr) that never answers
    "c10d-store-timeout": ([("[rank1]:[W623 15:37:01.824 socket.cpp:485] [c10d] waitForInput: socket "
                             "SocketImpl(fd=100, addr=[node-1]:43590, remote=[node-0]:20000) timed out "
                             "after 1800000ms")] + SCHED_TB + TEARDOWN, "starting", "nccl-peer-refused"),
    "tcpstore-client-timeout": (SCHED_TB + _frame("init_torch_distributed", "init_distributed_environment(")
                                + [("torch.distributed.DistNetworkError: The client socket has timed out "
                                   "after 600000ms while trying to connect to (10.0.0.1, 5000).")],
                                "starting", "nccl-peer-refused"),
    # the same NCCL words as the "Last error:" of torch's DistBackendError (no NCCL WARN)
    "shm-last-error": (SCHED_TB + _frame("init_torch_distributed", "initialize_model_parallel(") + [
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.cpp:81, "
         "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"),
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        "Last error:", "Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)"]
        + TEARDOWN, "starting", "host-memory"),
    "bad-args-invalid-choice": (["usage: launch_server.py [-h] --model-path MODEL_PATH [--port PORT]",
                                 ("launch_server.py: error: argument --quantization: invalid choice: 'int4' "
                                  "(choose from 'awq', 'fp8', 'gptq')")], "starting", "bad-args"),
    "bad-args-unrecognized": (["INFO 03-06 10:05:08 __init__.py:190] Automatically detected platform cuda.",
                               "launch_server.py: error: unrecognized arguments: --enable-reasoning"],
                              "starting", "bad-args"),
    "cuda-driver-insufficient": (SCHED_TB + _frame("__init__", "torch.cuda.set_device(self.gpu_id)") + [
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version"] + TEARDOWN,
        "starting", "cuda-driver"),
    "cuda-no-gpus": (SCHED_TB + ["RuntimeError: No CUDA GPUs are available"] + TEARDOWN, "starting",
                     "cuda-driver"),
    "cuda-no-driver": ([("RuntimeError: Found no NVIDIA driver on your system. Please check that you have "
                         "an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx")],
                       "starting", "cuda-driver"),
    # sglang's wait_port_available gives up before launching anything
    "port-wait-at-launch": ([("ValueError: port_base at 30234 is not available in 30 seconds. port_base is "
                              "used by a process already. process.name()='python3'")], "starting", "port-in-use"),
    # Triton compiling a kernel with its bundled ptxas (that does not know the GPU)
    "triton-ptxas": (_until("Capture cuda graph begin") + SCHED_TB[:1] + [
        '  File "/opt/venv/lib/python3.11/site-packages/triton/backends/nvidia/compiler.py", line 292, in make_cubin',
        "    subprocess.run(cmd, shell=True, check=True)",
        ("subprocess.CalledProcessError: Command '/opt/venv/lib/python3.11/site-packages/triton/backends/nvidia/"
         "bin/ptxas -lineinfo -v --gpu-name=sm_120 /tmp/t.ptx -o /tmp/t.ptx.o 2> /tmp/t.log' returned non-zero "
         "exit status 255.")], "capture", "jit-build"),
    # an import at launch: sgl-kernel built for another torch, a CUDA runtime library missing
    "sgl-kernel-abi": (["Traceback (most recent call last):",
                        '  File "/opt/venv/lib/python3.12/site-packages/sglang/launch_server.py", line 6, in <module>',
                        "    from sglang.srt.entrypoints.http_server import launch_server",
                        ("ImportError: /opt/venv/lib/python3.12/site-packages/sgl_kernel/common_ops.abi3.so: "
                         "undefined symbol: _ZN3c104cuda9SetDeviceEa")], "starting", "broken-install"),
    "libnvrtc-missing": (["ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory"],
                         "starting", "broken-install"),
    "libcuda-missing": (["OSError: libcuda.so.1: cannot open shared object file: No such file or directory"],
                        "starting", "cuda-driver"),
    "died-no-cause": ([(f"[{TS}] RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). "
                       "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.")], None, "other"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cause_and_phase_of_composed_failures(name):
    lines, phase, cause = CASES[name]
    r = explain(lines)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", phase, cause), r
    assert r["fix"] and r["summary"] and r["relevant_lines"]


@pytest.mark.parametrize("name, says, not_says", [
    # weights that do not fit: a smaller KV cache cannot help, more GPUs can
    ("oom-loading-hip", "--tp", "lower --mem-fraction-static"),
    ("oom-capture", "--cuda-graph-max-bs", "quantised"),
])
def test_an_out_of_memory_gets_the_fix_of_its_phase(name, says, not_says):
    r = explain(CASES[name][0])
    assert says in r["fix"] and not_says not in r["fix"], r["fix"]


def test_a_scheduler_exception_gets_the_fix_of_its_phase():
    starting = explain(CASES["exception-then-own-sigkill"][0])["fix"]
    serving = explain(CASES["scheduler-after-ready"][0])["fix"]
    assert "known-good" in starting and "request that triggered it" not in starting
    assert "request that triggered it" in serving


def test_an_illegal_memory_access_is_no_collective_timeout_nor_out_of_memory():
    r = explain(CASES["illegal-access-watchdog"][0])
    assert "CUDA_LAUNCH_BLOCKING" in r["fix"] and "--dist-timeout" not in r["fix"]
    assert "--mem-fraction-static" not in r["fix"]


def test_a_pool_exhausted_while_serving_is_not_told_to_shrink_the_pool():
    r = explain(CASES["kv-pool-prefill"][0])
    assert "--max-running-requests" in r["fix"]
    # the only mention of lowering the static fraction says not to
    assert r["fix"].count("lower --mem-fraction-static") == 1
    assert "do not lower --mem-fraction-static" in r["fix"]


def test_a_traceback_cut_after_the_scheduler_entry_names_no_phase():
    # the entry point is the outermost frame of every scheduler traceback: cut there, the
    # failure could be in any phase
    lines = [f"[{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/x/sglang/srt/managers/scheduler.py", line 1489, in run_scheduler_process',
             "    scheduler = Scheduler(server_a", "[... cut ...]"]
    r = explain(lines)
    assert r["outcome"] == "failed" and r["phase"] is None


HEALTH_FAILED = (f"[{TS}] Health check failed. Server couldn't get a response from detokenizer "
                 "for last 20 seconds. tic start time: 05:49:14. last_heartbeat time: 05:42:53")


def test_a_failed_health_check_alone_is_no_failure_but_names_a_later_one():
    # SGLang marks itself unhealthy (503) until a request succeeds again: the server lives on
    alone = explain(_startup() + [HEALTH_FAILED])
    assert alone["outcome"] == "ready" and HEALTH_FAILED in alone["relevant_lines"]
    then_killed = explain(_startup() + [HEALTH_FAILED, f"[{TS}] Exit code: -9"])
    assert (then_killed["outcome"], then_killed["phase"], then_killed["cause"]) == (
        "failed", "serving", "scheduler-hang")


def test_a_soft_watchdog_only_warns():
    lines = [f"[{TS} TP0] Scheduler watchdog timeout (self.watchdog_timeout=30.0, self.soft=True)"]
    assert explain(lines)["outcome"] == "incomplete"


def test_a_retraction_is_no_failure():
    # the scheduler retracts and goes on: a warning, not a crash
    lines = [(f"[{TS} TP13] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: "
              "0.1474 -> 0.1845"),
             f"[{TS} TP13] Decode batch. #running-req: 31, #token: 9000, token usage: 0.97"]
    assert explain(lines)["outcome"] == "incomplete"


def test_an_out_of_memory_after_ready_gets_the_serving_fix():
    lines = ["[2026-01-02 10:00:00] The server is fired up and ready to roll!",
             "[2026-01-02 10:05:00 TP3] Scheduler hit an exception: Traceback (most recent call last):",
             ('  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", '
             "line 1000, in event_loop_overlap"),
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB."]
    r = explain(lines)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "serving", "cuda-oom"), r
    assert "--max-running-requests" in r["fix"] and "--tp" not in r["fix"]


def test_a_capture_failure_that_is_no_oom_points_at_the_backend():
    lines = (SCHED_TB + _frame("capture", "self.capture_one_batch_size(bs, forward)")
             + ["TypeError: cannot unpack non-iterable ForwardMetadata object"] + TEARDOWN)
    r = explain(lines)
    assert (r["phase"], r["cause"]) == ("capture", "cuda-graph-capture"), r
    assert "--attention-backend" in r["fix"] and "SGLang version" in r["fix"]


def test_a_full_dev_shm_gets_no_p2p_hint():
    r = explain(CASES["nccl-shm-full"][0])
    assert "/dev/shm" in r["fix"] and "NCCL_P2P" not in r["fix"]


def test_an_unknown_error_is_not_called_a_native_crash():
    r = explain(["Traceback (most recent call last):",
                 '  File "/usr/lib/python3.10/multiprocessing/process.py", line 108, in run',
                 "ValueError: think_end_token must encode to exactly one token"])
    assert r["outcome"] == "failed" and r["cause"] == "ValueError"
    assert "native crash" not in r["summary"] and "think_end_token" in r["summary"]
    assert "multiprocessing/process.py:108, in run" in r["summary"]


def test_a_refused_peer_gets_no_p2p_hint():
    r = explain(CASES["nccl-peer-refused"][0])
    assert "other node" in r["fix"] and "dist-init-addr" in r["fix"]
    assert "P2P" not in r["fix"]


def test_the_teardown_is_not_the_cause_and_the_error_before_its_traceback_is_shown():
    lines = [f"[{TS} TP0] Failed to initialize lk_moe: CUDA out of memory. Tried to allocate 24.00 MiB."] \
        + SCHED_TB + TEARDOWN
    r = explain(lines)
    assert r["cause"] == "cuda-oom"
    assert r["relevant_lines"][0] == lines[0]
    assert any("Scheduler hit an exception" in x for x in r["relevant_lines"])


def test_a_bare_traceback_under_a_rank_prefix_is_fatal_live():
    t = StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    evs = t.feed(f"[{TS} TP2] Traceback (most recent call last):", 1.0)
    assert [e.kind for e in evs] == ["fatal"]
    # without a rank prefix (a library's own message) it is not fatal live
    t2 = StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    assert not [e for e in t2.feed("Traceback (most recent call last):", 1.0) if e.kind == "fatal"]


def test_failure_on_one_rank_only_names_its_phase_not_the_leaders():
    lines = _startup(ranks=8)[:40] + [f"[{TS} TP5] Scheduler hit an exception: Traceback (most recent call last):"] \
        + _frame("load_model", "self.model = get_model(") + [("safetensors_rust.SafetensorError: Error while "
                                                              "deserializing header: MetadataIncompleteBuffer")]
    r = explain(lines)
    assert (r["phase"], r["cause"]) == ("loading", "model-load")
    assert "TP5" in r["ranks"]


def test_render_text_and_cli(tmp_path, capsys):
    lines = CASES["oom-capture"][0]
    text = render_text(explain(lines))
    for word in ("phases seen:", "outcome:     failed", "phase:       capture", "cause:       cuda-oom",
                 "fix:", "proof:", "Capture cuda graph failed"):
        assert word in text
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["explain-log", str(log)]) == 1
    assert "cuda-oom" in capsys.readouterr().out
    assert main(["explain-log", str(log), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {"outcome", "phase", "cause", "fix", "phases", "relevant_lines", "ranks"} <= set(data)
    assert data["phases"][0] == {"name": "loading", "at": TS, "duration_s": 0.0}
    log.write_text("\n".join(_startup()) + "\n")
    assert main(["explain-log", str(log)]) == 0
    assert main(["explain-log", str(tmp_path / "missing.log")]) == 2


@pytest.mark.parametrize("name, says", [
    ("bad-args-unrecognized", "--help"), ("cuda-driver-insufficient", "nvidia-smi"),
    ("c10d-store-timeout", "--dist-init-addr"), ("shm-last-error", "/dev/shm"),
    ("sgl-kernel-abi", "pinned together"),
])
def test_the_new_startup_causes_get_their_own_fix(name, says):
    assert says in explain(CASES[name][0])["fix"]


@pytest.mark.parametrize("warning", [
    ("[rank1]:[W623 15:37:01.823 socket.cpp:460] [c10d] waitForInput: poll for socket SocketImpl(fd=100) "
    "returned 0, likely a timeout"),
    "Failed to initialize NVML: Unknown Error",
    # sglang's own warning when an optional module does not import (ROCm hosts)
    (f"[{TS} TP0] Failed to import from custom_ar with ImportError('libcuda.so.1: cannot open shared "
    "object file: No such file or directory')"),
])
def test_a_startup_warning_alone_does_not_fail_a_startup_that_gets_ready(warning):
    lines = _startup()
    r = explain(lines[:3] + [warning] + lines[3:])
    assert (r["outcome"], r["cause"]) == ("ready", None), r

"""Why an SGLang server failed: cause signatures, their fixes, and the phase a failure
belongs to (pure). Used by the live tracker (logparse.StartupTracker) and the offline
analysis (explain.explain) alike.

Cause ids: the keys of logfixes.CAUSE_FIXES (the vocabulary of
tests/fixtures/logs/real/corpus.yaml).

Each signature has a weight: the cause of a failure is the heaviest signature seen
(earliest among equals). Specific causes (an out-of-memory, a refused peer, a JIT build)
outweigh what only says where it broke (``Capture cuda graph failed``, the warmup error),
which outweighs the generic ``Scheduler hit an exception``; the teardown that follows
(``Received sigquit``, ``scheduler died``) weighs nothing: it names no cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.logs.firsterror import ExcLine, first_error, first_error_fix
from sglang_deploy.core.logs.fixes import CAUSE_FIXES, GENERIC_BY_PHASE, PHASE_FIXES

__all__ = ["SIGNATURES", "Hit", "Signature", "call_phase", "diagnose", "frame_phase",
           "line_phase", "match_signature"]

SPECIFIC, EVIDENCE, NCCL, WHERE, GENERIC, TEARDOWN = 30, 25, 22, 20, 10, 0


@dataclass(frozen=True)
class Signature:
    cause: str                 # the cause id (vocabulary above)
    pattern: re.Pattern[str]
    summary: str               # one line: what happened
    weight: int = SPECIFIC
    fatal: bool = True         # does the line alone mean the server failed?
    phase: str | None = None   # the phase the line itself proves
    default_phase: str | None = None  # the phase when nothing else tells
    source: str = ""           # literal text of the emitting code (tests grep the wheels)
    origin: str = "other"      # sglang | flashinfer | torch | nccl | uvicorn | kernel | other
    name: str = ""             # the signal's own name where it is not a cause (teardown)

    @property
    def id(self) -> str:
        return self.name or self.cause


_re = re.compile


SIGNATURES: tuple[Signature, ...] = (
    # ---- specific causes ---------------------------------------------------------------
    Signature("cuda-oom", _re(
        r"OutOfMemoryError|(?:CUDA|HIP|cuda|hip) out of memory|CUDA error: out of memory|"
        r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|out of memory\. Tried to "
        r"allocate|CUDA driver error: out of memory|Failed to allocate memory .* CUDA"),
        "a GPU ran out of memory", origin="torch"),
    Signature("not-enough-memory", _re(
        r"profiled value -\d+|max_total_num_tokens=-\d+"),
        "no memory is left for the KV cache (the profiled token count is negative)",
        fatal=False, phase="kv_cache"),
    Signature("not-enough-memory", _re(
        r"Not enough memory(?:\. Please try to increase --mem-fraction-static| to allocate KV "
        r"cache\.)|leave no GPU memory for the KV cache"),
        "the KV cache does not fit in the memory left after the weights", phase="kv_cache",
        source="Not enough memory. Please try to increase --mem-fraction-static",
        origin="sglang"),
    # before the watchdog: `watchdog thread terminated with exception: CUDA error: an illegal
    # memory access` is the kernel's fault, which NCCL's watchdog only reports
    Signature("illegal-memory-access", _re(
        r"illegal memory access was encountered|cudaErrorIllegalAddress|CUDA error: misaligned "
        r"address|Memory access fault by GPU|CUDA error: unspecified launch failure|illegal "
        r"instruction was encountered"),
        "a GPU kernel made an illegal memory access (or crashed)", default_phase="serving",
        origin="torch"),
    Signature("kv-pool-exhausted", _re(
        r"(?:Prefill|Decode) out of memory\. Try to lower your batch size|alloc_(?:req|token)_slots "
        r"runs out of memory|Out of request slots|KVPoolOOMError"),
        "the KV cache / request-slot pool ran out while serving", default_phase="serving",
        source="out of memory. Try to lower your batch size.", origin="sglang"),
    # SGLang's own watchdog (no progress for --watchdog-timeout seconds; its soft variant only
    # warns) and the health check that got no answer: a hang, a symptom that any specific
    # cause in the same text outweighs
    Signature("scheduler-hang", _re(
        r"[Ww]atchdog timeout \(self\.watchdog_timeout=[\d.]+(?:, self\.soft=False)?\)"),
        "a scheduler stopped making progress (SGLang's watchdog)",
        weight=SPECIFIC - 2, default_phase="serving", source="atchdog timeout",
        origin="sglang"),
    # the health check only marks the server unhealthy (503) until a request succeeds again:
    # evidence of a hang, not a failure by itself
    Signature("scheduler-hang", _re(
        r"Health check failed\. Server couldn't get a response from detokenizer"),
        "the health check got no answer from the scheduler (a hang, or a queue too long)",
        weight=SPECIFIC - 2, fatal=False, default_phase="serving", origin="sglang"),
    Signature("nccl-watchdog", _re(
        r"Watchdog caught collective operation timeout|watchdog thread terminated with "
        r"exception|ncclCommWatchdog|Some NCCL operations have failed or timed out|"
        r"NCCL watchdog|Timeout\(ms\)=\d+\) ran for"),
        "an NCCL collective timed out (the NCCL watchdog aborted it)",
        default_phase="serving", origin="torch"),
    Signature("nccl-peer-refused", _re(
        r"socketPollConnect|socketStartConnect|[Cc]onnect(?:ion)? to \S+ (?:failed|refused|"
        r"returned)|(?:NCCL|bootstrap|TCPStore|c10d|DistNetworkError|socket)[^\n]*"
        r"(?:Connection refused|No route to host|Connection timed out|connect\(\) timed out)|"
        r"ncclRemoteError|remote process exited or there was a network error|"
        # torch c10d: the rendezvous store (rank 0, --dist-init-addr) never answered
        r"\[c10d\][^\n]*(?:timed out after|failed to connect)|client socket has timed out "
        r"after|DistNetworkError|DistStoreError"),
        "a peer rank/node refused or never answered the connection", weight=EVIDENCE,
        fatal=False, default_phase="starting", origin="nccl"),
    Signature("gloo-connection", _re(
        r"gloo[^\n]*(?:Connection cl|Connection reset|Connection refused|Timed out|"
        r"closed by peer)|Gloo connectFullMesh failed"),
        "the gloo (CPU) process group lost its connection to a peer", default_phase="starting",
        origin="torch"),
    Signature("jit-build", _re(
        r"Ninja build failed|ninja: build stopped|ninja exited with status|CalledProcessError: Command '\['ninja'|"
        r"Error building extension|nvcc fatal|DeepGEMM[^\n]*(?:failed|error)|"
        r"flashinfer\.jit[^\n]*(?:[Ff]ailed|[Ee]rror)|JIT compil\w* failed|"
        r"FAILED: [^\n]*\.(?:cuda\.)?o\b|"
        # Triton's own compile of a kernel: its bundled ptxas, or gcc for its launcher
        r"CalledProcessError: Command '\[?'?[^']*\b(?:ptxas|nvcc|gcc|g\+\+|cc1plus)\b|"
        r"PTXASError|Internal Triton PTX codegen error|ptxas fatal"),
        "a JIT kernel build (ninja/nvcc) failed", source='msg = "Ninja build failed."',
        origin="flashinfer"),
    Signature("no-nvcc", _re(
        r"Could not find nvcc|nvcc: (?:command )?not found|No such file or directory: "
        r"'[^']*nvcc'|CUDA_HOME environment variable is not set"),
        "the JIT build found no nvcc (CUDA toolkit)", weight=SPECIFIC + 2,
        source="Could not find nvcc and default",
        origin="flashinfer"),
    Signature("unsupported-arch", _re(
        r"no kernel image is available for execution|cudaErrorNoKernelImageForDevice|"
        r"CUDA error: invalid device function|[Uu]nsupported (?:GPU |CUDA )?arch\w*|"
        r"is not compatible with the current PyTorch installation|"
        r"(?:not supported|unsupported) (?:on|for) (?:this GPU|sm_?\d+|SM ?\d+|compute "
        r"capability)|requires (?:compute capability|sm_?\d+ or)"),
        "the kernels do not support this GPU architecture"),
    Signature("oom-killer", _re(
        r"Out of memory: Killed process|invoked oom-killer|oom-kill:|oom_reaper|"
        r"killed by the OOM killer|Failed with result 'oom-kill'"),
        "the kernel's OOM killer killed the process", origin="kernel"),
    # a SIGKILL alone: most often the OOM killer, but weaker than any named cause, and
    # nothing after SGLang's own teardown (it kills its process tree with SIGKILL, which
    # systemd then reports as status=9/KILL)
    Signature("oom-killer", _re(
        r"[Ee]xit code:? -9\b|killed by signal 9|signal=KILL|status=9/KILL"),
        "the process was killed (SIGKILL: most often the OOM killer)", weight=GENERIC + 1,
        origin="kernel", name="sigkill"),
    Signature("host-memory", _re(
        r"NCCL WARN [^\n]*(?:failed to extend /dev/shm|shared memory segment|"
        r"posix_fallocate failed)|ncclShmOpen|Error while (?:creating|attaching to) shared "
        r"memory segment|failed to extend /dev/shm"),
        "NCCL could not create its shared-memory segment (/dev/shm full or too small)",
        fatal=False, default_phase="starting", origin="nccl"),
    Signature("host-memory", _re(
        r"\[Errno 12\] Cannot allocate memory|std::bad_alloc|^MemoryError\b|"
        r"\bMemoryError: "),
        "the host ran out of memory (ENOMEM: RAM, a container limit or /dev/shm)"),
    Signature("port-in-use", _re(r"error while attempting to bind on address .*address "
                                 r"already in use"),
              "the server's port is already taken", phase="http", origin="uvicorn"),
    Signature("port-in-use", _re(r"\b\w+ at \d+ is not available in \d+ seconds"),
              "a port the server needs is held by another process (checked at launch)",
              default_phase="starting", source="is not available in {timeout_s} seconds",
              origin="sglang"),
    Signature("port-in-use", _re(r"[Aa]ddress already in use|EADDRINUSE|[Pp]ort \d+ is "
                                 r"(?:already )?in use|is not available\. Please"),
              "a port the server needs is already taken", default_phase="http"),
    # argparse (launch_server, `sglang serve`) and the diffusion ServerArgs' own SystemExit
    Signature("bad-args", _re(
        r"^(?:[\w.\- ]+: )?error: (?:unrecognized arguments: |argument -{1,2}[\w-]+|the "
        r"following arguments are required|one of the arguments|ambiguous option)"),
        "a launch flag is unknown to this SGLang or has an invalid value", phase="starting"),
    Signature("cuda-driver", _re(
        r"CUDA driver version is insufficient|cudaErrorInsufficientDriver|Found no NVIDIA "
        r"driver|NVIDIA driver on your system is too old|No CUDA GPUs are available|"
        r"cudaErrorNoDevice|no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE|"
        r"CUDA unknown error - this may be due to an incorrectly set up environment|"
        r"NVML_SUCCESS == r INTERNAL ASSERT FAILED|cudaErrorDevicesUnavailable|"
        r"CUDA-capable device\(s\) is/are busy or unavailable"),
        "the process could not reach the GPUs through the NVIDIA driver",
        default_phase="starting", origin="torch"),
    # the driver's own library missing (a container without the GPU libraries mounted)
    Signature("cuda-driver", _re(
        r"^(?:- )?(?:ImportError|OSError): [^\n]*lib(?:cuda|nvidia-ml)\.so[.\d]*: cannot open"),
        "the NVIDIA driver's library (libcuda/libnvidia-ml) is missing",
        default_phase="starting", origin="torch"),
    # a compiled package that does not load: built for another torch/CUDA, or a library
    # missing (the exception itself, or sgl_kernel's summary of its import attempts)
    Signature("broken-install", _re(
        r"^(?:- )?(?:ImportError|OSError): [^\n]*(?:undefined symbol: |cannot open shared "
        r"object file|version `GLIBC\w*_[\d.]+' not found)|Could not load any common_ops "
        r"library"),
        "a compiled package of the environment does not load", default_phase="starting"),
    # NVML's own complaints: some are printed as warnings by processes that go on
    Signature("cuda-driver", _re(
        r"Failed to initialize NVML|NVMLError_(?:DriverNotLoaded|LibraryNotFound|NoPermission)|"
        r"NVML Shared Library Not Found"),
        "NVML (the driver's management library) could not be used", weight=EVIDENCE,
        fatal=False, default_phase="starting"),
    Signature("model-load", _re(
        r"does not recognize this architecture|Model architectures? \[[^\]]*\] (?:are|is) not "
        r"supported|Unrecognized model in|is not a local folder and is not a valid model "
        r"identifier|Cannot find any model weights|SafetensorError|Error while deserializing "
        r"header|size mismatch for|[Uu]nsupported (?:model|quantization method)|"
        r"no file named [\w.]+ found in directory"),
        "the model could not be loaded", default_phase="loading"),
    Signature("model-load", _re(r"Ignore import error when loading sglang\.srt\.models\."),
              "the model's implementation failed to import (its architecture is then unknown)",
              weight=EVIDENCE, fatal=False, default_phase="loading",
              source="Ignore import error when loading ", origin="sglang"),
    # ---- crashes with no better name ---------------------------------------------------
    Signature("other", _re(r"Fatal Python error: |^Segmentation fault|\bBus error\b|"
                           r"SIGSEGV|"
                           r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|"
                           r"^Extension modules: "),
              "a native crash (segfault/bus error/abort)", weight=NCCL),
    Signature("other", _re(r"TCPStore[^\n]*(?:Connection reset by peer|shut down too early)|"
                           r"Connection reset by peer[^\n]*TCPStore"),
              "the rank-0 TCPStore went away (the master node's process exited)",
              weight=NCCL, default_phase="serving", origin="torch"),
    # ---- NCCL transport (after the refused peer: both often show) ----------------------
    Signature("nccl-p2p", _re(
        r"NCCL error: unhandled (?:system|cuda) error|ncclSystemError|ncclUnhandledCudaError|"
        r"ncclInternalError|ncclInvalidUsage"),
        "NCCL failed to set up its GPU-to-GPU transport (P2P/topology)", weight=NCCL,
        default_phase="starting", origin="nccl"),
    Signature("nccl-p2p", _re(
        r"NCCL WARN [^\n]*(?:P2P|p2p|peer access|cudaIpc|Cuda failure|topology|NVLS)|"
        r"peer access is not supported"),
        "NCCL warned about GPU peer-to-peer transport (P2P/topology)", weight=NCCL,
        fatal=False, default_phase="starting", origin="nccl"),
    # ---- where it broke ------------------------------------------------------------------
    Signature("cuda-graph-capture", _re(
        r"Capture (?:cuda|CUDA) graph failed|operation not permitted when stream is capturing|"
        r"cudaErrorStreamCapture\w+|CUDA graph capture failed"),
        "CUDA graph capture failed", weight=WHERE, phase="capture",
        source="Capture cuda graph failed: ", origin="sglang"),
    Signature("autotune-crash", _re(r"FlashInfer autotune failed|\[AutoTuner\][^\n]*"
                                    r"(?:[Ee]xception|[Ee]rror|failed)"),
              "the FlashInfer autotune crashed", weight=WHERE, phase="autotune"),
    Signature("warmup-failed", _re(r"Initialization failed\. warmup error"),
              "the server's warmup request failed", weight=WHERE, phase="warmup",
              source="Initialization failed. warmup error", origin="sglang"),
    Signature("warmup-failed", _re(r"AssertionError: res=<Response \[[45]\d\d\]>"),
              "the warmup request got an HTTP error", weight=WHERE, phase="warmup"),
    Signature("warmup-failed", _re(
        r"^https?://\S+ \"(?:GET|POST) \S*/(?:get_model_info|model_info|generate) HTTP/[\d.]+\" "
        r"[45]\d\d"),
        "the warmup request got an HTTP error (retried until the warmup gives up)",
        weight=WHERE, fatal=False, phase="warmup"),
    # ---- generic: something raised ---------------------------------------------------
    Signature("scheduler-exception", _re(
        r"Scheduler hit an exception|Exception in run_tp_server|Exception in ModelTpServer|"
        r"TpModelWorkerClient hit an exception|DataParallelController hit an exception|"
        r"DetokenizerManager hit an exception"),
        "a scheduler (model worker) raised an exception", weight=GENERIC,
        source="Scheduler hit an exception: ", origin="sglang"),
    # a collector's record (`ERROR scheduler.run_scheduler_process: ...`) cut after the
    # logger: run_scheduler_process logs at ERROR only that exception
    Signature("scheduler-exception", _re(r"^scheduler\.run_sch\w*$"),
              "a scheduler (model worker) raised an exception", weight=GENERIC),
    Signature("other", _re(r"^terminate called after throwing an instance of|^(?:Killed|"
                           r"已杀死)$"),
              "the process was aborted", weight=GENERIC - 5),
    # ---- teardown: a consequence, never the cause --------------------------------------
    Signature("other", _re(r"Received sigquit from a child proces"),
              "a child process failed and the server tore itself down (SIGQUIT)",
              weight=TEARDOWN, name="sigquit-teardown",
              source="Received sigquit from a child process. It usually means the child "
                     "failed.", origin="sglang"),
    Signature("other", _re(r"scheduler is dead|scheduler died during initialization|"
                           r"Initialization failed\. Please see the error messages above"),
              "a scheduler process died", weight=TEARDOWN, name="scheduler-died",
              source="scheduler died during initialization", origin="sglang"),
)

#: a cheap pre-filter (one search for any of these literals): a message holding none of
#: them matches no signature, so most lines cost one search, not one per signature
_NEEDLES = (
    "of memory", "OfMemory", "enough memory", "MemoryAllocation", "ALLOC_FAILED",
    "allocate memory", "profiled value -", "max_total_num_tokens=-", "atchdog", "Timeout(ms)",
    "NCCL error", "NCCL WARN", "ncclComm", "ncclSystem", "ncclRemote", "ncclUnhandled",
    "ncclInternal", "ncclInvalid", "onnection", "onnect to", "Connect:", "socketPollConnect",
    "socketStartConnect", "No route to host", "connect() timed out", "remote process exited",
    "connectFullMesh", "gloo", "Ninja build", "build stopped", "ninja exited", "'ninja'",
    "uilding extension", "nvcc", "DeepGEMM", "flashinfer.jit", "JIT compil", "FAILED: ",
    "kernel image", "NoKernelImage", "invalid device function", "nsupported", "not supported",
    "compatible with the current", "requires compute", "requires sm", "xit code", "signal 9",
    "signal=KILL", "9/KILL", "Killed", "oom-kill", "oom_reaper", "已杀死", "bind on address",
    "already in use", "EADDRINUSE", "is in use", "not available.",
    "recognize this architecture", "Model architecture", "Unrecognized model",
    "model identifier", "model weights", "SafetensorError", "deserializing header",
    "size mismatch", "no file named", "Ignore import error", "Fatal Python error",
    "Segmentation fault", "Bus error", "illegal memory", "IllegalAddress",
    "misaligned address", "Memory access fault", "launch failure", "Health check failed",
    "illegal instruction", "batch size", "request slots", "KVPoolOOM", "no GPU memory",
    "SIGSEGV", "most recent call first", "Extension modules: ", "TCPStore", "graph failed",
    "graph capture failed", "stream is capturing", "StreamCapture", "autotune failed",
    "[AutoTuner]", "Initialization failed", "Response [", "hit an exception", "Exception in ",
    "terminate called", "sigquit", "is dead", "died during", "scheduler.run_sch", "c10d",
    "socket has timed out", "DistNetworkError", "DistStoreError", "shared memory seg",
    "/dev/shm", "is not available in", "error: ", "driver", "No CUDA GPUs", "NoDevice",
    "CUDA-capable", "NO_DEVICE", "CUDA unknown error", "NVML", "busy or unavailable",
    "DevicesUnavailable", "CalledProcessError", "PTXAS", "PTX codegen", "ptxas",
    "undefined symbol", "shared object", "GLIBC", "common_ops",
)


_NEEDLE_RE = re.compile("|".join(re.escape(n) for n in sorted(_NEEDLES, key=len, reverse=True)))


def match_signature(msg: str) -> Signature | None:
    """The first signature (in table order: specific ones first) matching one message."""
    head = msg[:2048]    # a very long line (server_args=...) is no error message
    if _NEEDLE_RE.search(head) is None and not head.startswith("http"):
        return None
    return next((sig for sig in SIGNATURES if sig.pattern.search(msg)), None)


def line_phase(msg: str) -> str | None:
    """The phase a line proves through any signature, not only the first that matches it:
    ``Capture cuda graph failed: RuntimeError: CUDA error: an illegal memory access`` is
    named by its cause but still proves the capture."""
    return next((s.phase for s in SIGNATURES if s.phase and s.pattern.search(msg)), None)


# ---------------------------------------------------------------------------------------
# the phase a traceback frame belongs to
# ---------------------------------------------------------------------------------------

_FRAME_PHASES = {
    "starting": ("init_torch_distributed", "initialize_model_parallel",
                 "init_distributed_environment", "init_model_parallel_group",
                 "ncclCommInitRank", "init_process_group", "prepare_server_args",
                 "rendezvous", "_store_based_barrier"),
    "loading": ("load_model", "load_weights", "weight_loader", "get_model",
                "_initialize_model", "load_weights_and_postprocess", "_load_weights",
                "download_weights_from_hf", "from_pretrained", "_prepare_weights",
                "safetensors_weights_iterator"),
    "kv_cache": ("init_memory_pool", "profile_max_num_token", "init_memory_pool_and_cache"),
    "autotune": ("kernel_warmup", "_flashinfer_autotune", "flashinfer_autotune",
                 "_run_flashinfer_autotune"),
    "capture": ("init_cuda_graphs", "init_device_graphs", "capture", "capture_one_batch_size",
                "init_piecewise_cuda_graphs", "_capture_graph", "capture_one_graph"),
    "warmup": ("_execute_server_warmup", "_wait_and_warmup", "warmup_thread"),
    "serving": ("event_loop_normal", "event_loop_overlap", "event_loop_pp",
                "event_loop_normal_disagg_prefill", "event_loop_normal_disagg_decode",
                "event_loop_overlap_disagg_prefill", "event_loop_overlap_disagg_decode",
                "forward_thread_func", "forward_thread_func_", "process_batch_result",
                "process_batch_result_decode", "process_batch_result_prefill", "run_batch",
                "resolve_batch_result", "recv_requests", "process_input_requests",
                "handle_generate_request", "run_event_loop", "dispatch_event_loop",
                "get_next_batch_to_run", "get_new_batch_prefill", "update_running_batch",
                "get_model_worker_batch", "forward_batch_generation",
                "forward_batch_speculative_generation", "resolve_last_batch_result"),
}
_PHASE_OF_FUNC = {f: p for p, fs in _FRAME_PHASES.items() for f in fs}
#: frames that say little: the scheduler process's entry point is the outermost frame of
#: every scheduler traceback, so it names a phase (its start) only when nothing else does
#: (an error raised in it directly, e.g. `faulthandler.enable()` under ENOMEM)
_WEAK_FRAME_PHASES = {"run_scheduler_process": "starting"}
# `File "x.py", line 3, in func` (traceback) or `File "x.py", line 3 in func` (faulthandler)
FRAME_RE = re.compile(r'File "[^"]*", line \d+(,?) in (\w+)')


_CALL_RE = re.compile(r"\b(\w+)\(")


def call_phase(code: str) -> str | None:
    """The phase of a call in a traceback's source line (``self.load_model()`` ->
    loading): the frame above it is cut or generic, the call says where it went."""
    return next((_PHASE_OF_FUNC[f] for f in _CALL_RE.findall(code) if f in _PHASE_OF_FUNC),
                None)


def frame_phase(msg: str) -> tuple[str | None, bool, str | None] | None:
    """For a traceback frame line: ``(phase, innermost_first, weak_phase)``: the phase when
    its function marks one, True for faulthandler dumps (most recent call first), and the
    phase it marks only when nothing else does. None for a line that is no frame."""
    m = FRAME_RE.search(msg)
    if m is None:
        return None
    func = m.group(2)
    return _PHASE_OF_FUNC.get(func), m.group(1) == "", _WEAK_FRAME_PHASES.get(func)


# ---------------------------------------------------------------------------------------
# the diagnosis
# ---------------------------------------------------------------------------------------


@dataclass
class Hit:
    sig: Signature
    index: int          # number of the piece in the log
    line: str           # redacted, as shown
    msg: str            # without prefixes
    after_ready: bool
    phase: str | None = None   # the phase the line proves (its own signature's, else another's)


def diagnose(hits: list[Hit], frames: list[tuple[str, bool, bool]],
             exc_lines: list[ExcLine], *, bare_traceback: bool,
             phase_reached: str | None, weak_phase: str | None = None) -> dict[str, Any]:
    """The failure from what a tracker collected: ``hits`` (signature matches),
    ``frames`` (``(phase, innermost_first, after_ready)`` of traceback frames that
    mark a phase), ``exc_lines`` (:class:`ExcLine`), ``bare_traceback`` (a traceback with
    no verdict counts as a failure), ``phase_reached`` (by the markers, None if none seen),
    ``weak_phase`` (of a frame that marks a phase only when nothing else does).

    The cause is the heaviest signature (earliest among equals); when none names one and
    the start failed on an exception nothing catalogued matches, the cause is that
    exception itself (:func:`firsterror.first_error`). The phase: ``serving`` if the first fatal
    line came after ready, else the outermost frame that marks a phase, else a line that
    proves one, else the phase reached, else the cause's usual phase."""
    # SGLang's teardown kills its process tree: a SIGKILL after it names no cause
    teardown = next((h.index for h in hits if h.sig.name == "sigquit-teardown"), float("inf"))
    hits = [h for h in hits if h.sig.name != "sigkill" or h.index < teardown]
    fatal_hits = [h for h in hits if h.sig.fatal]
    if not (fatal_hits or bare_traceback):
        return {"failed": False, "phase": None, "cause": None, "summary": None, "fix": None,
                "evidence": []}
    first_fatal = fatal_hits[0] if fatal_hits else None
    after_ready = first_fatal.after_ready if first_fatal else False
    cands = fatal_hits + [h for h in hits if not h.sig.fatal and h.after_ready == after_ready]
    best = max(cands, key=lambda h: (h.sig.weight, -h.index)) if cands else None
    proven = min((h for h in cands if h.phase), key=lambda h: h.index, default=None)
    phase = "serving" if after_ready else (
        _frames_phase(frames) or (proven.phase if proven else None) or phase_reached
        or weak_phase or (best.sig.default_phase if best else None))
    exc = next((e for e in exc_lines if e.after_ready == after_ready), None)
    exc_text = exc.text if exc else None
    error = None
    cause: str | None
    if best is not None and best.sig.weight > GENERIC:
        cause, summary, detail = best.sig.cause, best.sig.summary, best.msg.strip() or None
        if detail and detail.endswith("(most recent call last):"):
            detail = exc_text  # `Initialization failed. warmup error: Traceback ...`: its end
    else:
        cause = GENERIC_BY_PHASE.get(phase or "")
        error = None if cause is not None or after_ready else first_error(
            exc_lines, lambda text: match_signature(text) is not None)
        if cause is None:
            cause = "scheduler-exception" if any(
                h.sig.cause == "scheduler-exception" for h in cands) else "other"
        summary = next((s.summary for s in SIGNATURES if s.cause == cause != "other" and
                        s.weight > GENERIC), None) or (best.sig.summary if best else
                                                       "the server failed")
        detail = exc_text or (best.msg.strip() if best else None)
    if detail and detail.endswith("(most recent call last):"):
        detail = None   # the header of a traceback whose end was cut off says nothing more
    shown = [h.line for h in (best, first_fatal) if h is not None] + [exc.line if exc else None]
    if error is not None:
        shown.insert(0, error["line"])
        cause, summary, detail = error["type"], error["summary"], None
    evidence = list(dict.fromkeys(x for x in shown if x))
    fix = PHASE_FIXES.get((cause, phase or "")) or CAUSE_FIXES.get(cause)
    return {"failed": True, "phase": phase, "cause": cause,
            "summary": summary + (f": {detail[:240]}" if detail else ""),
            "fix": fix if error is None else first_error_fix(error, phase),
            "evidence": evidence, "error": error}


def _frames_phase(frames: list[tuple[str, bool, bool]]) -> str | None:
    """The outermost frame before ready that marks a phase (faulthandler dumps list the
    innermost first: their last one)."""
    before = [(phase, inner) for phase, inner, after_ready in frames if not after_ready]
    return next((p for p, inner in before if not inner), before[-1][0] if before else None)

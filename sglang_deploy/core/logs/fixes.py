"""The fix of each cause of an SGLang server failure (pure): one line per cause id, a few
by (cause, phase) where the phase changes the fix. The causes themselves (their log
signatures) are in logcauses."""

from __future__ import annotations

__all__ = ["CAUSE_FIXES", "GENERIC_BY_PHASE", "PHASE_FIXES"]

#: where the phase changes the fix: an out-of-memory while the weights load is not helped by
#: a smaller KV cache (--mem-fraction-static reserves memory only after the weights are in)
PHASE_FIXES = {
    ("cuda-oom", "loading"): "the weights do not fit on the GPUs: spread the model over more "
                             "GPUs (--tp), use a quantised checkpoint, or free the GPUs "
                             "(`nvidia-smi` shows other processes); --mem-fraction-static "
                             "only sizes the KV cache, which comes after the weights",
    ("cuda-oom", "capture"): "lower --cuda-graph-max-bs (or --mem-fraction-static, which "
                             "leaves more room for the graphs), or --disable-cuda-graph",
    ("scheduler-exception", "serving"): "a scheduler (model worker) raised an exception "
                                        "while serving: the traceback names it; report it "
                                        "with the request that triggered it, and restart "
                                        "the service",
    ("cuda-oom", "serving"): "lower --mem-fraction-static, --max-running-requests or "
                             "--chunked-prefill-size (a batch needed more activation memory "
                             "than was left), and check `nvidia-smi` for other processes",
}
#: the fix of each cause (one line)
CAUSE_FIXES = {
    "cuda-oom": "lower --mem-fraction-static (and --cuda-graph-max-bs, --max-running-requests, "
                "--chunked-prefill-size), check `nvidia-smi` for other processes on the GPUs, "
                "or spread the model over more GPUs",
    "not-enough-memory": "the KV cache does not fit after the weights: raise "
                         "--mem-fraction-static, or lower --context-length / "
                         "--max-running-requests, or use more GPUs (--tp)",
    "nccl-p2p": "NCCL could not set up GPU peer-to-peer transport: check the topology "
                "(`nvidia-smi topo -m`), try NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1, and "
                "rerun with NCCL_DEBUG=INFO to see the failing transport",
    "nccl-peer-refused": "a peer rank did not answer: start (or check) the server on the "
                         "other node(s), and that --dist-init-addr, --nnodes and --node-rank "
                         "agree on every node and its port is reachable (firewall, "
                         "NCCL_SOCKET_IFNAME on the right interface)",
    "nccl-watchdog": "a collective operation hung until the NCCL watchdog killed it (a rank "
                     "stopped or deadlocked): look for the first rank that failed, check "
                     "GPU/NIC health (`nvidia-smi -q`, dmesg Xid), then restart; raise "
                     "--dist-timeout only if the operation is legitimately slow",
    "gloo-connection": "the gloo (CPU) process group lost a peer: a rank or node exited "
                       "first (read its log), or the network between nodes dropped; check "
                       "GLOO_SOCKET_IFNAME and the other node",
    "jit-build": "a JIT kernel build (FlashInfer/DeepGEMM, ninja + nvcc) failed: check that "
                 "the CUDA toolkit matches torch's CUDA version, that nvcc works for this GPU "
                 "arch, and clear the JIT cache (~/.cache/flashinfer, ~/.cache/deep_gemm)",
    "no-nvcc": "the JIT build needs nvcc: install the CUDA toolkit and put nvcc on PATH "
               "(or set CUDA_HOME) for the service",
    "autotune-crash": "the FlashInfer autotune (kernel warmup) crashed: rerun without it "
                      "(drop the autotune patch / --disable-flashinfer-autotune) and report "
                      "the traceback; check the kernel backend supports this GPU",
    "unsupported-arch": "the kernels were not built for this GPU's architecture: use a "
                        "wheel/image built for its compute capability (sm_XX), or another "
                        "attention/MoE backend (--attention-backend triton)",
    "cuda-graph-capture": "CUDA graph capture failed on an error that is no out-of-memory "
                          "(the exception names it): a Python error (TypeError, "
                          "AttributeError...) means this model's path through the attention "
                          "or MoE backend is broken in this version: try another "
                          "--attention-backend (e.g. triton) or another SGLang version; "
                          "--disable-cuda-graph starts without graphs (slower decode) and "
                          "shows whether it fails outside capture too; if the error was cut "
                          "off, lower --cuda-graph-max-bs",
    "warmup-failed": "the server's own warmup request failed: a 403/502 usually comes from "
                     "an HTTP proxy (set no_proxy=127.0.0.1,localhost for the service, or "
                     "unset http_proxy); otherwise the error above says why",
    "scheduler-exception": "a scheduler (model worker) failed while starting: the exception "
                           "at the end of its traceback names it, most often a flag, model or "
                           "SGLang version that do not go together; check the launch flags "
                           "for this model and version, or roll back to the known-good "
                           "configuration",
    "oom-killer": "the kernel's OOM killer ended the process (host RAM, not GPU memory): "
                  "check `dmesg -T | grep -i oom`, give the host/container more RAM or "
                  "lower CPU-side memory use (fewer --tp ranks per host, no --enable-"
                  "torch-compile, smaller --max-running-requests)",
    "host-memory": "the host or container ran out of RAM or of shared memory (/dev/shm): "
                   "check `free -g` and `df -h /dev/shm`, remove stale /dev/shm/nccl-* "
                   "files, give the container more memory and a larger /dev/shm (LXC: the "
                   "size of its /dev/shm tmpfs; docker: --shm-size or --ipc=host); "
                   "NCCL_SHM_DISABLE=1 avoids /dev/shm at some speed",
    "port-in-use": "another process holds the server's port: find it with `ss -ltnp` on the "
                   "host and stop it, or set `sglang_port` to a free port",
    "model-load": "the model could not be loaded: check the model path and files, that "
                  "this SGLang (and transformers) version supports the architecture, and "
                  "the quantization/dtype flags",
    "illegal-memory-access": "a GPU kernel touched memory it does not own (a kernel bug, not a "
                             "lack of memory; NCCL's watchdog only reports it): rerun with "
                             "CUDA_LAUNCH_BLOCKING=1 to name the kernel, then run without the "
                             "feature in play (speculative decoding, --disable-overlap-schedule, "
                             "another --attention-backend, --disable-cuda-graph, no "
                             "--enable-torch-compile), upgrade SGLang and report the traceback",
    "kv-pool-exhausted": "the KV cache (or request-slot) pool ran out while serving and the "
                         "scheduler could not retract (an SGLang scheduling bug more than a size "
                         "problem: page size > 1, overlap schedule, speculative decoding, hybrid "
                         "caches): upgrade SGLang; meanwhile lower --max-running-requests and "
                         "--chunked-prefill-size or run without the feature involved (--page-size 1,"
                         " --disable-overlap-schedule); do not lower --mem-fraction-static, which "
                         "shrinks the pool",
    "scheduler-hang": "a scheduler made no progress for --watchdog-timeout seconds (or did not "
                      "answer the health check): a hung kernel or collective, a deadlock or a "
                      "step that never ends; read the py-spy dump (install py-spy in the image) "
                      "and the other ranks' and nodes' logs for where it stuck, check GPU health "
                      "(`nvidia-smi`, dmesg Xid), restart; raise --watchdog-timeout only if steps "
                      "are legitimately that slow",
    "bad-args": "a launch flag is unknown to this SGLang version or has an invalid value: "
                "check `python -m sglang.launch_server --help` of the installed version (flags "
                "use dashes: --reasoning-parser), rename or drop flags that changed between "
                "versions, and fix the value the error names",
    "cuda-driver": "the process could not use the GPUs through the NVIDIA driver: check "
                   "`nvidia-smi` on the host and as the service (driver loaded, new enough "
                   "for torch's CUDA: `driver version is insufficient` means upgrade the "
                   "driver or use a build for an older CUDA; NVML driver/library mismatch "
                   "means reboot after a driver upgrade), that CUDA_VISIBLE_DEVICES names "
                   "existing GPUs, and that a container gets the GPUs (docker --gpus, LXC: "
                   "every /dev/nvidia* node)",
    "broken-install": "a compiled package of the environment does not load: `undefined "
                      "symbol` means sgl-kernel/flashinfer were built for another torch "
                      "(install the versions pinned together: reinstall the release from the "
                      "lock, `sglang-deploy rebuild`, not single upgrades); a missing lib*.so "
                      "means a CUDA runtime wheel (nvidia-*-cu12/cu13) or system library for "
                      "this CUDA major is absent",
    "other": "read the first error above (the relevant lines); nothing known matched it",
}

#: the cause of a failure that only says where it broke, by phase
GENERIC_BY_PHASE = {"capture": "cuda-graph-capture",
                    "autotune": "autotune-crash", "warmup": "warmup-failed",
                    "serving": "scheduler-exception"}

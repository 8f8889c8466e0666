"""The JIT toolchain the server compiles with at its first start (pure).

FlashInfer JIT-compiles its CUTLASS fused MoE for sm_120 (``fused_moe_120``, in no wheel the
lock installs) at the first MoE call, after the weights are loaded; SGLang's jit_kernel
(tvm-ffi) and DeepGEMM compile with the same toolkit. All three need nvcc (>= 12.9 for
compute capability 12.x, and the same CUDA major as torch's build, whose libcudart the
modules link), ninja and a host C++ compiler. So the toolchain is checked twice before the
server (re)starts:

- on the controller, before connecting (:func:`check_lock`): a lock that has torch names an
  nvcc (``cuda-toolkit[nvcc,...]``) of torch's CUDA major, unless ``sglang_env`` points
  ``CUDA_HOME`` at a toolkit of the host's own;
- on the host, after the release venv is installed (``remote/jit_check.py`` with the unit's
  environment, judged by :func:`diagnose`): the toolkit FlashInfer would resolve, its
  ``nvcc --version``, ninja, the C++ compiler and ``lib64/libcudart.so``.

A full kernel build is not part of the check.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core import lockfile, nvsmi, topo
from sglang_deploy.core.errors import DataError, SglangDeployError

#: nvcc that FlashInfer accepts for compute capability 12.x (it compiles ``compute_120f``)
MIN_NVCC_SM12 = (12, 9)
#: what to put in the release's .in file to get a pinned compiler of torch's CUDA 13.0
TOOLKIT_PIN = "cuda-toolkit[nvcc,nvvm,crt,cccl]==13.0.2"


class JitToolchainError(SglangDeployError):
    title = "JIT toolchain check failed"

    def headline(self) -> str:
        return f"{self.title}: {self.what}"


@dataclass(frozen=True)
class LockToolchain:
    """What a lock pins of the JIT toolchain (None: not pinned)."""

    torch: str | None
    torch_cuda: str | None  # the CUDA runtime torch depends on ("13.0.96")
    nvcc: str | None  # nvidia-cuda-nvcc[-cuXX] version ("13.0.88")

    @staticmethod
    def major(version: str | None) -> int | None:
        return int(version.split(".")[0]) if version else None


def lock_toolchain(lock_text: str) -> LockToolchain:
    """Read the torch, CUDA runtime and nvcc pins of a lock (CUDA 13 wheels have no suffix,
    CUDA 12 ones end in ``-cu12``), from the lock's one parsed form (``lockfile.Lock``)."""
    lock = lockfile.Lock.of(lock_text)
    return LockToolchain(
        torch=lock.version("torch"),
        torch_cuda=lock.version("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"),
        nvcc=lock.version("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12"))


def cuda_home_for(lock_text: str, site: str) -> str | None:
    """CUDA_HOME of a release whose lock pins the CUDA 13+ pip compiler: the wheels' common
    tree ``SITE/nvidia/cuMAJOR`` (FlashInfer never looks there by itself). None otherwise."""
    major = LockToolchain.major(lock_toolchain(lock_text).nvcc)
    return f"{site}/nvidia/cu{major}" if major and major >= 13 else None


#: systemd's own PATH for services, after the release venv's bin
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def toolchain_environment(cache_dir: str, venv_bin: str, cuda_home: str | None) -> dict[str, str]:
    """The unit's environment for the JIT: the release venv's bin first on PATH (the JIT runs
    a bare ``ninja``, the lock's), CUDA_HOME when the release has its own toolkit
    (:func:`cuda_home_for`; FlashInfer, SGLang's jit_kernel and DeepGEMM all read it), and
    tvm-ffi's cache (SGLang's JIT modules) under the persistent cache. The P2P decision and
    ``sglang_env`` override it."""
    return {"PATH": f"{venv_bin}:{SYSTEM_PATH}", "TVM_FFI_CACHE_DIR": f"{cache_dir}/tvm-ffi",
            **({"CUDA_HOME": cuda_home} if cuda_home else {})}


def check_lock(lock_text: str, lock_name: str, env: dict[str, Any]) -> None:
    """Raise ``DataError`` when a lock with torch has no nvcc of torch's CUDA major and
    ``sglang_env`` names no ``CUDA_HOME`` of the host's own (then the host check decides)."""
    pins = lock_toolchain(lock_text)
    if pins.torch is None or env.get("CUDA_HOME"):
        return
    torch_major = LockToolchain.major(pins.torch_cuda)
    if pins.nvcc is None:
        raise DataError(
            key="sglang_lock",
            what=f"the lock {lock_name} pins a CUDA compiler for the server's JIT (FlashInfer's "
                 "MoE kernels, SGLang's jit_kernel and DeepGEMM compile at the first start)",
            found=f"torch=={pins.torch} (CUDA runtime {pins.torch_cuda or '?'}) and no nvidia-cuda-nvcc",
            fix=f"add `{TOOLKIT_PIN}` (the cuda-toolkit version torch pins) to the lock's .in "
                "file and re-lock with `sglang-deploy lock locks/NAME.in`; or point "
                "`sglang_env: {CUDA_HOME: ...}` at a CUDA toolkit installed on the hosts")
    if torch_major is not None and LockToolchain.major(pins.nvcc) != torch_major:
        raise DataError(
            key="sglang_lock",
            what=f"the lock {lock_name} pins nvcc of torch's CUDA major ({torch_major}): the JIT "
                 "modules link the toolkit's libcudart, which must be the one torch loads",
            found=f"nvidia-cuda-nvcc {pins.nvcc}, torch=={pins.torch} with CUDA runtime {pins.torch_cuda}",
            fix="pin `cuda-toolkit[nvcc,nvvm,crt,cccl]==X` with X the cuda-toolkit version "
                f"torch itself pins (`{TOOLKIT_PIN}` for torch 2.11 cu130), and re-lock")


def lib64_links_command(venv: str) -> str:
    """Shell that gives each pip CUDA tree of VENV (``site-packages/nvidia/cuMAJOR``) the
    unversioned names the JIT's link step asks for (``-L$CUDA_HOME/lib64 -lcudart -lnvrtc``;
    the wheels ship only ``lib/libcudart.so.MAJOR``), and ``lib64/stubs/libcuda.so`` when the
    linker cannot see the driver's unversioned libcuda.so. Run once, at the release's install."""
    tree = shlex.quote(venv) + "/lib/python*/site-packages/nvidia/cu[0-9]*"
    return (
        f"for t in {tree}; do if [ -d \"$t/lib\" ]; then mkdir -p \"$t/lib64/stubs\"; "
        "for so in \"$t\"/lib/libcudart.so.[0-9]* \"$t\"/lib/libnvrtc.so.[0-9]*; do "
        "if [ -e \"$so\" ]; then n=${so##*/}; ln -sfn \"../lib/$n\" \"$t/lib64/${n%%.so.*}.so\"; fi; done; "
        "if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\\.so '; then "
        "d=$(ldconfig -p 2>/dev/null | awk '/libcuda\\.so\\.1 /{print $NF; exit}'); "
        "if [ -n \"$d\" ]; then ln -sfn \"$d\" \"$t/lib64/stubs/libcuda.so\"; fi; fi; fi; done")


def check_command(python: str, tool: str, site: str, env: dict[str, Any]) -> str:
    """The shell command that runs ``jit_check.py`` with the unit's environment."""
    return shlex.join([python, tool, "--site", site, "--env-json", json.dumps(env, sort_keys=True)])


def parse_output(stdout: str) -> dict[str, Any] | None:
    """The script's JSON object (its last JSON line), or None."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None


def compute_caps(query_csv: str | None) -> list[str]:
    """The distinct compute capabilities ("12.0") in the pre-flight's nvidia-smi
    ``--query-gpu`` output (empty when it did not parse: the pre-flight has failed then)."""
    try:
        rows = nvsmi.parse_query_csv(query_csv or "")
    except topo.ParseError:
        return []
    return sorted({str(r["compute_cap"]) for r in rows if r.get("compute_cap")})


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True)
class Problem:
    name: str
    found: str
    fix: str


def diagnose(result: dict[str, Any] | None, caps: list[str], venv_bin: str,
             error_text: str = "") -> list[Problem]:
    """Every reason the server's JIT would fail with this toolchain (empty: it would find
    everything it needs). ``caps``: the GPUs' compute capabilities from the pre-flight;
    ``error_text``: the script's stderr, shown when it printed no result."""
    if result is None:
        return [Problem("jit-check", "jit_check.py printed no result: "
                        + (error_text.strip()[-300:] or "no output"),
                        "check that the release venv's python runs on the host (re-run the "
                        "deploy to reinstall an incomplete release)")]
    out: list[Problem] = []
    home, nvcc = result.get("cuda_home"), result.get("nvcc")
    toolkit_fix = (f"deploy a lock with `{TOOLKIT_PIN}` (the deploy then sets CUDA_HOME to the "
                   "release's nvidia/cu13), or install CUDA Toolkit 13.x on the host "
                   "(`cuda-toolkit-13-0` from NVIDIA's apt repository) and set "
                   "`sglang_env: {CUDA_HOME: /usr/local/cuda-13.0}`")
    if home is None:
        out.append(Problem("cuda-home", "no CUDA toolkit: CUDA_HOME and CUDA_PATH are unset, no "
                           f"nvcc on PATH={result.get('path')}, no /usr/local/cuda (FlashInfer "
                           "would stop with `Could not find nvcc` after the model load)",
                           toolkit_fix))
    elif (rc := result.get("nvcc_rc")) != 0 or not result.get("nvcc_version"):
        how = "does not run" if rc is None else f"exited {rc}" if rc else "printed no release"
        source = result.get("cuda_home_from")
        fix = (f"point {source} at a CUDA 13.x toolkit (or remove it from `sglang_env`); or "
               if source in ("CUDA_HOME", "CUDA_PATH") else "") + toolkit_fix
        out.append(Problem(
            "nvcc", f"{nvcc} (CUDA home {home}, from {source}) {how}: "
                    f"{(result.get('nvcc_output') or '').strip()[-300:]}", fix))
    else:
        version = result["nvcc_version"]
        if any(c.split(".")[0] == "12" for c in caps) and _version(version) < MIN_NVCC_SM12:
            out.append(Problem(
                "nvcc-version", f"{nvcc} is CUDA {version}; GPUs of compute capability "
                f"{', '.join(caps)} need nvcc >= {'.'.join(map(str, MIN_NVCC_SM12))} (FlashInfer "
                "compiles compute_120f)", toolkit_fix))
        torch_cuda = result.get("torch_cuda")
        if torch_cuda and _version(torch_cuda)[0] != _version(version)[0]:
            out.append(Problem(
                "nvcc-torch", f"{nvcc} is CUDA {version}, the release's torch is built for CUDA "
                f"{torch_cuda}: the JIT modules would link a different libcudart than torch loads",
                f"a CUDA {_version(torch_cuda)[0]}.x toolkit: {toolkit_fix}"))
        if not result.get("libcudart"):
            out.append(Problem(
                "libcudart", f"{home}/lib64/libcudart.so does not exist (the JIT links "
                f"-L{home}/lib64 -lcudart)",
                f"`ln -s ../lib/libcudart.so.{_version(version)[0]} {home}/lib64/libcudart.so` "
                "(the deploy makes these links when it installs a release with the pip toolkit); "
                "for a system toolkit install its cudart development package"))
    if not result.get("ninja"):
        out.append(Problem("ninja", f"no `ninja` on the service's PATH={result.get('path')}",
                           f"keep {venv_bin} (the lock's ninja) on the unit's PATH (an "
                           "`sglang_env` PATH replaces it), or `apt-get install ninja-build`"))
    if not result.get("cxx"):
        out.append(Problem("c++", f"no C++ compiler `{result.get('cxx_name')}` on the service's "
                           f"PATH={result.get('path')} (nvcc's host compiler and the JIT's linker)",
                           "`apt-get install g++` on the host"))
    return out


def error_for(host: str, problems: list[Problem]) -> JitToolchainError:
    return JitToolchainError(
        what=f"on {host} the server's JIT compilers (nvcc, ninja, c++) are usable before it "
             "(re)starts; nothing was started",
        found="\n".join(f"{p.name}: {p.found}" for p in problems),
        fix="\n".join(f"{p.name}: {p.fix}" for p in problems))


def summary(result: dict[str, Any]) -> str:
    torch = f", torch CUDA {result['torch_cuda']}" if result.get("torch_cuda") else ""
    return (f"JIT toolchain: nvcc {result.get('nvcc_version')} ({result.get('nvcc')}){torch}, "
            f"ninja {result.get('ninja')}, {result.get('cxx_name')} {result.get('cxx')}")

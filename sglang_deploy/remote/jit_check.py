#!/usr/bin/env python3
"""What the server's JIT compilers will find on this host, in the service's environment.

Run on the host with the RELEASE venv's python, before the service (re)starts:

  jit_check.py --site SITE_PACKAGES --env-json '{"CUDA_HOME": "...", "PATH": "..."}'

FlashInfer (its CUTLASS MoE for sm_120 and its other JIT modules), SGLang's jit_kernel
(tvm-ffi) and DeepGEMM compile CUDA code at the server's first start with nvcc, ninja and
a C++ compiler. They find the CUDA toolkit the same way, reproduced here with the unit's
environment (not this process's): CUDA_HOME, else CUDA_PATH, else the directory above the
first `nvcc` on PATH, else /usr/local/cuda when it exists. Nothing is compiled: this reads
`nvcc --version`, looks up `ninja` and the C++ compiler (CXX, else `c++`) on the unit's
PATH, checks that CUDA_HOME/lib64 has the libcudart.so the JIT's link step names, and reads
torch's CUDA version from SITE/torch/version.py without importing torch.

Prints one JSON object (stdlib only; the caller judges it):

  {"cuda_home": PATH|null, "cuda_home_from": "CUDA_HOME"|"CUDA_PATH"|"PATH"|"default"|null,
   "nvcc": PATH|null, "nvcc_rc": N|null, "nvcc_version": "13.0"|null, "nvcc_output": "...",
   "torch": true|false, "torch_cuda": "13.0"|null, "ninja": PATH|null,
   "cxx_name": "c++", "cxx": PATH|null, "libcudart": true|false, "path": "..."}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cuda_home(env: dict) -> tuple[str | None, str | None]:
    """(the CUDA home FlashInfer, tvm-ffi and DeepGEMM resolve, where it came from)."""
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(key):
            return env[key], key
    nvcc = shutil.which("nvcc", path=env.get("PATH", DEFAULT_PATH))
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), "PATH"
    if os.path.isdir("/usr/local/cuda"):
        return "/usr/local/cuda", "default"
    return None, None


def torch_cuda(site: str) -> tuple[bool, str | None]:
    """(torch is installed, the CUDA version it was built for) from torch/version.py."""
    try:
        with open(os.path.join(site, "torch", "version.py")) as fh:
            text = fh.read()
    except OSError:
        return os.path.isdir(os.path.join(site, "torch")), None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return True, m.group(1) if m else None


def nvcc_version(nvcc: str, env: dict) -> tuple[int | None, str | None, str]:
    """(exit status or None if it could not run, "X.Y" or None, its output's tail)."""
    try:
        proc = subprocess.run([nvcc, "--version"], check=False, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, str(exc)
    out = (proc.stdout + proc.stderr).strip()
    m = re.search(r"release (\d+)\.(\d+),", out)
    return proc.returncode, f"{m.group(1)}.{m.group(2)}" if m else None, out[-600:]


def gather(site: str, env: dict) -> dict:
    path = env.get("PATH", DEFAULT_PATH)
    home, source = cuda_home(env)
    nvcc = env.get("FLASHINFER_NVCC") or (os.path.join(home, "bin", "nvcc") if home else None)
    rc, version, output = (None, None, "") if nvcc is None else nvcc_version(nvcc, env)
    has_torch, tcuda = torch_cuda(site)
    cxx_name = env.get("CXX") or "c++"
    return {
        "cuda_home": home, "cuda_home_from": source, "nvcc": nvcc, "nvcc_rc": rc,
        "nvcc_version": version, "nvcc_output": output, "torch": has_torch, "torch_cuda": tcuda,
        "ninja": shutil.which("ninja", path=path), "cxx_name": cxx_name,
        "cxx": shutil.which(cxx_name, path=path),
        "libcudart": bool(home) and os.path.exists(os.path.join(home, "lib64", "libcudart.so")),
        "path": path,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, help="site-packages of the release venv")
    parser.add_argument("--env-json", required=True, help="the service's environment (JSON object)")
    args = parser.parse_args(argv)
    env = {str(k): str(v) for k, v in json.loads(args.env_json).items()}
    env.setdefault("PATH", DEFAULT_PATH)
    print(json.dumps(gather(args.site, env), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build the libcuda.so.1 stand-in (testbed/gpu/libcuda_stub.c) against the real cuda.h.

    python -m testbed.gpu.build OUT_DIR      # prints OUT_DIR/libcuda.so.1

The result is cached: OUT_DIR/libcuda.so.1.sha256 holds a hash of the source, cuda.h and the
command line; a rebuild only happens when one of them changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "libcuda_stub.c"
NVIDIA_SMI = HERE / "nvidia_smi.py"
SONAME = "libcuda.so.1"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-pthread",
          "-fvisibility=hidden"]


class BuildError(RuntimeError):
    pass


def _nvcc_target(nvcc: Path) -> Path:
    """Resolve symlinks, and one level of `exec /path/to/nvcc "$@"` wrapper scripts."""
    real = nvcc.resolve()
    try:
        head = real.read_bytes()[:4096]
    except OSError:
        return real
    if head.startswith(b"#!"):
        m = re.search(rb"exec\s+(\S*nvcc)\b", head)
        if m:
            return Path(m.group(1).decode()).resolve()
    return real


def find_cuda_include() -> Path:
    """Directory holding the real cuda.h: $CUDA_HOME, next to nvcc, /usr/local/cuda."""
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).parent.parent / "include")
        candidates.append(_nvcc_target(Path(nvcc)).parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda.h").is_file():
            return c
    raise BuildError(
        "cuda.h not found (looked in: " + ", ".join(str(c) for c in candidates) + "); "
        "install the CUDA toolkit headers or set CUDA_HOME"
    )


def _command(include: Path, out: Path) -> list[str]:
    cc = os.environ.get("CC", "gcc")
    return [cc, *CFLAGS, f"-I{include}", f"-Wl,-soname,{SONAME}", "-o", str(out), str(SOURCE)]


def _cached_build(out: Path, inputs: list[Path], command) -> bool:
    """Compile to OUT with ``command(path)`` unless OUT's stamp (OUT.sha256) holds the hash of
    INPUTS' contents and the command line; the compiler writes OUT.tmp, renamed into place.
    True when it compiled."""
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(path.read_bytes())
    digest.update("\0".join(command(out)).encode())
    want = digest.hexdigest()
    stamp = out.with_name(out.name + ".sha256")
    if out.is_file() and stamp.is_file() and stamp.read_text().strip() == want:
        return False
    tmp = out.with_name(out.name + ".tmp")
    cmd = command(tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise BuildError(f"{' '.join(cmd)} failed: {e}") from e
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    tmp.chmod(0o755)
    os.replace(tmp, out)
    stamp.write_text(want + "\n")
    return True


def build_libcuda(out_dir: Path) -> Path:
    """Compile the stand-in into out_dir/libcuda.so.1 (+ libcuda.so link); return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    include = find_cuda_include()
    lib = out_dir / SONAME
    _cached_build(lib, [SOURCE, include / "cuda.h"],
                  lambda out: _command(include, out))
    link = out_dir / "libcuda.so"
    if not (link.is_symlink() and os.readlink(link) == SONAME):
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(SONAME)
    return lib


# gpu.env as in docs/design.md; nvidia_smi.py and libcuda_stub.c use the same defaults
DEFAULT_GPU_ENV = {
    "GPU_COUNT": "8",
    "GPU_NAME": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "GPU_MEMORY_MIB": "97887",
    "GPU_CC": "12.0",
    "DRIVER_VERSION": "580.95.05",
    "CUDA_VERSION": "13.0",
    "SOCKETS": "2",
    "P2P_GBPS": "40",
    "SCENARIO": "healthy",
    "REPLAY_DIR": "",
}
SCENARIOS = ("healthy", "uvm-missing", "driver-mismatch", "gpu-missing", "p2p-unsupported",
             "p2p-corrupt", "p2p-slow",
             # GPU health fault profiles (nvidia-smi only; core.gpuhealth judges them)
             "ecc-uncorrectable", "remap-pending", "smi-err", "gpu-lost", "health-query-error")


def render_gpu_env(**overrides: str | float) -> str:
    """Text of /etc/testbed/gpu.env: the defaults, updated with `overrides`."""
    keys = dict(DEFAULT_GPU_ENV)
    keys.update({k: str(v) for k, v in overrides.items()})
    if keys["SCENARIO"] not in SCENARIOS:
        raise ValueError(f"unknown GPU scenario {keys['SCENARIO']!r} "
                         f"(one of {', '.join(SCENARIOS)})")
    return "".join(f"{k}={v}\n" for k, v in keys.items())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m testbed.gpu.build OUT_DIR", file=sys.stderr)
        return 2
    try:
        print(build_libcuda(Path(argv[0])))
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The service's environment (pure): what the systemd unit sets for the server."""

from __future__ import annotations

from collections.abc import Mapping

from sglang_deploy.core import data as datamod

#: systemd's own PATH for services, after the release venv's bin
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def service_environment(settings: datamod.Settings, nccl_env: Mapping[str, str],
                        venv_bin: str, cuda_home: str | None) -> list[tuple[str, str]]:
    """The unit's ``Environment=`` pairs, sorted.

    + venv_bin: the release venv's bin folder, first on PATH: the JIT runs a bare ``ninja``
      (the lock's)
    + cuda_home: the release's own CUDA toolkit (``jit.cuda_home_for``) or None; FlashInfer,
      SGLang's jit_kernel and DeepGEMM all read CUDA_HOME
    ``nccl_env`` (the pre-flight's P2P decision) and then ``sglang_env`` override the rest.
    """
    s = settings
    env = {
        "HOME": s.sglang_home,
        "PATH": f"{venv_bin}:{SYSTEM_PATH}",
        "SGLANG_CACHE_DIR": s.sglang_cache_dir,
        "FLASHINFER_WORKSPACE_BASE": s.sglang_cache_dir,
        "XDG_CACHE_HOME": s.sglang_cache_dir,
        "TRITON_CACHE_DIR": f"{s.sglang_cache_dir}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{s.sglang_cache_dir}/inductor",
        "TVM_FFI_CACHE_DIR": f"{s.sglang_cache_dir}/tvm-ffi",
        **({"CUDA_HOME": cuda_home} if cuda_home else {}),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **nccl_env,
        **{k: str(v) for k, v in s.sglang_env.items()},
    }
    return sorted(env.items())

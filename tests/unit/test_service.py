"""service.service_environment: the unit's environment, including the JIT toolchain's part."""

from __future__ import annotations

import pytest

from sglang_deploy.core import data as datamod
from sglang_deploy.core.service import SYSTEM_PATH, service_environment

BIN = "/opt/sglang/releases/r1/venv/bin"
HOME = "/opt/sglang/releases/r1/venv/lib/python3.11/site-packages/nvidia/cu13"


def settings(**extra):
    return datamod.resolve({"sglang_model_path": "/srv/models/m", **extra}, environ={})


@pytest.mark.parametrize("extra, nccl, cuda_home, want, absent", [
    # the release's own toolkit: CUDA_HOME, the venv's bin (its ninja) first on PATH
    ({}, {}, HOME, {"CUDA_HOME": HOME, "PATH": f"{BIN}:{SYSTEM_PATH}",
                    "TVM_FFI_CACHE_DIR": "/var/cache/sglang/tvm-ffi"}, ()),
    # a lock without the pip compiler: no CUDA_HOME, FlashInfer's own lookup applies
    ({}, {}, None, {"PATH": f"{BIN}:{SYSTEM_PATH}"}, ("CUDA_HOME",)),
    # the operator's host toolkit wins over the release's
    ({"sglang_env": {"CUDA_HOME": "/usr/local/cuda-13.0"}}, {}, HOME,
     {"CUDA_HOME": "/usr/local/cuda-13.0"}, ()),
    # the pre-flight's P2P decision, and the tvm-ffi cache under another cache dir
    ({"sglang_cache_dir": "/data/cache"}, {"NCCL_P2P_DISABLE": "1"}, HOME,
     {"NCCL_P2P_DISABLE": "1", "TVM_FFI_CACHE_DIR": "/data/cache/tvm-ffi",
      "FLASHINFER_WORKSPACE_BASE": "/data/cache"}, ()),
])
def test_service_environment(extra, nccl, cuda_home, want, absent):
    env = service_environment(settings(**extra), nccl, venv_bin=BIN, cuda_home=cuda_home)
    assert env == sorted(env)
    got = dict(env)
    for key, value in want.items():
        assert got[key] == value
    for key in absent:
        assert key not in got
    assert got["HOME"] == "/var/lib/sglang" and got["HF_HUB_OFFLINE"] == "1"

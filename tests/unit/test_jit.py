"""core.jit and remote/jit_check.py: the JIT toolchain, checked on the controller (the lock)
and on the host (what FlashInfer's lookup finds in the unit's environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.core import jit
from sglang_deploy.core.errors import DataError
from sglang_deploy.remote import jit_check

REPO = Path(__file__).resolve().parents[2]


def lock(*pins: str) -> str:
    return "".join(f"{p} \\\n    --hash=sha256:{'a' * 64}\n" for p in ("sglang==0.5.12.post1", *pins))


def test_the_committed_production_lock_passes_and_its_release_gets_cuda_home():
    text = (REPO / "locks" / "glm5-blackwell.txt").read_text()
    jit.check_lock(text, "locks/glm5-blackwell.txt", {})
    pins = jit.lock_toolchain(text)
    assert (pins.major(pins.torch_cuda), pins.major(pins.nvcc)) == (13, 13)
    assert jit.cuda_home_for(text, "/s") == "/s/nvidia/cu13"


@pytest.mark.parametrize("pins, env, error", [
    (("torch==2.11.0", "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-nvcc==13.0.88"), {}, None),
    (("torch==2.11.0", "nvidia-cuda-runtime==13.0.96"), {}, "no nvidia-cuda-nvcc"),
    # a toolkit of the host's own, named by the operator: the host check decides
    (("torch==2.11.0", "nvidia-cuda-runtime==13.0.96"), {"CUDA_HOME": "/usr/local/cuda"}, None),
    (("torch==2.11.0", "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-nvcc-cu12==12.9.86"), {},
     "nvidia-cuda-nvcc 12.9.86"),
    (("torch==2.9.1", "nvidia-cuda-runtime-cu12==12.8.90", "nvidia-cuda-nvcc-cu12==12.9.86"), {}, None),
    # no torch (a client-only lock, the testbed's): nothing to compare with
    (("nvidia-cuda-nvcc==13.0.88",), {}, None),
    ((), {}, None),
])
def test_check_lock(pins, env, error):
    if error is None:
        jit.check_lock(lock(*pins), "locks/x.txt", env)
        return
    with pytest.raises(DataError, match="sglang_lock") as err:
        jit.check_lock(lock(*pins), "locks/x.txt", env)
    assert error in err.value.found and "cuda-toolkit[nvcc,nvvm,crt,cccl]" in str(err.value)


@pytest.mark.parametrize("pins, want", [
    (("nvidia-cuda-nvcc==13.0.88",), "/s/nvidia/cu13"),
    (("nvidia-cuda-nvcc-cu12==12.9.86",), None),  # the cu12 wheels have no shared tree
    ((), None),
])
def test_cuda_home_for(pins, want):
    assert jit.cuda_home_for(lock(*pins), "/s") == want


GOOD = {"cuda_home": "/v/nvidia/cu13", "cuda_home_from": "CUDA_HOME", "nvcc": "/v/nvidia/cu13/bin/nvcc",
        "nvcc_rc": 0, "nvcc_version": "13.0", "nvcc_output": "release 13.0, V13.0.88",
        "torch": True, "torch_cuda": "13.0", "ninja": "/v/bin/ninja", "cxx_name": "c++",
        "cxx": "/usr/bin/c++", "libcudart": True, "path": "/v/bin:/usr/bin"}


@pytest.mark.parametrize("change, caps, names, words", [
    ({}, ["12.0"], [], ""),
    ({"cuda_home": None, "cuda_home_from": None, "nvcc": None, "nvcc_rc": None,
      "nvcc_version": None}, ["12.0"], ["cuda-home"], "Could not find nvcc"),
    ({"cuda_home": "/nowhere", "nvcc": "/nowhere/bin/nvcc", "nvcc_rc": None, "nvcc_version": None,
      "nvcc_output": "[Errno 2] No such file or directory: '/nowhere/bin/nvcc'"}, ["12.0"], ["nvcc"],
     "No such file"),
    ({"nvcc_version": "12.8"}, ["12.0"], ["nvcc-version", "nvcc-torch"], ">= 12.9"),
    ({"nvcc_version": "12.8", "torch_cuda": "12.8"}, ["9.0"], [], ""),  # not an sm_12x GPU
    ({"nvcc_version": "12.9"}, ["12.0"], ["nvcc-torch"], "torch is built for CUDA 13.0"),
    ({"torch": False, "torch_cuda": None, "nvcc_version": "12.9"}, ["12.0"], [], ""),
    ({"ninja": None}, ["12.0"], ["ninja"], "ninja-build"),
    ({"cxx": None}, ["12.0"], ["c++"], "apt-get install g++"),
    ({"libcudart": False}, ["12.0"], ["libcudart"], "libcudart.so.13"),
    ({"ninja": None, "cxx": None, "nvcc_rc": 1}, ["12.0"], ["nvcc", "ninja", "c++"], "exited 1"),
])
def test_diagnose(change, caps, names, words):
    problems = jit.diagnose({**GOOD, **change}, caps, "/v/bin")
    assert [p.name for p in problems] == names
    if problems:
        err = jit.error_for("h1", problems)
        assert words in str(err) and "nothing was started" in str(err)


def test_diagnose_without_a_result_names_the_scripts_error():
    problems = jit.diagnose(None, ["12.0"], "/v/bin", error_text="Traceback...\nSyntaxError: x")
    assert [p.name for p in problems] == ["jit-check"] and "SyntaxError" in problems[0].found


def test_compute_caps():
    csv = "0, NVIDIA RTX PRO 6000, GPU-0, 580.95.05, 97887, 12.0, 00000000:01:00.0\n"
    assert jit.compute_caps(csv) == ["12.0"]
    assert jit.compute_caps(None) == [] and jit.compute_caps("garbage") == []


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def tree(tmp_path):
    """A release venv's site-packages with a pip CUDA tree whose nvcc answers like 13.0's."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    home = site / "nvidia" / "cu13"
    _exe(home / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (home / "lib").mkdir()
    (home / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    _exe(tmp_path / "bin" / "ninja", "#!/bin/sh\n")
    _exe(tmp_path / "bin" / "c++", "#!/bin/sh\n")
    return site, home, tmp_path / "bin"


def test_lib64_links_then_the_host_script_finds_everything(tree):
    site, home, bin_ = tree
    subprocess.run(["sh", "-c", jit.lib64_links_command(str(site.parents[2]))], check=True)
    assert os.readlink(home / "lib64" / "libcudart.so") == "../lib/libcudart.so.13"
    env = {"CUDA_HOME": str(home), "PATH": f"{bin_}:/usr/bin:/bin"}
    out = subprocess.run([sys.executable, jit_check.__file__, "--site", str(site),
                          "--env-json", json.dumps(env)], capture_output=True, text=True, check=True)
    result = jit.parse_output(out.stdout)
    assert result["nvcc_version"] == "13.0" and result["torch_cuda"] == "13.0"
    assert result["libcudart"] and result["ninja"] == str(bin_ / "ninja")
    assert jit.diagnose(result, ["12.0"], str(bin_)) == []


@pytest.mark.parametrize("env, source", [
    ({"CUDA_PATH": "{home}"}, "CUDA_PATH"),
    ({"PATH": "{home}/bin:/usr/bin"}, "PATH"),  # the directory above the first nvcc on PATH
    ({"CUDA_HOME": "/nowhere", "CUDA_PATH": "{home}"}, "CUDA_HOME"),
])
def test_cuda_home_is_resolved_like_flashinfer(tree, env, source):
    _, home, _ = tree
    env = {k: v.format(home=home) for k, v in env.items()}
    got, where = jit_check.cuda_home(env)
    assert where == source
    assert got == ("/nowhere" if source == "CUDA_HOME" else str(home))


def test_the_host_script_reports_cuda_home_pointing_nowhere(tree):
    site, _, bin_ = tree
    result = jit_check.gather(str(site), {"CUDA_HOME": "/nowhere", "PATH": f"{bin_}:/usr/bin"})
    assert result["nvcc"] == "/nowhere/bin/nvcc" and result["nvcc_rc"] is None
    assert [p.name for p in jit.diagnose(result, ["12.0"], str(bin_))] == ["nvcc"]


def test_the_controller_refuses_a_lock_without_the_jits_compiler_before_connecting(tmp_path):
    from types import SimpleNamespace

    from sglang_deploy.integration import hooks

    (tmp_path / "nonvcc.txt").write_text(lock("torch==2.11.0", "nvidia-cuda-runtime==13.0.96"))
    host = SimpleNamespace(name="h1", groups=(), data=SimpleNamespace(dict=lambda: {
        "sglang_model_path": "/srv/models/m", "sglang_lock": "nonvcc.txt"}))

    class Inventory(list):  # what validate_inventory reads of pyinfra's: hosts and groups
        groups: dict = {}

    inventory = Inventory([host])
    with pytest.raises(DataError, match=r"\[h1\].*pins a CUDA compiler") as err:
        hooks.validate_inventory(inventory, str(tmp_path))
    assert err.value.key == "sglang_lock"
    (tmp_path / "nonvcc.txt").write_text(lock("torch==2.11.0", "nvidia-cuda-runtime==13.0.96",
                                              "nvidia-cuda-nvcc==13.0.88"))
    hooks.validate_inventory(inventory, str(tmp_path))  # a new version of the file is read again


BIN = "/opt/sglang/releases/r1/venv/bin"
CU13 = "/opt/sglang/releases/r1/venv/lib/python3.11/site-packages/nvidia/cu13"


@pytest.mark.parametrize("cache, cuda_home, want", [
    # the release's own toolkit: CUDA_HOME, the venv's bin (its ninja) first on PATH
    ("/var/cache/sglang", CU13, {"CUDA_HOME": CU13, "PATH": f"{BIN}:{jit.SYSTEM_PATH}",
                                 "TVM_FFI_CACHE_DIR": "/var/cache/sglang/tvm-ffi"}),
    # a lock without the pip compiler: no CUDA_HOME, FlashInfer's own lookup applies
    ("/data/cache", None, {"PATH": f"{BIN}:{jit.SYSTEM_PATH}", "TVM_FFI_CACHE_DIR": "/data/cache/tvm-ffi"}),
])
def test_toolchain_environment(cache, cuda_home, want):
    assert jit.toolchain_environment(cache, BIN, cuda_home) == want


def test_the_operators_cuda_home_and_the_p2p_decision_win_in_the_unit():
    from sglang_deploy.core import data as datamod
    from sglang_deploy.core import service

    def environment(settings):
        toolchain = jit.toolchain_environment(
            settings.sglang_cache_dir, BIN,
            jit.cuda_home_for(lock("nvidia-cuda-nvcc==13.0.88"), CU13.rsplit("/nvidia", 1)[0]))
        return dict(service.service_environment(settings, {"NCCL_P2P_DISABLE": "1"}, toolchain))

    env = environment(datamod.resolve({"sglang_model_path": "/srv/models/m",
                                       "sglang_env": {"CUDA_HOME": "/usr/local/cuda-13.0"}}, environ={}))
    assert env["CUDA_HOME"] == "/usr/local/cuda-13.0" and env["NCCL_P2P_DISABLE"] == "1"
    assert env["PATH"].startswith(BIN + ":") and env["HOME"] == "/var/lib/sglang"
    assert environment(datamod.resolve({"sglang_model_path": "/srv/models/m"}, environ={}))["CUDA_HOME"] == CU13

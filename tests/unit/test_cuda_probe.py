"""remote/cuda_probe.py: stdlib-only, one JSON object, exit 0 whatever CUDA says.

Driven against the testbed's libcuda.so.1 stand-in (testbed/gpu/build.py, built from the real
cuda.h) through LD_LIBRARY_PATH; the stand-in reads $TESTBED_GPU_ENV and looks for device
nodes under $TESTBED_DEV_ROOT. The probe itself knows nothing about either.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.remote import CUDA_PROBE

REPO = Path(__file__).resolve().parents[2]


def run_probe(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    proc = subprocess.run([sys.executable, str(CUDA_PROBE), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # exactly one JSON object
    report = json.loads(lines[0])
    assert set(report) == {"ok", "library", "error", "driver_version", "device_count", "devices",
                           "p2p"}
    return report


# ----------------------------------------------------------------------------- no library needed


def test_script_is_shipped_and_stdlib_only_py39():
    src = CUDA_PROBE.read_text()
    tree = ast.parse(src, feature_version=(3, 9))  # runs on the hosts' python3 >= 3.9
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert "sglang_deploy" not in src and "testbed" not in src.lower().replace("stand-in", "")


def test_dlopen_failure_is_reported_not_raised(tmp_path):
    report = run_probe("--p2p", "--library", str(tmp_path / "libcuda.so.1"))
    assert report["ok"] is False
    assert report["error"]["call"] == "dlopen"
    assert "cannot open shared object file" in report["error"]["message"]
    assert report["library"] is None and report["devices"] == [] and report["p2p"] == []


def test_missing_libcuda_is_reported_as_dlopen(tmp_path):
    report = run_probe("--library", str(tmp_path / "libcuda.so.1"))
    assert report["ok"] is False
    assert report["error"]["call"] == "dlopen"


# ----------------------------------------------------------------------------- the stand-in


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testbed.gpu import build
    out = tmp_path_factory.mktemp("libcuda")
    try:
        build.build_libcuda(out)
    except (build.BuildError, FileNotFoundError, OSError) as exc:
        raise AssertionError(f"cannot build the libcuda stand-in: {exc}")
    return out


class Host:
    """gpu.env + a /dev root with (regular-file) device nodes, as the stand-in reads them."""

    def __init__(self, root: Path, libdir: Path, count: int = 8, uvm: bool = True,
                 ctl: bool = True, **keys: str) -> None:
        self.root, self.libdir = root, libdir
        dev = root / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        names = [f"nvidia{i}" for i in range(count)] + (["nvidiactl"] if ctl else []) + (
            ["nvidia-uvm"] if uvm else [])
        for name in names:
            (dev / name).touch()
        from testbed.gpu.build import render_gpu_env

        (root / "gpu.env").write_text(render_gpu_env(GPU_COUNT=str(count), **keys))

    def env(self) -> dict[str, str]:
        return dict(os.environ, LD_LIBRARY_PATH=str(self.libdir),
                    TESTBED_GPU_ENV=str(self.root / "gpu.env"),
                    TESTBED_DEV_ROOT=str(self.root / "dev"))

    def probe(self, *args: str, timeout: float = 120) -> dict:
        return run_probe(*args, env=self.env(), timeout=timeout)


def test_healthy_8_gpus_all_pairs_verified(tmp_path, libdir):
    report = Host(tmp_path, libdir).probe("--p2p", "--mib", "1", "--iters", "2")
    assert report["ok"] is True and report["error"] is None
    assert report["library"] == str(libdir / "libcuda.so.1")
    assert report["driver_version"] == 13000
    assert report["device_count"] == 8
    assert report["devices"][0] == {"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                    "cc": "12.0", "total_mem_mib": 97887}
    pairs = {(p["src"], p["dst"]) for p in report["p2p"]}
    assert pairs == {(s, d) for s in range(8) for d in range(8) if s != d}
    for p in report["p2p"]:
        assert p["can_access"] is True and p["verified"] is True and p["error"] is None, p
        assert 0 < p["gbps"] <= 45  # paced at P2P_GBPS=40


def test_without_p2p_flag_no_pairs(tmp_path, libdir):
    report = Host(tmp_path, libdir, count=2).probe()
    assert report["ok"] is True and report["device_count"] == 2 and report["p2p"] == []


def test_p2p_corrupt_is_caught(tmp_path, libdir):
    report = Host(tmp_path, libdir, count=3, SCENARIO="p2p-corrupt").probe("--p2p", "--mib", "1")
    assert report["ok"] is True  # CUDA reported no error: only the data check sees it
    assert len(report["p2p"]) == 6
    assert all(p["can_access"] is True and p["verified"] is False for p in report["p2p"])


def test_p2p_unsupported_copies_through_host(tmp_path, libdir):
    report = Host(tmp_path, libdir, count=2, SCENARIO="p2p-unsupported").probe("--p2p", "--mib", "1")
    assert [(p["can_access"], p["verified"]) for p in report["p2p"]] == [(False, True)] * 2


def test_p2p_slow_is_measured(tmp_path, libdir):
    report = Host(tmp_path, libdir, count=2, SCENARIO="p2p-slow", P2P_GBPS="40").probe(
        "--p2p", "--mib", "1", "--iters", "2")
    assert all(p["verified"] and p["gbps"] < 2.5 for p in report["p2p"]), report["p2p"]


def test_uvm_missing_scenario_is_999_at_cuinit(tmp_path, libdir):
    report = Host(tmp_path, libdir, SCENARIO="uvm-missing").probe("--p2p")
    assert report["ok"] is False
    assert report["error"] == {"call": "cuInit", "code": 999, "name": "CUDA_ERROR_UNKNOWN",
                               "message": "unknown error"}
    assert report["devices"] == [] and report["p2p"] == []


def test_absent_uvm_node_is_999_too(tmp_path, libdir):
    report = Host(tmp_path, libdir, uvm=False).probe()
    assert (report["error"]["call"], report["error"]["code"]) == ("cuInit", 999)


def test_driver_mismatch_is_803(tmp_path, libdir):
    report = Host(tmp_path, libdir, SCENARIO="driver-mismatch").probe()
    assert report["error"]["code"] == 803
    assert report["error"]["name"] == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"


def test_no_nvidiactl_is_no_device(tmp_path, libdir):
    report = Host(tmp_path, libdir, ctl=False).probe()
    assert (report["error"]["call"], report["error"]["code"]) == ("cuInit", 100)


def test_gpu_missing_scenario(tmp_path, libdir):
    report = Host(tmp_path, libdir, SCENARIO="gpu-missing").probe("--p2p", "--mib", "1",
                                                                 "--iters", "1")
    assert report["ok"] is True and report["device_count"] == 7 and len(report["p2p"]) == 42


def test_timeout_reports_the_hanging_call(tmp_path, libdir):
    host = Host(tmp_path, libdir, count=2, SCENARIO="p2p-slow", P2P_GBPS="1")
    report = host.probe("--p2p", "--mib", "8", "--timeout", "1", timeout=60)
    assert report["ok"] is False
    assert report["error"]["name"] == "TIMEOUT"
    assert report["error"]["call"] in ("cuMemcpyPeer", "cuCtxSynchronize", "cuMemcpyHtoD_v2",
                                       "cuMemcpyDtoH_v2")
    assert "GPU0 -> GPU1" in report["error"]["message"]
    assert report["device_count"] == 2  # what was learnt before the hang is kept

"""The JIT toolchain check on a testbed host: a release whose unit would give the server no
usable nvcc (CUDA_HOME pointing nowhere) stops the deploy after the release venv is installed
and BEFORE the service is started; the healthy release (the pip nvcc of locks/testbed.txt,
the venv's ninja, the container's g++) passes the same check and serves."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "pyinfra")
INVENTORY = Path(__file__).with_name("fault_inventory.py")


# this test is about the JIT: the simulated peer copies' speed follows this shared machine's
# load, so no P2P bandwidth minimum
DATA = {"gpu_p2p_min_gbps": 0}


def deploy(testbed, host: str, data: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([PYINFRA, "-y", str(INVENTORY), "deploy.py", "--limit", host], check=False,
                       cwd=REPO, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "FAULT_HOST_DATA": json.dumps({host: {**DATA, **(data or {})}})})
    testbed.log.append(r)
    return r


def test_no_usable_nvcc_stops_the_deploy_before_the_service_starts(testbed):
    host = testbed.hosts[0]
    testbed.wipe(host)
    r = deploy(testbed, host, {"sglang_env": {"CUDA_HOME": "/nonexistent/cuda"}})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "JIT toolchain check failed" in out, out[-3000:]
    assert "/nonexistent/cuda/bin/nvcc" in out and "cuda-toolkit[nvcc,nvvm,crt,cccl]" in out
    # the release venv was installed (the check runs in it), the service never started
    testbed.ssh(host, "ls /opt/sglang/releases/*/.complete", check=True)
    assert testbed.ssh(host, "systemctl show -p InvocationID --value sglang.service").stdout.strip() == ""
    assert testbed.ssh(host, "test -e /etc/systemd/system/sglang.service").returncode == 1
    # what the pip toolkit gets at install: the link names the JIT's link step asks for
    testbed.ssh(host, "test -e /opt/sglang/releases/*/venv/lib/python3.11/site-packages/"
                      "nvidia/cu13/lib64/libcudart.so", check=True)

    # the same host with the release's own toolkit: the check passes and the server serves
    r = deploy(testbed, host)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "JIT toolchain: nvcc 13.0" in out and "/venv/bin/ninja" in out
    unit = testbed.ssh(host, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "site-packages/nvidia/cu13" in unit and "TVM_FFI_CACHE_DIR=/var/cache/sglang/tvm-ffi" in unit

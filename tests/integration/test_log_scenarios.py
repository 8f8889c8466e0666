"""The live verifier on a real testbed host, against the simulator's failure scenarios that
speak like a real 8-rank server (testbed/sim/sim_faults.py): each deploy must stop with the
phase the failure belongs to and its cause, the fix and the lines that prove it.

One host (TESTBED_HOSTS=1 is enough): a first deploy makes it serve, then each scenario
stops the service, sets the scenario and deploys again (a restart: the startup verifier
runs). The after-ready scenarios strike on the verifier's own generation check."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "pyinfra")
HOST = f"{os.environ.get('TESTBED_PREFIX', 'tb')}1"
# the seed flags (group_data/all.py) with CUDA graphs on: the capture-oom scenario needs them
GRAPH_FLAGS = {"tp-size": 8, "quantization": "modelopt_fp4",
               "moe-runner-backend": "flashinfer_cutlass",
               "enable-flashinfer-allreduce-fusion": True, "trust-remote-code": True}

# scenario: (phase, cause, words of the proof in the output, extra deploy arguments)
SCENARIOS = {
    "capture-oom": ("capture", "cuda-oom", ["Capture cuda graph failed", "CUDA out of memory",
                                            "--mem-fraction-static"],
                    ["--data", f"sglang_flags={json.dumps(GRAPH_FLAGS)}"]),
    "rank-fail": ("loading", "cuda-oom", ["TP5] Scheduler hit an exception",
                                          "torch.OutOfMemoryError"], []),
    "nccl-watchdog": ("serving", "nccl-watchdog",
                      ["Watchdog caught collective operation timeout", "NCCL watchdog"], []),
    "warmup-502": ("warmup", "warmup-failed", ["Response [502]", "no_proxy"], []),
    "scheduler-exception": ("serving", "scheduler-exception",
                            ["event_loop_overlap", "IndexError"], []),
}


# the simulated P2P copy is slow on a busy machine: the pre-flight minimum is not under test
HOST_DATA = ["--data", "gpu_p2p_min_gbps=0.05", "--data", "gpu_p2p_test_mib=8"]


def deploy(testbed, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([PYINFRA, "-y", str(testbed.inventory), "deploy.py", "--limit", HOST,
                        *HOST_DATA, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       check=False)
    testbed.log.append(r)
    return r


@pytest.fixture(scope="module")
def serving(testbed):
    """HOST deployed and serving (the healthy scenario) before the faults."""
    testbed.scenario(HOST, "healthy")
    r = deploy(testbed)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return HOST


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_live_verifier_names_the_phase_and_cause(testbed, serving, scenario):
    phase, cause, words, extra = SCENARIOS[scenario]
    testbed.ssh(HOST, "systemctl stop sglang.service 2>/dev/null; true")
    testbed.scenario(HOST, scenario)
    try:
        r = deploy(testbed, *extra)
    finally:
        testbed.scenario(HOST, "healthy")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-4000:]
    assert f"phase `{phase}`" in out and f"phase reached: {phase}" in out, out[-4000:]
    assert f": {cause}: " in out, out[-4000:]
    for w in words:
        assert w in out, (w, out[-4000:])
    assert f"READY {HOST}" not in out

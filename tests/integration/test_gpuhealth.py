"""GPU health on the testbed (core.gpuhealth, stages/gpugate.py): `status` shows each of the
stand-in's fault profiles (testbed/gpu/nvidia_smi.py), a fatal GPU stops a deploy before the
restart (the server keeps serving), and a health query that fails reads unknown, never
healthy. One host (TB1) is enough: every case is the host's own GPUs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .helpers import INVENTORY, REPO, SEED_FLAGS, TB1, both, pyinfra_deploy

BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
#: the other flag set than the seed's: a deploy with it restarts the server (reason: unit)
OTHER_FLAGS = {**SEED_FLAGS, "enable-metrics": False}


def status_of(testbed, host: str) -> dict:
    """HOST's row of `sglang-deploy status --json` (read-only: one --dry run)."""
    r = subprocess.run([str(BIN / "sglang-deploy"), "status", str(INVENTORY), "--limit", host,
                        "--json"], cwd=REPO, capture_output=True, text=True, timeout=600,
                       check=False, stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    assert r.stdout.strip(), both(r)[-3000:]
    (row,) = [h for h in json.loads(r.stdout)["hosts"] if h["host"] == host]
    return row


def findings(row: dict) -> dict[str, tuple[str, int | None]]:
    """code -> (severity, GPU) of the row's GPU health, the kernel log's own left out (the
    testbed's container may or may not read it)."""
    return {f["code"]: (f["severity"], f["gpu"]) for f in row["gpu_health"]["findings"]
            if f["code"] != "kernel-log-unreadable"}


@pytest.mark.parametrize("scenario, verdict, found", [
    ("healthy", None, {}),
    ("ecc-uncorrectable", "fatal", {"ecc-uncorrected-volatile": ("fatal", 1)}),
    ("remap-pending", "warning", {"remap-pending": ("warning", 1)}),
    ("smi-err", "warning", {"field-error": ("warning", 1), "field-unreadable": ("unknown", 1)}),
    ("gpu-lost", "fatal", {"gpu-lost": ("fatal", 7)}),
    ("health-query-error", "unknown", {"query-failed": ("unknown", None)}),
])
def test_status_shows_each_fault_profile(testbed, serving_host, scenario, verdict, found):
    serving_host(TB1)
    testbed.scenario(TB1, scenario)
    row = status_of(testbed, TB1)
    health = row["gpu_health"]
    assert health is not None, row
    assert findings(row) == found, health
    if verdict is None:  # healthy, or unknown only because the kernel log is not readable
        assert health["verdict"] in ("healthy", "unknown"), health
    else:
        assert health["verdict"] == verdict, health
    if scenario == "gpu-lost":  # nvidia-smi's own listing fails too: the pre-flight says so
        assert row["preflight"] == "fail" and "GPU" in row["problem"], row
    if scenario == "health-query-error":  # the rest of the GPUs' checks pass: never "healthy"
        assert row["preflight"] == "pass" and row["health"] == 200, row


def test_a_fatal_gpu_stops_a_deploy_before_the_restart_and_the_server_keeps_serving(
        testbed, serving_host):
    serving_host(TB1)
    unit = testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service", check=True).stdout
    flags = OTHER_FLAGS if "--enable-metrics" in unit else SEED_FLAGS  # a change: a restart
    before = testbed.host_state(TB1)
    testbed.scenario(TB1, "ecc-uncorrectable")
    r = pyinfra_deploy([TB1], "--data", f"sglang_flags={json.dumps(flags)}")
    out = both(r)
    assert r.returncode != 0, out[-3000:]
    assert f"GPU health: expected {TB1}'s GPUs healthy before it can restart sglang" in out, \
        out[-3000:]
    assert "GPU 1: 2 uncorrectable ECC error(s)" in out and "nvidia-smi -r -i 1" in out
    after = testbed.host_state(TB1)
    for key in ("invocation", "unit", "current", "health"):  # never stopped, nothing changed
        assert after[key] == before[key], (key, before, after)
    assert after["health"] == "200"

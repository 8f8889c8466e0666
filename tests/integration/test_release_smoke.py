"""The release proven before it goes live: a release that does not import never replaces the
serving one (testbed), and the production lock's release imports under the unit's own
sandbox (real systemd in a testbed host, the real 9 GB production venv of `lock --check`
bind-mounted read-only at /srv/lockcheck)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from sglang_deploy.controller import releasecheck
from sglang_deploy.core import smoke

from .helpers import BIN, REPO, TB1, TB2, both, broken_lock, pyinfra_deploy

PROD_LOCK = REPO / "locks/glm5-blackwell.txt"


def _current(testbed, host: str) -> str:
    return testbed.ssh(host, "readlink /opt/sglang/current", check=True).stdout.strip()


def _main_pid(testbed, host: str) -> str:
    return testbed.ssh(host, "systemctl show -p MainPID --value sglang", check=True).stdout.strip()


def test_a_release_that_does_not_import_leaves_the_previous_release_serving(
        testbed, deployed_host, tmp_path):
    """Needs: TB1 deployed and serving (any configuration); leaves it so."""
    deployed_host(TB1)
    current, pid = _current(testbed, TB1), _main_pid(testbed, TB1)
    r = pyinfra_deploy([TB1], "--data", f"sglang_lock={broken_lock(tmp_path)}")
    out = both(r)
    assert r.returncode != 0, out[-3000:]
    assert "release smoke failed: expected `import sglang` works in the release venv on host" in out
    assert "No module named 'pybase64'" in out
    assert "sglang 0.5.12.post1" in out  # the package the failing import passes through
    # nothing switched: same release behind `current`, same server process, still serving
    assert _current(testbed, TB1) == current
    assert _main_pid(testbed, TB1) == pid
    code = testbed.ssh(TB1, "curl -s -o /dev/null -w '%{http_code}' "
                            "http://127.0.0.1:30000/health").stdout.strip()
    assert code == "200"


def test_a_no_op_deploy_runs_no_smoke(testbed, deployed_host):
    """Needs: TB1 converged on the seed configuration; a second run pays nothing for it."""
    deployed_host(TB1)
    r = pyinfra_deploy([TB1])
    assert r.returncode == 0, both(r)[-3000:]
    assert "Release smoke" not in both(r)


def test_the_production_release_imports_under_the_units_own_sandbox(testbed, deployed_host):
    """Needs: TB1 deployed (its service user, folders and rendered unit exist). Installs the
    production lock on the controller (`lock --check`: cached by the lock's hash), then runs
    the smoke in a host under systemd-run with every sandbox property of TB1's rendered unit
    (templates/sglang.service.j2): importing torch, flashinfer and sglang, sglang's parser on
    the seed's flags. What it cannot show without a GPU: docs/faults.md."""
    deployed_host(TB1)
    check = subprocess.run([str(BIN / "sglang-deploy"), "lock", "--check", str(PROD_LOCK),
                            "--json"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert check.returncode == 0, (check.stdout + check.stderr)[-3000:]
    venv = Path(json.loads(check.stdout.strip().splitlines()[-1])["venv"])
    inside = Path("/srv/lockcheck") / venv.relative_to(releasecheck.cache_root())
    unit = testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "ProtectSystem=strict" in unit and "SystemCallFilter=" in unit
    flags = ["--model-path", "/srv/models/GLM-5-NVFP4", "--tp-size", "8", "--quantization",
             "modelopt_fp4", "--moe-runner-backend", "flashinfer_cutlass",
             "--enable-flashinfer-allreduce-fusion", "--disable-cuda-graph",
             "--trust-remote-code"]
    argv = smoke.smoke_argv(str(inside / "bin/python"), "/opt/sglang/tools/release_smoke.py",
                            ["import", "flags", "entrypoints"], flags,
                            ["torch", "flashinfer", "sglang.launch_server",
                             "sglang.srt.model_executor.model_runner"])
    cmd = smoke.systemd_run_argv(unit, argv, {"CUDA_VISIBLE_DEVICES": ""})
    assert cmd.count("-p") == len(smoke.sandbox_properties(unit)) + 1
    r = testbed.ssh(TB1, shlex.join(cmd), timeout=900)
    result = smoke.parse_result(r.stdout)
    assert result is not None, (r.stdout + r.stderr)[-3000:]
    assert result["ok"], str(smoke.error_for(result, f"host {TB1} (sandboxed)"))
    steps = {s["step"]: s["status"] for s in result["steps"]}
    assert steps == {"import": "passed", "flags": "passed", "import torch": "passed",
                     "import flashinfer": "passed", "import sglang.launch_server": "passed",
                     "import sglang.srt.model_executor.model_runner": "passed"}, steps
    # it really ran as the unit's user, inside the unit's sandbox
    probe = smoke.systemd_run_argv(unit, ["/bin/sh", "-c", "id -un; touch /usr/x 2>&1 || true"])
    seen = testbed.ssh(TB1, shlex.join(probe)).stdout
    assert seen.splitlines()[0] == "sglang"
    assert "Read-only file system" in seen


def test_lock_check_names_the_import_error_of_the_lock_at_48a8d87():
    """The production lock as it was at 48a8d87 (kernels 0.17.2) fails the check with the
    import error and the packages that meet there (no testbed needed)."""
    lock = REPO / "tests/fixtures/locks/glm5-blackwell-48a8d87.txt"
    r = subprocess.run([str(BIN / "sglang-deploy"), "lock", "--check", str(lock)], cwd=REPO,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    err = r.stderr
    assert "release smoke failed: expected `import sglang` works" in err
    assert "ValueError: Either a revision or a version must be specified." in err
    assert "kernels 0.17.2, required by sglang 0.5.12.post1 without a bound" in err


def test_a_rollout_stops_at_the_first_host_whose_release_does_not_import(
        testbed, deployed_host, tmp_path):
    """Needs: TB1 and TB2 deployed and serving. Without staging (`--no-stage`: the smoke runs
    in each host's own deploy), the canary's smoke fails: nothing switches there, the rollout
    halts and the second host is never touched. (Staged, every host's smoke runs before the
    first drain: tests/integration/test_rollout_staging.py.)"""
    deployed_host(TB1, TB2)
    before = {h: (_current(testbed, h), _main_pid(testbed, h)) for h in (TB1, TB2)}
    report = tmp_path / "rollout.json"
    r = subprocess.run([str(BIN / "sglang-deploy"), "rollout", str(testbed.inventory),
                        "--limit", TB1, "--limit", TB2, "--report", str(report), "--no-stage",
                        "--data", f"sglang_lock={broken_lock(tmp_path)}"],
                       cwd=REPO, capture_output=True, text=True, timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    hosts = {h["host"]: h for h in json.loads(report.read_text())["hosts"]}
    assert "release smoke failed" in hosts[TB1]["message"], hosts[TB1]
    assert "pybase64" in hosts[TB1]["message"]
    assert hosts[TB2]["status"] == "untouched", hosts[TB2]
    assert f"halted at {TB1}" in out
    for h in (TB1, TB2):  # both still run the release and process they ran before
        assert (_current(testbed, h), _main_pid(testbed, h)) == before[h]

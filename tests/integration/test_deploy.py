"""The real deploy.py, run by the real pyinfra CLI over SSH against testbed hosts.

tb1: fresh deploy, idempotent re-run (same systemd invocation), one flag change = one restart,
     secrets handling. tb2: every GPU scenario stops the deploy in pre-flight, before anything
     is installed. tb3: every server scenario fails the verifier with phase and log lines.
Each test states the host it needs through conftest's fixtures (fresh_host, deployed_host).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from .helpers import (
    GPU_SCENARIOS,
    PYINFRA,
    REPO,
    SECRET,
    SEED_FLAGS,
    TB1,
    TB2,
    TB3,
    both,
    changed,
    pyinfra_deploy,
)


def deploy(testbed, host: str, *args: str, env: dict | None = None, timeout: float = 600):
    r = pyinfra_deploy([host], *args, inventory=testbed.inventory, env=env, timeout=timeout)
    testbed.log.append(r)
    return r


def invocation(testbed, host: str) -> str:
    r = testbed.ssh(host, "systemctl show -p InvocationID --value sglang.service", check=True)
    return r.stdout.strip()


# ---------------------------------------------------------------------------------- tb1
def test_fresh_host_ends_verified_and_serving(testbed, fresh_host):
    fresh_host(TB1)
    r = deploy(testbed, TB1)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert f"READY {TB1}: sglang 0.5.12.post1" in out
    assert "autotune patch applied" in out
    assert re.search(r"autotune \d+\.\d+s", out), "the summary gives the autotune duration"
    # the server really serves, from outside the deploy too
    gen = testbed.ssh(TB1, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health")
    assert gen.stdout.strip() == "200"
    # the journal shows autotune (the patch took effect) before ready
    journal = testbed.ssh(TB1, "journalctl -u sglang -o cat --no-pager", check=True).stdout
    assert journal.index("FlashInfer autotune completed.") < journal.index(
        "The server is fired up and ready to roll!")


def test_second_run_changes_nothing_and_restarts_nothing(testbed, deployed_host):
    deployed_host(TB1)
    before = invocation(testbed, TB1)
    r = deploy(testbed, TB1)
    assert r.returncode == 0, both(r)[-4000:]
    assert changed(both(r)) == []
    assert invocation(testbed, TB1) == before


def test_dry_run_on_converged_host_shows_no_change(testbed, deployed_host):
    deployed_host(TB1)
    r = subprocess.run([PYINFRA, str(testbed.inventory), "deploy.py", "--limit", TB1, "--dry"],
                       check=False, cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = both(r)
    assert r.returncode == 0, out[-3000:]
    table = out[out.index("--> Detected changes:"):]
    rows = re.findall(r"^\s{4}(.+?\|.+?)\s{2,}(\S+)\s+(\S+)\s*$", table, re.MULTILINE)
    # the table was read: every operation of the stages is a row (13 on a converged host)
    names = [name for name, _, _ in rows]
    assert len(rows) >= 13, rows
    for part in ("| Folders", "| Tools (", "| Release ", "| FlashInfer autotune patch",
                 "| Launch flags", "| Unit ", "| Start "):
        assert any(part in name for name in names), (part, names)
    assert all(change == "-" and cond == "-" for _, change, cond in rows), rows


def _facts(r) -> list[tuple[str, str]]:
    """The facts a -vv run loaded: (name, its arguments as pyinfra prints them)."""
    return re.findall(r"Loaded fact sglang_deploy\.hostops\.facts\.(\w+) \(([^)]*)\)", both(r))


def _every_fact(r) -> list[str]:
    """Every fact a -vv run loaded, pyinfra's own too (``pyinfra.facts.files.File``...): an
    operation that compared a path the host-state read left out would show here."""
    return re.findall(r"Loaded fact ([\w.]+) ", both(r))


def test_the_cuda_probe_runs_only_beside_a_server_no_deploy_verified(testbed, deployed_host):
    """While the service serves the invocation a deploy verified, a no-op deploy sends only
    the pre-flight snapshot: no CUDA probe beside the server. A server restarted behind the
    deploy's back (a new invocation, not verified) is probed (init and devices, no peer copies)
    and verified as it is, without a restart; after that the probe is skipped again."""
    deployed_host(TB1)
    r = deploy(testbed, TB1, "-vv")
    assert r.returncode == 0, both(r)[-4000:]
    assert [name for name, _ in _facts(r)] == ["HostSnapshot"]
    # one round trip in all: the file operations compared with the snapshot, no fact of their own
    assert _every_fact(r) == ["sglang_deploy.hostops.facts.HostSnapshot"], _every_fact(r)
    testbed.ssh(TB1, "systemctl restart sglang.service && for i in $(seq 600); do "
                "curl -sf -o /dev/null http://127.0.0.1:30000/health && exit 0; sleep 0.1; done; "
                "exit 1", check=True)
    restarted = invocation(testbed, TB1)
    r = deploy(testbed, TB1, "-vv")
    assert r.returncode == 0, both(r)[-4000:]
    probes = [args for name, args in _facts(r) if name == "CudaProbe"]
    assert len(probes) == 1 and "p2p=False" in probes[0], _facts(r)
    assert invocation(testbed, TB1) == restarted  # verified as it is: no restart
    assert [name.split(" | ")[-1] for name in changed(both(r))] == [
        "Verify the running server (never verified, serving: not restarted)"]
    r = deploy(testbed, TB1, "-vv")
    assert r.returncode == 0, both(r)[-4000:]
    assert [name for name, _ in _facts(r)] == ["HostSnapshot"]


def test_bad_input_fails_before_connecting_naming_the_key(testbed):
    for args, env, key in (
        (["--data", "sglang_portt=1"], {}, "sglang_portt"),
        (["--data", "gpu_expected_count=eight"], {}, "gpu_expected_count"),
        (["--data", 'sglang_flags={"tp-size": [[8]]}'], {}, "sglang_flags"),
        (["--data", "sglang_api_key_env=NO_SUCH_SECRET_VAR"], {}, "sglang_api_key_env"),
    ):
        r = deploy(testbed, TB1, *args, env=env)
        out = both(r)
        assert r.returncode != 0, out[-2000:]
        assert key in out, (key, out[-2000:])
        assert "Connected" not in out, "validation must happen before any connection"


def test_one_flag_change_is_one_unit_change_one_restart_one_verification(testbed, deployed_host):
    deployed_host(TB1)
    before = invocation(testbed, TB1)
    unit = testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "--enable-metrics" in unit  # metrics are on by default
    flags = {**SEED_FLAGS, "enable-metrics": False}  # the operator turns them off
    r = deploy(testbed, TB1, "--data", f"sglang_flags={json.dumps(flags)}", "-v")
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    # -v: the restart decision and why, before anything runs (the loaded unit's ExecStart
    # against the new one: the flag that changed)
    assert "restart: flags changed: -enable-metrics" in out, out[-4000:]
    ops = changed(out)
    # new flags: the release is proven with them under the unit's sandbox before the restart
    smoke = [o for o in ops if o.startswith(
        "Service: launch flags, secrets, systemd unit, (re)start | Release smoke of ")]
    assert len(smoke) == 1 and smoke[0].endswith(" under the unit's sandbox"), ops
    assert ops.index(smoke[0]) < ops.index(
        "Service: launch flags, secrets, systemd unit, (re)start | Restart sglang (unit changed)")
    # the model's shards are read into the page cache first when some are not there (this
    # machine pages idle memory out by itself): test_residency.py tests that operation
    warm = [o for o in ops if "into the page cache" in o]
    assert sorted(o for o in ops if o not in smoke + warm) == sorted([
        "Service: launch flags, secrets, systemd unit, (re)start | JIT toolchain (nvcc, ninja, c++) in the service's environment",
        "Service: launch flags, secrets, systemd unit, (re)start | Unit /etc/systemd/system/sglang.service",
        "Service: launch flags, secrets, systemd unit, (re)start | systemd daemon-reload",
        # the peer copies skipped while it served: stopped, P2P retested, then restarted
        "Service: launch flags, secrets, systemd unit, (re)start | Stop sglang for the P2P retest",
        ("Service: launch flags, secrets, systemd unit, (re)start | P2P will be retested "
         "before the restart of sglang (peer copies on every GPU pair)"),
        "Service: launch flags, secrets, systemd unit, (re)start | Restart sglang (unit changed)",
        "Verify: block until the model really serves | Verify startup, API and a one-token generation",
    ])
    assert invocation(testbed, TB1) != before
    unit = testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "--enable-metrics" not in unit
    metrics = testbed.ssh(TB1, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/metrics")
    assert metrics.stdout.strip() == "404"
    # the reasons kept on the host (last-verified.json), which `status` shows
    last = json.loads(testbed.ssh(TB1, "cat /opt/sglang/last-verified.json",
                                  check=True).stdout)["last_restart"]
    assert last["action"] == "restarted" and last["why"] == "flags changed: -enable-metrics"
    assert last["at"] and last["reasons"][0]["name"] == "unit"


def test_a_flag_unknown_to_the_installed_sglang_never_reaches_a_restart(testbed, deployed_host):
    deployed_host(TB1)
    before = invocation(testbed, TB1)
    unit_before = testbed.ssh(TB1, "sha256sum /etc/systemd/system/sglang.service").stdout
    flags = {**SEED_FLAGS, "cuda-graph-max-bsz": 8}
    r = deploy(testbed, TB1, "--data", f"sglang_flags={json.dumps(flags)}")
    out = both(r)
    assert r.returncode != 0
    assert "--cuda-graph-max-bsz" in out and "0.5.12.post1" in out
    assert testbed.ssh(TB1, "sha256sum /etc/systemd/system/sglang.service").stdout == unit_before
    assert invocation(testbed, TB1) == before


def test_secrets_stay_out_of_argv_unit_journal_and_output(testbed):
    r = deploy(testbed, TB1, "-vvv", "--data", "sglang_api_key_env=TB_API_KEY",
               env={"TB_API_KEY": SECRET})
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert f"READY {TB1}" in out  # the verifier's generation passed the key
    assert SECRET not in out
    ps = testbed.ssh(TB1, "ps -eo args", check=True).stdout
    assert "--api-key" not in ps and SECRET not in ps
    assert SECRET not in testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service").stdout
    journal = testbed.ssh(TB1, "journalctl -u sglang -o cat --no-pager", check=True).stdout
    assert "api_key=" in journal and SECRET not in journal
    mode = testbed.ssh(TB1, "stat -c '%a %U %G' /etc/sglang/secrets.env /etc/sglang",
                       check=True).stdout.split("\n")
    assert mode[0] == "600 root root" and mode[1] == "700 root root"
    # the API enforces the key: without it 401, with it 200
    anon = testbed.ssh(TB1, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/v1/models")
    assert anon.stdout.strip() == "401"


# ---------------------------------------------------------------------------------- tb2


@pytest.mark.parametrize("scenario", sorted(GPU_SCENARIOS))
def test_gpu_scenario_stops_in_preflight_before_anything_is_installed(testbed, fresh_host, scenario):
    fresh_host(TB2)
    testbed.scenario(TB2, scenario)
    try:
        r = deploy(testbed, TB2)
    finally:
        testbed.scenario(TB2, "healthy")
    out = both(r)
    assert r.returncode != 0, out[-3000:]
    assert "fix" in out.lower()
    for needle in GPU_SCENARIOS[scenario]:
        assert needle.lower() in out.lower(), (needle, out[-3000:])
    # nothing was installed
    assert testbed.ssh(TB2, "test -e /opt/sglang || test -e /etc/sglang").returncode != 0


def test_p2p_unsupported_adapts_by_policy(testbed):
    testbed.scenario(TB2, "p2p-unsupported")
    try:
        r = deploy(testbed, TB2, "--data", "gpu_p2p_policy=adapt")
    finally:
        testbed.scenario(TB2, "healthy")
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert "NCCL_P2P_DISABLE" in out
    unit = testbed.ssh(TB2, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "Environment=NCCL_P2P_DISABLE=1" in unit
    # P2P works again (the scenario healthy): the next restart's retest proves it, and the
    # unit, planned from the last record (P2P disabled, the same policy), is rewritten
    # before the one start
    flags = ["--data", "gpu_p2p_policy=adapt",
             "--data", f"sglang_flags={json.dumps({**SEED_FLAGS, 'enable-metrics': False})}"]
    r = deploy(testbed, TB2, *flags)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert "rendered again with NCCL environment (none) (was NCCL_P2P_DISABLE=1)" in out, out[-4000:]
    unit = testbed.ssh(TB2, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert "NCCL_P2P_DISABLE" not in unit and "--enable-metrics" not in unit
    env = testbed.ssh(TB2, "tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value "
                           "sglang)/environ", check=True).stdout
    assert "NCCL_P2P_DISABLE" not in env  # the server runs the rewritten unit
    r = deploy(testbed, TB2, *flags)  # and the next run plans that unit: nothing changes
    assert r.returncode == 0 and changed(both(r)) == [], both(r)[-4000:]


# ---------------------------------------------------------------------------------- tb3
# tb3's cases are about the server, not P2P: each deploy beside a server that was never
# verified measures P2P again, and the simulated peer copies are host memcpy whose speed
# follows the machine's load (as in the fault, bench and download modules).
TB3_DATA = ["gpu_p2p_min_gbps=0.05", "gpu_p2p_test_mib=8"]
TB3_ARGS = [arg for d in TB3_DATA for arg in ("--data", d)]

SERVER_SCENARIOS = {
    # scenario: (phase reached, words in the message)
    "autotune-crash": ("autotune", ["Ninja build failed", "exit"]),
    # OOM happens while the KV cache is being allocated: the failure's own line (`Not
    # enough memory`) puts it in phase `kv_cache` (the last marker seen is `loaded`)
    "oom": ("kv_cache", ["Not enough memory", "mem-fraction-static"]),
    "load-hang": ("loading", ["stalled", "loading"]),
}


@pytest.mark.parametrize("scenario", sorted(SERVER_SCENARIOS))
def test_server_scenario_fails_the_verifier_with_phase_and_log_lines(testbed, failed_host, scenario):
    phase, words = SERVER_SCENARIOS[scenario]
    # the service stopped, SCENARIO set, deployed (the scenario goes back to healthy after)
    r = failed_host(TB3, scenario, data=['verify_phase_timeouts={"loading": 8}', *TB3_DATA])
    out = both(r)
    assert r.returncode != 0, out[-3000:]
    assert f"phase reached: {phase}" in out or f"phase `{phase}`" in out, out[-3000:]
    for w in words:
        assert w in out, (w, out[-3000:])
    assert f"READY {TB3}" not in out


def test_a_reverted_patch_is_noticed_and_reapplied(testbed, deployed_host):
    if not testbed.host_state(TB3).get("current"):  # a release to revert the patch in
        deployed_host(TB3, data=TB3_DATA)
    # Revert the patch behind the deploy's back (as a reinstall would): the next deploy
    # must notice it, re-patch, restart and see autotune again.
    testbed.ssh(TB3, "systemctl stop sglang.service 2>/dev/null; true")
    rel = testbed.ssh(TB3, "readlink /opt/sglang/current", check=True).stdout.strip()
    testbed.ssh(TB3, f"sed -i 's/^\\( *\\)\"flashinfer_cutlass\",  # sglang-deploy: autotune patch$/\\1# \"flashinfer_cutlass\",/' "
                f"{rel}/venv/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", check=True)
    # a normal deploy notices the revert and re-patches: that is the design
    r = deploy(testbed, TB3, *TB3_ARGS)
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert "FlashInfer autotune patch" in " ".join(changed(out))
    assert f"READY {TB3}" in out


def test_slow_start_within_the_deadlines_succeeds(testbed):
    testbed.ssh(TB3, "systemctl stop sglang.service 2>/dev/null; true")
    testbed.scenario(TB3, "slow-start")
    try:
        r = deploy(testbed, TB3, *TB3_ARGS)
    finally:
        testbed.scenario(TB3, "healthy")
    out = both(r)
    assert r.returncode == 0, out[-4000:]
    assert f"READY {TB3}" in out

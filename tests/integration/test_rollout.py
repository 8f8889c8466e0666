"""`sglang-deploy rollout`, `rollback.py`, `status`, `rebuild`/`cache save` on 3 testbed hosts.

Every rollout here binds the API on all addresses (no key: the testbed is a closed bridge)
so that a poller on the controller can watch every host's /health from outside while a
rollout runs. Each test puts the hosts in the state it needs with conftest's fixtures
(fresh_host, deployed_host with the configuration of the rollouts before it).
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from pathlib import Path

from .helpers import BIN, REPO, SEED_FLAGS, TB1, TB2, TB3, record, rollout_error_lines

ALL = (TB1, TB2, TB3)
BASE = ["sglang_host=0.0.0.0", "sglang_allow_public_without_key=true",
        # rollouts are tested here, not P2P: the simulated peer copies are host memcpy whose
        # speed follows the machine's load (as in the fault, bench and download modules)
        "gpu_p2p_min_gbps=0.05", "gpu_p2p_test_mib=8"]


def rollout_record(case, category, fault, r, **kw):
    """A fault-matrix row (docs/faults.md) whose 'what the user sees' is the rollout's own
    verdict lines (STOPPED / HALT / per-host failure / FAILED) rather than pyinfra's."""
    return record(case, category, fault, r, error=rollout_error_lines(r), **kw)


def flags(**extra) -> str:
    return "sglang_flags=" + json.dumps({**SEED_FLAGS, **extra})


def tool(testbed, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN / "sglang-deploy"), *args], cwd=REPO, capture_output=True,
                       text=True, timeout=timeout, check=False)
    testbed.log.append(r)
    return r


def rollout(testbed, *args: str, report: Path, data=()) -> tuple[subprocess.CompletedProcess, dict]:
    argv = ["rollout", str(testbed.inventory), "--report", str(report)]
    for d in [*BASE, *data]:
        argv += ["--data", d]
    r = tool(testbed, *argv, *args)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return r, doc


def by_host(doc: dict) -> dict:
    return {h["host"]: h for h in doc["hosts"]}


def invocation(testbed, host: str) -> str:
    return testbed.ssh(host, "systemctl show -p InvocationID --value sglang.service",
                       check=True).stdout.strip()


def unit_text(testbed, host: str) -> str:
    return testbed.ssh(host, "cat /etc/systemd/system/sglang.service", check=True).stdout


def health(address: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{address}:30000/health", timeout=1) as resp:
            return resp.status
    except Exception:
        return None


def config(mem: float | None = None) -> list[str]:
    """The --data of the rollouts here (BASE, plus the flags with this mem fraction)."""
    return [*BASE, *([flags(**{"mem-fraction-static": mem})] if mem is not None else [])]


def test_first_rollout_installs_every_host_in_the_printed_order(testbed, fresh_host, tmp_path):
    fresh_host(*ALL)
    r, doc = rollout(testbed, "--canary", TB2, report=tmp_path / "r.json")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert f"1. {TB2}\n  2. {TB1}\n  3. {TB3}" in out
    assert [h["host"] for h in doc["hosts"]] == [TB2, TB1, TB3]
    assert {h["status"] for h in doc["hosts"]} == {"done"}
    for name in (TB1, TB2, TB3):
        assert health(testbed.address(name)) == 200


def test_converged_hosts_are_verified_and_not_restarted(testbed, deployed_host, tmp_path):
    deployed_host(*ALL, data=config())
    before = {h: invocation(testbed, h) for h in (TB1, TB2, TB3)}
    r, doc = rollout(testbed, report=tmp_path / "r.json")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert {h["status"] for h in doc["hosts"]} == {"converged"}
    assert {h: invocation(testbed, h) for h in (TB1, TB2, TB3)} == before


def test_dry_prints_the_plan_and_touches_nothing(testbed, deployed_host, tmp_path):
    deployed_host(*ALL, data=config())
    before = {h: (invocation(testbed, h), unit_text(testbed, h)) for h in (TB1, TB2, TB3)}
    r, _ = rollout(testbed, "--dry", report=tmp_path / "r.json", data=[flags(**{"mem-fraction-static": 0.85})])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for name in (TB1, TB2, TB3):
        assert f"  {name}: " in out and "Unit /etc/systemd/system/sglang.service" in out
    assert "Restart sglang" in out
    assert {h: (invocation(testbed, h), unit_text(testbed, h)) for h in (TB1, TB2, TB3)} == before


def test_flag_change_rolls_one_host_at_a_time_keeping_the_others_serving(testbed, deployed_host, tmp_path):
    """At most --batch (1) hosts are out of service at any moment, watched from outside."""
    deployed_host(*ALL, data=config())  # every host runs other flags than the new ones
    addresses = {h: testbed.address(h) for h in (TB1, TB2, TB3)}
    samples: list[dict] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            samples.append({h: health(a) for h, a in addresses.items()})
            stop.wait(0.1)

    before = {h: invocation(testbed, h) for h in addresses}
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        r, doc = rollout(testbed, "--batch", "1", report=tmp_path / "r.json",
                         data=[flags(**{"mem-fraction-static": 0.85})])
    finally:
        stop.set()
        poller.join(5)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert [h["host"] for h in doc["hosts"]] == [TB1, TB2, TB3]
    assert {h["status"] for h in doc["hosts"]} == {"done"}
    for name in addresses:
        assert invocation(testbed, name) != before[name]
        assert "--mem-fraction-static 0.85" in unit_text(testbed, name)
    down_counts = [sum(v != 200 for v in s.values()) for s in samples]
    assert len(samples) > 50, len(samples)
    assert max(down_counts) == 1, "each host was restarted, so each was down at some point"
    assert all(c <= 1 for c in down_counts), [s for s in samples if sum(v != 200 for v in s.values()) > 1][:3]
    # every host was seen down at some point, one after the other
    assert {h for s in samples for h, v in s.items() if v != 200} == set(addresses)


def test_failure_on_second_host_halts_rolls_it_back_and_leaves_the_third_untouched(testbed, deployed_host, tmp_path):
    deployed_host(*ALL, data=config(0.85))  # the configuration the new one replaces
    # the NEW configuration crashes in autotune on tb2; its previous one still works
    testbed.scenario(TB2, "autotune-crash", when="--mem-fraction-static 0.8")
    inv3 = invocation(testbed, TB3)
    unit3 = unit_text(testbed, TB3)
    old_unit2 = unit_text(testbed, TB2)
    try:
        r, doc = rollout(testbed, report=tmp_path / "r.json",
                         data=[flags(**{"mem-fraction-static": 0.8})])
    finally:
        testbed.scenario(TB2, "healthy")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    hosts = by_host(doc)
    assert hosts[TB1]["status"] == "done"
    assert hosts[TB2]["status"] == "rolled-back", hosts[TB2]
    assert "autotune" in hosts[TB2]["message"]  # the verifier's reason travels to the report
    assert hosts[TB3]["status"] == "untouched"
    assert f"halted at {TB2}" in out
    # the third host was never touched: same process, same unit
    assert invocation(testbed, TB3) == inv3 and unit_text(testbed, TB3) == unit3
    # the second host serves its previous configuration again
    assert unit_text(testbed, TB2) == old_unit2
    assert health(testbed.address(TB2)) == 200
    assert "--mem-fraction-static 0.85" in unit_text(testbed, TB2)
    # the fault removed (the scenario is back to healthy), the same rollout converges
    again, doc2 = rollout(testbed, report=tmp_path / "r2.json", data=[flags(**{"mem-fraction-static": 0.8})])
    rollout_record("autotune crash in a rollout (2nd of 3 hosts)", "Server",
           "`autotune-crash` scenario for the new flags on the 2nd host of a 3-host "
           "`sglang-deploy rollout`", r, others_untouched=True, serving=True,
           converged=again.returncode == 0,
           notes=f"{TB1} done, {TB2} rolled back to its known-good unit and verified serving, "
                 f"{TB3} untouched (same invocation); exit 1")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert by_host(doc2)[TB1]["status"] == "converged"


def test_unreachable_host_stops_the_rollout_before_any_host_is_touched(testbed, deployed_host, tmp_path):
    deployed_host(*ALL, data=config(0.8))  # the re-run finds every host converged
    before = {h: invocation(testbed, h) for h in (TB1, TB2)}
    veth = f"v{TB3}"
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        r, doc = rollout(testbed, report=tmp_path / "r.json",
                         data=[flags(**{"mem-fraction-static": 0.8})])
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    out = r.stdout + r.stderr
    untouched = {h: invocation(testbed, h) for h in (TB1, TB2)} == before
    testbed.wait_for(f"{TB3} reachable again",
                     lambda: testbed.ssh(TB3, "true", timeout=15).returncode == 0, timeout=60)
    again, doc2 = rollout(testbed, report=tmp_path / "r2.json", data=[flags(**{"mem-fraction-static": 0.8})])
    rollout_record("host unreachable at the start of a rollout", "Host and network",
           f"{TB3}'s link down (`ip link set v{TB3} down`) when `sglang-deploy rollout` starts", r,
           others_untouched=untouched, serving=all(health(testbed.address(h)) == 200 for h in (TB1, TB2)),
           converged=again.returncode == 0,
           notes="the rollout's staging run (every host at once) is also its check that every "
                 "host answers (SSH, host keys, data); it stops before any drain, no server "
                 "touched")
    assert r.returncode != 0
    assert f"stopped before any drain: {TB3} did not answer over SSH" in out
    assert [h["status"] for h in doc["hosts"]] == ["untouched", "untouched", "failed"]
    assert all(h["router"] is None for h in doc["hosts"])
    assert untouched
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert {h["status"] for h in doc2["hosts"]} == {"converged"}


def test_status_reports_every_host_and_the_drift_of_a_manual_change(testbed, tmp_path):
    # converge tb1 back to the flags of the others (it kept 0.8 from the halted rollout)
    r, _ = rollout(testbed, report=tmp_path / "r.json", data=[flags(**{"mem-fraction-static": 0.85})])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    units = {h: unit_text(testbed, h) for h in (TB1, TB2, TB3)}
    # a manual change on one host: someone edits the unit by hand
    testbed.ssh(TB2, "sed -i 's/--mem-fraction-static 0.85/--mem-fraction-static 0.9/' "
                     "/etc/systemd/system/sglang.service", check=True)
    argv = ["status", str(testbed.inventory), "--json"]
    for d in [*BASE, flags(**{"mem-fraction-static": 0.85})]:
        argv += ["--data", d]  # drift against the configuration the rollout deployed
    r = tool(testbed, *argv)
    rows = {row["host"]: row for row in json.loads(r.stdout)["hosts"]}
    assert r.returncode == 1, r.stderr[-2000:]  # not everything in sync
    for name in (TB1, TB2, TB3):
        row = rows[name]
        assert row["reachable"] is True and row["health"] == 200 and row["unit"] == "active/running"
        assert row["sglang_version"] == "0.5.12.post1" and row["patch_state"] == "applied"
        assert row["models"] == ["glm-5"] and row["last_verified"]
        assert row["uptime_s"] is not None and row["uptime_s"] >= 0
    assert rows[TB1]["in_sync"] is True and rows[TB3]["in_sync"] is True
    assert rows[TB1]["changes"] == [] and rows[TB3]["changes"] == []
    assert rows[TB2]["in_sync"] is False
    assert "Unit /etc/systemd/system/sglang.service" in rows[TB2]["changes"], rows[TB2]
    # status only reads: nothing changed
    assert {h: unit_text(testbed, h) for h in (TB1, TB3)} == {h: units[h] for h in (TB1, TB3)}
    assert "--mem-fraction-static 0.9" in unit_text(testbed, TB2)


def test_throughput_gate_rejects_a_slower_configuration_and_rolls_it_back(testbed, tmp_path):
    r, _ = rollout(testbed, report=tmp_path / "r0.json", data=[flags(**{"mem-fraction-static": 0.85})])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]  # undo the hand edit of the status test
    # the new configuration (mem fraction 0.75) is 60% slower on tb1 (simulated decode rate)
    testbed.sim_env(TB1, "SLOW_WHEN=--mem-fraction-static 0.75", "SLOW_FACTOR=0.4")
    unit1 = unit_text(testbed, TB1)
    untouched = {h: invocation(testbed, h) for h in (TB2, TB3)}
    try:
        r, doc = rollout(testbed, "--min-throughput-ratio", "0.95", report=tmp_path / "r.json",
                         data=[flags(**{"mem-fraction-static": 0.75})])
    finally:
        testbed.sim_env(TB1, "SLOW_WHEN=")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    hosts = by_host(doc)
    assert hosts[TB1]["status"] == "rolled-back", hosts[TB1]
    assert "throughput gate" in hosts[TB1]["message"] and "0.95" in hosts[TB1]["message"]
    assert f"{TB1}: baseline benchmark: recorded" in out
    assert {h: hosts[h]["status"] for h in (TB2, TB3)} == {TB2: "untouched", TB3: "untouched"}
    assert {h: invocation(testbed, h) for h in (TB2, TB3)} == untouched
    assert unit_text(testbed, TB1) == unit1  # back on the faster configuration, serving
    assert health(testbed.address(TB1)) == 200
    # the slower build fixed (SLOW_WHEN cleared), the gated rollout of that host passes
    again, doc2 = rollout(testbed, "--min-throughput-ratio", "0.95", "--limit", TB1,
                          report=tmp_path / "r2.json", data=[flags(**{"mem-fraction-static": 0.75})])
    rollout_record("throughput below the rollout gate", "Server",
           f"the new flags run 60% slower on {TB1} (simulated decode rate); rollout with "
           "`--min-throughput-ratio 0.95`", r, others_untouched=True, serving=True,
           converged=again.returncode == 0,
           notes=f"{TB1} verified, benchmarked below the gate, rolled back and verified; "
                 f"{TB2}, {TB3} untouched")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert by_host(doc2)[TB1]["status"] == "done"


# ------------------------------------------------------------------- disaster recovery

def host_state(testbed, host: str) -> dict:
    """What must be identical after a rebuild: packages, unit, patch, release link."""
    q = testbed.ssh
    freeze = q(host, "/opt/sglang/tools/venv/bin/uv pip freeze --python /opt/sglang/current/venv/bin/python",
               check=True).stdout
    patch = json.loads(q(host, "/opt/sglang/current/venv/bin/python /opt/sglang/tools/patch_tool.py status "
                               "$(ls -d /opt/sglang/current/venv/lib/python3*/site-packages) --json",
                         check=True).stdout)
    patched = q(host, f"sha256sum {patch['file']}", check=True).stdout.split()[0]
    return {"freeze": freeze, "unit": unit_text(testbed, host),
            "current": q(host, "readlink /opt/sglang/current", check=True).stdout.strip(),
            "patch_state": patch["state"], "patched_file_sha256": patched,
            "secrets_mode": q(host, "stat -c '%a %U' /etc/sglang/secrets.env 2>/dev/null || echo none").stdout}


def report_of(host: str) -> dict:
    return json.loads((REPO / ".sglang-deploy" / "reports" / f"{host}.json").read_text())


def rebuild(testbed, host: str, *extra: str):
    argv = ["rebuild", str(testbed.inventory), host]
    for d in [*BASE, flags(**{"mem-fraction-static": 0.85})]:
        argv += ["--data", d]
    return tool(testbed, *argv, *extra)


def test_wipe_and_rebuild_restores_identical_state_and_caches(testbed, tmp_path):
    host = TB3
    r = rebuild(testbed, host)  # make sure it runs the configuration of the others
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    before = host_state(testbed, host)
    assert before["patch_state"] == "already-applied"

    archive = tmp_path / "cache.tar.gz"
    r = tool(testbed, "cache", "save", str(testbed.inventory), host, str(archive))
    assert r.returncode == 0, r.stderr
    import tarfile

    with tarfile.open(archive) as tf:
        names = tf.getnames()
    assert any(n.endswith("rank_tp0_pp0_dp0.json") for n in names), names

    # lost host, blank replacement, one command
    testbed.wipe(host)
    r = rebuild(testbed, host)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert host_state(testbed, host) == before
    cold = report_of(host)["phase_durations_s"]

    # again, seeding the caches saved from the healthy host
    testbed.wipe(host)
    r = rebuild(testbed, host, "--cache", str(archive))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert host_state(testbed, host) == before
    warm = report_of(host)["phase_durations_s"]
    # the restored tactics were there before the server started (tar keeps their mtime)
    started = testbed.ssh(host, "systemctl show -p ExecMainStartTimestamp --value sglang | xargs -I{} date -d {} +%s",
                          check=True).stdout.strip()
    mtimes = testbed.ssh(host, "find /var/cache/sglang -name 'rank_tp*_pp0_dp0.json' -printf '%T@\\n'",
                         check=True).stdout.split()
    assert len(mtimes) == 8 and all(float(m) < float(started) for m in mtimes), (mtimes, started)
    owner = testbed.ssh(host, "stat -c %U /var/cache/sglang", check=True).stdout.strip()
    assert owner == "sglang"
    testbed.log.append(f"DR rebuild autotune phase: without cache {cold.get('autotune')}s, "
                       f"with restored cache {warm.get('autotune')}s")

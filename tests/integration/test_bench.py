"""`sglang-deploy bench` on one testbed host: real bench_serving, real pyinfra, the gate.

The host is deployed with the real deploy.py (API key on); then the real
`python -m sglang.bench_serving` of the host's release venv runs against the simulator.
Throughput figures here are SIMULATED: the simulator paces tokens at TOKENS_PER_S per
request and MAX_TOKENS_PER_S per server (/etc/testbed/sim.env), which is what the gate is
tested with. A configuration change (`sglang_restart_sec`, which only changes the unit file)
makes a new identity each time. Each test builds the bench history it needs with the
fixtures below, from whatever state the host is in (cheap when it is already there).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .helpers import BIN, REPO, TB1

HOST = TB1
KEY_VAR = "SGLANG_DEPLOY_TEST_BENCH_KEY"
SECRET = "bench-s3cret-key"
ENV = {KEY_VAR: SECRET}
# the base configuration of this module's deploys
BENCH_DATA = (f"sglang_api_key_env={KEY_VAR}",
              # this test is about the benchmark: the simulated P2P copies are host memcpy and
              # slow down with the machine's load, which must not stop the deploy here
              "gpu_p2p_min_gbps=0.5")


def deploy(testbed, *data: str) -> subprocess.CompletedProcess:
    args = [str(BIN / "pyinfra"), "-y", str(testbed.inventory), "deploy.py", "--limit", HOST]
    for d in (*BENCH_DATA, *data):
        args += ["--data", d]
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900,
                       env={**os.environ, **ENV}, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


def bench_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), "bench", "inventory/testbed.py",
                           "--limit", HOST, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env={**os.environ, **ENV}, check=False)


def host_records(testbed) -> list[dict]:
    r = testbed.ssh(HOST, "cat /opt/sglang/bench/*.json", check=True)
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def current_identity(testbed) -> tuple[str, str]:
    """(release, unit sha256) of what HOST runs: what its next bench record is filed under."""
    r = testbed.ssh(HOST, "basename $(readlink /opt/sglang/current); "
                          "sha256sum /etc/systemd/system/sglang.service | cut -d' ' -f1", check=True)
    release, sha = r.stdout.split()
    return release, sha


def latest_is_current(testbed) -> bool:
    """HOST's most recent bench record is of the configuration it runs now."""
    recs = host_records(testbed) if testbed.ssh(HOST, "ls /opt/sglang/bench/*.json").returncode == 0 else []
    if not recs:
        return False
    latest = max(recs, key=lambda rec: rec["time"])
    return (latest["release"], latest["unit_sha256"]) == current_identity(testbed)


def bench_ok() -> None:
    r = bench_cli("--json")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.fixture
def benched_base(testbed, deployed_host):
    """HOST runs the base bench configuration and its latest bench record is of it (at the
    simulator's default rates)."""
    deployed_host(HOST, data=BENCH_DATA, env=ENV)
    if not latest_is_current(testbed):
        bench_ok()


@pytest.fixture
def benched_twice(testbed, fresh_host):
    """HOST's bench history is exactly: the base configuration, then `sglang_restart_sec=31`
    (the one it runs, the latest record), both at the simulator's default rates."""
    recs = host_records(testbed) if testbed.ssh(HOST, "ls /opt/sglang/bench/*.json").returncode == 0 else []
    unit = testbed.ssh(HOST, "cat /etc/systemd/system/sglang.service").stdout
    if len(recs) == 2 and "RestartSec=31" in unit and latest_is_current(testbed) \
            and len({rec["release"] for rec in recs}) == 1:
        return
    fresh_host(HOST)
    deploy(testbed)
    bench_ok()
    deploy(testbed, "sglang_restart_sec=31")
    bench_ok()


def test_first_bench_records_figures(testbed, fresh_host):
    fresh_host(HOST)  # no bench record yet
    deploy(testbed)
    r = bench_cli("--json")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    [outcome] = json.loads(r.stdout)
    cur = outcome["current"]
    assert outcome["ok"] and outcome["previous"] is None
    assert "nothing to compare with" in outcome["message"]
    assert set(cur["output_tok_s"]) == {"2", "4"}
    assert all(v > 0 for v in cur["output_tok_s"].values())
    assert all(lv["completed"] == 32 for lv in cur["levels"])   # every request was authorised
    # recorded on the host and locally, under the host's configuration identity
    assert [rec["identity"] for rec in host_records(testbed)] == [cur["identity"]]
    release = testbed.ssh(HOST, "basename $(readlink /opt/sglang/current)", check=True).stdout.strip()
    assert cur["identity"].startswith(release + "-")
    local = (REPO / ".sglang-deploy" / "bench" / f"{HOST}.jsonl").read_text()
    assert cur["run_id"] in local
    # the API key reached the client (all requests succeeded) but is nowhere in what we keep
    host_text = testbed.ssh(HOST, "cat /opt/sglang/bench/*.json", check=True).stdout
    for text in (r.stdout, r.stderr, local, host_text):
        assert SECRET not in text
    assert SECRET not in testbed.ssh(HOST, "ps -eo args", check=True).stdout


def test_same_speed_new_configuration_passes(testbed, benched_base):
    from sglang_deploy.commands import bench

    deploy(testbed, "sglang_restart_sec=31")
    os.environ[KEY_VAR] = SECRET   # in-process: the data check needs the named variable
    try:
        outcome = bench.run_and_gate("inventory/testbed.py", HOST, 0.95, cwd=REPO)
    finally:
        os.environ.pop(KEY_VAR, None)
    assert outcome.ok, outcome.message
    assert outcome.previous is not None
    assert outcome.current["identity"] != outcome.previous["identity"]
    assert outcome.current["release"] == outcome.previous["release"]   # same release, new unit
    assert "throughput holds" in outcome.message


def test_gate_rejects_a_slower_configuration(testbed, benched_twice):
    testbed.sim_env(HOST, "TOKENS_PER_S=180", "MAX_TOKENS_PER_S=450")
    deploy(testbed, "sglang_restart_sec=32")
    r = bench_cli("--min-throughput-ratio", "0.95")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    assert "FAIL: " in r.stdout
    assert "output token throughput dropped below 0.95" in r.stdout
    assert "concurrency 2:" in r.stdout and "concurrency 4:" in r.stdout
    # the table shows now vs previous with the ratio
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(HOST + " ")]
    assert [row[1] for row in rows] == ["2", "4"]
    assert all(float(row[4]) < 0.95 for row in rows)
    assert len(host_records(testbed)) == 3

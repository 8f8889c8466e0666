"""`sglang-deploy bench` on one testbed host: real bench_serving, real pyinfra, the gate.

The host is deployed with the real deploy.py (API key on); then the real
`python -m sglang.bench_serving` of the host's release venv runs against the simulator.
Throughput figures here are SIMULATED: the simulator paces tokens at TOKENS_PER_S per
request and MAX_TOKENS_PER_S per server (/etc/testbed/sim.env), which is what the gate is
tested with. A configuration change (`sglang_restart_sec`, which only changes the unit file)
makes a new identity each time. Tests run in file order and build on each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
PREFIX = os.environ.get("TESTBED_PREFIX", "tb")
HOST = f"{PREFIX}1"
KEY_VAR = "SGLANG_DEPLOY_TEST_BENCH_KEY"
SECRET = "bench-s3cret-key"
ENV = {KEY_VAR: SECRET}


def sim_env(*settings: str, check: bool = True) -> None:
    """`python -m testbed sim-env HOST KEY=VALUE...`: the simulator's rates, live."""
    r = subprocess.run([sys.executable, "-m", "testbed", "sim-env", HOST, *settings], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 or not check, r.stdout + r.stderr


@pytest.fixture(scope="module", autouse=True)
def blank_host(testbed):
    testbed.wipe(HOST)
    yield
    sim_env("TOKENS_PER_S=400", "MAX_TOKENS_PER_S=1000", check=False)


def deploy(testbed, *data: str) -> subprocess.CompletedProcess:
    args = [str(BIN / "pyinfra"), "-y", str(testbed.inventory), "deploy.py", "--limit", HOST,
            "--data", f"sglang_api_key_env={KEY_VAR}",
            # this test is about the benchmark: the simulated P2P copies are host memcpy and
            # slow down with the machine's load, which must not stop the deploy here
            "--data", "gpu_p2p_min_gbps=0.5"]
    for d in data:
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


def test_first_bench_records_figures(testbed):
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


def test_same_speed_new_configuration_passes(testbed):
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


def test_gate_rejects_a_slower_configuration(testbed):
    sim_env("TOKENS_PER_S=180", "MAX_TOKENS_PER_S=450")
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

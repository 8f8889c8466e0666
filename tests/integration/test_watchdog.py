"""The watchdog after ready, installed by the deploy, against the simulator's serving
scenarios on a testbed host: report mode records a wedge and leaves the server alone;
restart mode restarts a wedged server, which serves again, and a second deploy changes
nothing; a held deploy lock and the restart cap keep it from acting; a slow server that
still finishes requests is not restarted. Fast settings (a tick a second, a 2 s probe, two
failures) so that a wedge is judged in seconds."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from .helpers import BIN, REPO, SEED_FLAGS, TB1, both, changed, data_args, pyinfra_deploy

FAST = ("watchdog_interval_s=1", "watchdog_probe_timeout_s=2", "watchdog_probe_failures=2")
RESTART = ("watchdog=restart", *FAST, "watchdog_max_restarts_per_hour=1")
REPORT = ("watchdog=report", *FAST)
#: with SGLang's /metrics: the token counter tells a slow server from a wedged one
METRICS = (*RESTART, "sglang_flags=" + json.dumps({**SEED_FLAGS, "enable-metrics": True}))
STATE = "/var/lib/sglang-watchdog"


def status(testbed, *data: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), "status", str(testbed.inventory), "--limit",
                           TB1, *data_args(*data)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False, stdin=subprocess.DEVNULL)


def events(testbed) -> list[dict]:
    out = testbed.ssh(TB1, f"cat {STATE}/events.jsonl 2>/dev/null").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def fresh_watchdog(testbed, restarts: tuple[float, ...] = ()) -> None:
    """The watchdog started again on an empty record (RESTARTS: its earlier restarts)."""
    seed = json.dumps({"restarts": list(restarts)})
    testbed.ssh(TB1, f"systemctl stop sglang-watchdog && rm -f {STATE}/* && "
                     f"printf '%s\\n' '{seed}' > {STATE}/state.json && "
                     "systemctl start sglang-watchdog", check=True)


def first_wedge(testbed, timeout: float = 120.0) -> dict:
    return testbed.wait_for("the watchdog to record a wedge", lambda: next(
        (e for e in events(testbed) if e.get("verdict") == "wedged"), None), timeout=timeout)


def test_report_mode_records_a_wedge_and_leaves_the_server_alone(testbed, deployed_host):
    deployed_host(TB1, data=REPORT)
    fresh_watchdog(testbed)
    before = testbed.host_state(TB1)["invocation"]
    testbed.scenario(TB1, "wedge")
    event = first_wedge(testbed)
    assert event["action"] == "report" and event["outcome"] == "reported", event
    assert any("1-token generation failed" in e for e in event["evidence"]), event
    assert testbed.host_state(TB1)["invocation"] == before
    r = status(testbed, *REPORT)
    line = next((x for x in r.stdout.splitlines() if x.startswith(f"{TB1}: watchdog: ")), "")
    assert "active/running" in line and "wedged -> report (reported)" in line, both(r)


def test_restart_mode_restarts_a_wedged_server_that_then_serves(testbed, deployed_host):
    deployed_host(TB1, data=RESTART)
    fresh_watchdog(testbed)
    before = testbed.host_state(TB1)["invocation"]
    testbed.scenario(TB1, "wedge")
    done = testbed.wait_for("the watchdog's restart", lambda: next(
        (e for e in events(testbed) if e.get("action") == "restart" and e.get("outcome")),
        None), timeout=300)
    assert done["outcome"].startswith("restarted and verified"), done
    after = testbed.host_state(TB1)
    assert after["invocation"] != before and after["health"] == "200", after
    assert after["verified"] == after["invocation"]  # the watchdog verified the new server
    # a deploy afterwards finds the host as it left it: nothing to change, nothing restarted
    r = pyinfra_deploy([TB1], *data_args(*RESTART))
    assert r.returncode == 0, both(r)[-3000:]
    assert changed(r.stdout) == [], changed(r.stdout)


def test_a_held_deploy_lock_keeps_it_from_acting(testbed, deployed_host):
    deployed_host(TB1, data=RESTART)
    fresh_watchdog(testbed)
    before = testbed.host_state(TB1)["invocation"]
    holder = testbed.ssh(TB1, "mkdir -p /run/sglang-deploy; (flock -n /run/sglang-deploy/lock "
                              "sleep 300 >/dev/null 2>&1 & echo $!)", check=True).stdout.strip()
    try:
        testbed.scenario(TB1, "wedge")
        event = first_wedge(testbed)
        assert event["action"] == "report" and "deploy lock is held" in event["reason"], event
        assert testbed.host_state(TB1)["invocation"] == before
    finally:
        testbed.ssh(TB1, f"pkill -P {holder} sleep; kill {holder} 2>/dev/null; true")


def test_the_restart_cap_holds(testbed, deployed_host):
    deployed_host(TB1, data=RESTART)  # one restart per hour: one was made a minute ago
    fresh_watchdog(testbed, restarts=(time.time() - 60,))
    before = testbed.host_state(TB1)["invocation"]
    testbed.scenario(TB1, "wedge")
    event = first_wedge(testbed)
    assert event["action"] == "report" and "restart cap reached" in event["reason"], event
    assert testbed.host_state(TB1)["invocation"] == before


@pytest.mark.parametrize("delay", ["3"])
def test_slow_progress_is_not_restarted(testbed, deployed_host, delay):
    """Every request waits longer than the probe's deadline, but requests finish: the token
    counter (/metrics) moves, so the watchdog never judges a wedge. (Without /metrics it
    cannot tell the two apart once its probes time out: docs/design.md.)"""
    deployed_host(TB1, data=METRICS)
    fresh_watchdog(testbed)
    before = testbed.host_state(TB1)["invocation"]
    testbed.sim_env(TB1, f"PROGRESS_DELAY_S={delay}")
    testbed.scenario(TB1, "slow-progress")
    load = ("for i in $(seq 1 12); do curl -s -m 30 -o /dev/null -H \"Authorization: Bearer "
            "$(sed -n 's/^SGLANG_API_KEY=\"\\(.*\\)\"$/\\1/p' /etc/sglang/secrets.env)\" "
            "-d '{\"text\":\"x\",\"sampling_params\":{\"max_new_tokens\":4}}' "
            "http://127.0.0.1:30000/generate & sleep 1; done; wait")
    testbed.ssh(TB1, load, timeout=120)
    state = json.loads(testbed.ssh(TB1, f"cat {STATE}/state.json", check=True).stdout)
    assert [e for e in events(testbed) if e.get("verdict") == "wedged"] == []
    assert state["verdict"] in ("healthy", "slow", "suspect"), state
    assert testbed.host_state(TB1)["invocation"] == before

"""The watchdog of a multi-node group (`python -m testbed up --hosts 2 --group 2`): the deploy
installs it on rank 0 only (the group's API is there), where it judges the group's server;
node 1 gets none. A wedge of the group's server is recorded with its evidence and reported,
never acted on, even with `watchdog: restart`: a group restarts as one, from the controller
(docs/design.md, "The watchdog after ready"). Neither node's server is restarted.

Module scope: the group is set up for this module and recorded as single hosts again at its
end (the other modules' inventory has no group)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .helpers import BIN, REPO, TB1, TB2, both, data_args, pyinfra_deploy, run_testbed

FAST = ("watchdog_interval_s=1", "watchdog_probe_timeout_s=2", "watchdog_probe_failures=2")
DATA = ("watchdog=restart", *FAST, "gpu_p2p_min_gbps=0.05")
STATE = "/var/lib/sglang-watchdog"


@pytest.fixture(scope="module")
def grouped(testbed):
    """TB1 (rank 0) and TB2 (rank 1) one group, deployed with the watchdog set to restart."""
    try:
        run_testbed("up", "--hosts", "2", "--group", "2", timeout=900)
        testbed.reload()
        r = pyinfra_deploy(None, *data_args(*DATA), inventory=testbed.inventory)
        testbed.log.append(r)
        assert r.returncode == 0, both(r)[-4000:]
        yield testbed
    finally:
        run_testbed("up", "--hosts", "2", "--group", "0", timeout=300)
        testbed.reload()


def events(testbed, host: str) -> list[dict]:
    out = testbed.ssh(host, f"cat {STATE}/events.jsonl 2>/dev/null").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_rank_0_judges_the_groups_server_and_reports_a_wedge_without_acting(grouped):
    testbed = grouped
    group = json.loads(run_testbed("status", "--json").stdout)["groups"][0]
    assert group["hosts"][:2] == [TB1, TB2], group
    # rank 0 watches, with the group's size; node 1 has no watchdog (no API to probe)
    conf = json.loads(testbed.ssh(TB1, "cat /etc/sglang-watchdog/config.json", check=True).stdout)
    assert conf["group_nodes"] == 2 and conf["router_url"] is None, conf
    assert testbed.ssh(TB1, "systemctl is-active sglang-watchdog").stdout.strip() == "active"
    assert testbed.ssh(TB2, "systemctl show -p LoadState --value sglang-watchdog"
                       ).stdout.strip() == "not-found"
    testbed.ssh(TB1, f"systemctl stop sglang-watchdog && rm -f {STATE}/* && "
                     "systemctl start sglang-watchdog", check=True)
    before = {h: testbed.host_state(h)["invocation"] for h in (TB1, TB2)}
    testbed.scenario(TB1, "wedge")  # rank 0's process serves the group's generations
    event = testbed.wait_for("rank 0's watchdog to record a wedge", lambda: next(
        (e for e in events(testbed, TB1) if e.get("verdict") == "wedged"), None), timeout=180)
    assert event["action"] == "report" and event["outcome"] == "reported", event
    assert "2-node group: a group restarts as one" in event["reason"], event
    assert event["group"] == conf["group"] and event["group_nodes"] == 2, event
    assert any("1-token generation failed" in e for e in event["evidence"]), event
    # nothing was restarted: neither node's server, and no restart is recorded
    assert {h: testbed.host_state(h)["invocation"] for h in (TB1, TB2)} == before
    assert not [e for e in events(testbed, TB1) if e.get("action") == "restart"]
    # `status` shows rank 0's watchdog and its report
    r = subprocess.run([str(BIN / "sglang-deploy"), "status", str(testbed.inventory),
                        *data_args(*DATA)], cwd=REPO, capture_output=True, text=True,
                       timeout=600, check=False, stdin=subprocess.DEVNULL)
    line = next((x for x in r.stdout.splitlines() if x.startswith(f"{TB1}: watchdog: ")), "")
    assert "wedged -> report (reported)" in line, both(r)[-3000:]
    assert not any(x.startswith(f"{TB2}: watchdog: ") for x in r.stdout.splitlines()), r.stdout

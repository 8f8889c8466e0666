"""The watchdog of a host behind the router (SMG on the testbed's router host), under load
through the router: a wedged server is taken out of the router with the router's key (a
systemd credential), restarted, verified and put back; the router routes to it again.

Module scope: the router host is booted for this module and removed at its end, also after
a failed set-up (the other modules' inventory has no `routers` group)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from bench import router_load

from .helpers import PYINFRA, REPO, TB1, both, data_args, run_testbed

DATA = ("watchdog=restart", "watchdog_interval_s=1", "watchdog_probe_timeout_s=2",
        "watchdog_probe_failures=2", "gpu_p2p_min_gbps=0.05")
STATE = "/var/lib/sglang-watchdog"


def deploy(testbed) -> subprocess.CompletedProcess:
    r = subprocess.run([PYINFRA, "-y", str(testbed.inventory), "deploy.py", *data_args(*DATA)],
                       cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                       stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    return r


@pytest.fixture(scope="module")
def routed(testbed):
    try:
        run_testbed("up", "--hosts", os.environ.get("TESTBED_HOSTS", "3"), "--router", timeout=900)
        testbed.reload()
        r = deploy(testbed)
        assert r.returncode == 0, both(r)[-4000:]
        yield testbed
    finally:
        run_testbed("down", "--router", timeout=300)
        testbed.reload()


def router(testbed) -> tuple[str, str]:
    st = testbed.state
    host = next(h for h in st["hosts"] if h.get("role") == "router")
    return f"http://{host['address']}:30000", (Path(st["state_dir"]) / "router-key").read_text().strip()


def generate(url: str, key: str) -> int:
    req = urllib.request.Request(url + "/generate", method="POST", data=json.dumps(
        {"text": "x", "sampling_params": {"max_new_tokens": 1}}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def test_a_wedged_host_behind_the_router_is_taken_out_restarted_and_put_back(routed):
    testbed = routed
    testbed.ssh(TB1, f"systemctl stop sglang-watchdog && rm -f {STATE}/* && "
                     "systemctl start sglang-watchdog", check=True)
    url, key = router(testbed)
    before = testbed.host_state(TB1)["invocation"]

    def wedge_and_wait() -> dict:
        testbed.scenario(TB1, "wedge")
        return testbed.wait_for("the watchdog's restart", lambda: next(
            (json.loads(x) for x in testbed.ssh(TB1, f"cat {STATE}/events.jsonl 2>/dev/null")
             .stdout.splitlines() if '"action": "restart"' in x), None), timeout=300)

    result, event = router_load.run_through(url, key, "glm-5", wedge_and_wait, before_s=5.0)
    summary = result.summary()
    out = os.environ.get("WATCHDOG_ROUTED_RESULTS")
    if out:
        Path(out).write_text(json.dumps({"summary": summary, "event": event}, indent=2) + "\n")
    assert event["outcome"].startswith("restarted and verified"), event
    steps = [s.split(" ", 1)[1] for s in event["steps"]]
    assert steps[0] == "taken out of the router" and steps[-1] == "back in the router", steps
    assert summary["before"]["failed"] == 0, summary
    after = testbed.host_state(TB1)
    assert after["invocation"] != before and after["verified"] == after["invocation"], after
    assert generate(url, key) == 200

"""Read-only commands stay read-only, the release smoke touches the GPUs' doors under the
unit's sandbox, and each host's hardening in force is what `status` shows.

- The stand-in libcuda appends a line to /var/log/testbed-gpu-peer-copies for every copy
  between two devices: `status` and `deploy.py --dry` on a drifted serving host make none,
  the real deploy that restarts it makes them (the P2P retest before the restart).
- `python -m testbed kind HOST privileged` reboots a host as a privileged LXC container, whose
  systemd applies DevicePolicy (it writes its units' devices cgroups); the default hosts are
  unprivileged LXC containers, whose systemd cannot (systemd issue 23198): each as `status`
  says.
"""

from __future__ import annotations

import json
import subprocess

from .helpers import BIN, INVENTORY, PYINFRA, REPO, TB1, TB2, both, pyinfra_deploy, run_testbed

COPIES = "/var/log/testbed-gpu-peer-copies"


def _copies(testbed, host: str) -> int:
    out = testbed.ssh(host, f"cat {COPIES} 2>/dev/null | wc -l", check=True).stdout
    return int(out.strip())


def _status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), "status", str(INVENTORY), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def _hosts(r: subprocess.CompletedProcess) -> dict:
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def test_read_only_commands_make_no_peer_copies_on_a_serving_host(testbed, serving_host):
    """Needs: TB1 serving; leaves it serving with sglang_restart_sec=37."""
    serving_host(TB1)
    drift = "sglang_restart_sec=37"
    if "RestartSec=37" in testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service").stdout:
        drift = "sglang_restart_sec=36"  # an earlier run left 37: drift the other way
    testbed.ssh(TB1, f": > {COPIES}", check=True)
    r = _status("--limit", TB1, "--data", drift, "--json")
    row = _hosts(r)[TB1]
    assert row["reachable"] and not row["in_sync"], r.stdout[-2000:] + r.stderr[-2000:]
    assert any(c.startswith("P2P will be retested before the restart") for c in row["changes"])
    dry = subprocess.run([PYINFRA, str(INVENTORY), "deploy.py", "--limit", TB1, "--dry",
                          "--data", drift], cwd=REPO, capture_output=True, text=True,
                         timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert dry.returncode == 0, both(dry)[-3000:]
    assert "P2P will be retested before the restart" in both(dry)
    assert _copies(testbed, TB1) == 0, "a read-only command copied between the GPUs"
    pid = testbed.ssh(TB1, "systemctl show -p MainPID --value sglang", check=True).stdout.strip()
    r = pyinfra_deploy([TB1], "--data", drift)
    assert r.returncode == 0, both(r)[-3000:]
    assert _copies(testbed, TB1) > 0, "the deploy restarted the server without a P2P retest"
    out = both(r)
    assert out.index("P2P before restarting sglang") < out.index("Restart sglang")
    assert testbed.ssh(TB1, "systemctl show -p MainPID --value sglang").stdout.strip() != pid


def test_the_smoke_opens_the_gpu_nodes_and_status_shows_the_hardening_in_force(
        testbed, serving_host):
    """Needs: TB1 (default: an unprivileged LXC container, its systemd cannot apply
    DevicePolicy) and TB2, rebooted as a privileged LXC container (its systemd applies
    DevicePolicy), both serving; leaves both serving with sglang_restart_sec=39 and TB2
    unprivileged again. Also: a property required by
    `sglang_hardening_required` that is not in force fails the smoke on TB1."""
    run_testbed("kind", TB2, "privileged", timeout=300)
    try:
        serving_host(TB1, TB2)
        r = pyinfra_deploy([TB1, TB2], "--data", "sglang_restart_sec=39")  # a smoke on each
        assert r.returncode == 0, both(r)[-3000:]
        r = _status("--limit", TB1, "--limit", TB2, "--data", "sglang_restart_sec=39", "--json")
        rows = _hosts(r)
        one, two = rows[TB1]["hardening"], rows[TB2]["hardening"]
        assert [p["name"] for p in one["not_in_force"]] == ["DevicePolicy"], one
        assert "unprivileged container" in one["not_in_force"][0]["why"]
        assert "DevicePolicy" in two["in_force"] and not two["not_in_force"], two
        text = _status("--limit", TB1, "--limit", TB2, "--data", "sglang_restart_sec=39").stdout
        assert f"hardening: {TB1}: DevicePolicy not in force: " in text
        assert f"hardening: {TB2}:" not in text

        # required where it is not in force: the smoke fails before the switch, naming it
        pid = testbed.ssh(TB1, "systemctl show -p MainPID --value sglang").stdout.strip()
        r = pyinfra_deploy([TB1], "--data", "sglang_restart_sec=40",
                           "--data", 'sglang_hardening_required=["DevicePolicy"]')
        out = both(r)
        assert r.returncode != 0, out[-3000:]
        assert "found:    DevicePolicy: not in force: the container's systemd cannot" in out
        assert testbed.ssh(TB1, "systemctl show -p MainPID --value sglang").stdout.strip() == pid
        assert "RestartSec=39" in testbed.ssh(TB1, "cat /etc/systemd/system/sglang.service").stdout

        # a GPU node the unit's DeviceAllow does not list: refused under the sandbox
        testbed.ssh(TB2, "mknod -m 666 /dev/nvidia8 c 195 8", check=True)
        pid = testbed.ssh(TB2, "systemctl show -p MainPID --value sglang").stdout.strip()
        current = testbed.ssh(TB2, "readlink /opt/sglang/current").stdout.strip()
        r = pyinfra_deploy([TB2], "--data", "sglang_restart_sec=40")
        out = both(r)
        assert r.returncode != 0, out[-3000:]
        assert "/dev/nvidia8: refused EPERM (the unit's DeviceAllow does not list it)" in out
        assert testbed.ssh(TB2, "systemctl show -p MainPID --value sglang").stdout.strip() == pid
        assert testbed.ssh(TB2, "readlink /opt/sglang/current").stdout.strip() == current
        assert "RestartSec=39" in testbed.ssh(TB2, "cat /etc/systemd/system/sglang.service").stdout
        code = testbed.ssh(TB2, "curl -s -o /dev/null -w '%{http_code}' "
                                "http://127.0.0.1:30000/health").stdout.strip()
        assert code == "200"
    finally:
        testbed.ssh(TB2, "rm -f /dev/nvidia8")
        run_testbed("kind", TB2, "unprivileged", timeout=300)

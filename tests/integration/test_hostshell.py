"""`sglang-deploy logs` and the host shell (fabric) against a deployed testbed host.

The module deploys its own host (the testbed's last one; a converged host is left as it is),
so every test here passes alone. The tool runs as a subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import shutil
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
READY = "The server is fired up and ready to roll!"


@pytest.fixture(scope="module")
def host(testbed):
    """A testbed host that runs the deployed, verified service."""
    name = testbed.hosts[-1]
    r = subprocess.run([str(BIN / "pyinfra"), "-y", str(testbed.inventory), "deploy.py", "--limit", name],
                       cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    testbed.log.append(r)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return name


def tool(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), *args], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def main_pid(testbed, host: str) -> str:
    return testbed.ssh(host, "systemctl show -p MainPID --value sglang.service", check=True).stdout.strip()


def restart(testbed, host: str) -> None:
    """A restart by hand. The unit allows 3 starts in 10 minutes (a crash loop stops), and
    every hand restart counts: reset that counter first, so repeated runs never meet it."""
    testbed.ssh(host, "systemctl reset-failed sglang.service; systemctl restart sglang.service",
                check=True)


def journalctl_pids(testbed, host: str) -> str:
    return testbed.ssh(host, "pgrep -x journalctl || true").stdout.strip()


def test_logs_shows_the_service_journal(testbed, host):
    r = tool("logs", str(testbed.inventory), host, "-n", "400")
    assert r.returncode == 0, r.stderr
    assert READY in r.stdout
    assert all(line.split()[1] == host for line in r.stdout.splitlines() if line.strip())


def test_logs_follow_streams_a_restarts_startup_lines(testbed, host):
    # -n 1: journalctl prints the journal's last line once it has opened the journal and
    # reached its end; from that line on, every new entry of the unit is streamed
    proc = subprocess.Popen([str(BIN / "sglang-deploy"), "logs", str(testbed.inventory), host,
                             "-n", "1", "--follow"], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        testbed.wait_for("the follower's first line (the journal's tail)", lambda: seen, timeout=120)
        attached = len(seen)
        restart(testbed, host)
        new_pid = main_pid(testbed, host)
        testbed.wait_for("the restart's startup lines in the followed journal",
                         lambda: [line for line in seen[attached:] if READY in line], timeout=120)
        ready = [line for line in seen[attached:] if READY in line]
        assert f"python[{new_pid}]:" in ready[-1], ready
        assert any("systemd[1]: Started sglang.service" in line for line in seen[attached:]), seen[attached:]
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
    assert rc == 130
    # the remote journalctl ends with the session (no follower left behind on the host)
    testbed.wait_for("the remote follower to exit", lambda: journalctl_pids(testbed, host) == "",
                     timeout=30)


def test_journal_since_last_start_holds_only_the_last_run(testbed, host):
    before = main_pid(testbed, host)
    restart(testbed, host)
    after = main_pid(testbed, host)
    testbed.wait_for("the restarted server's ready line", lambda: READY in testbed.ssh(
        host, f"journalctl _PID={after} --no-pager -o cat").stdout, timeout=120)
    # in a child process: reading the inventory imports pyinfra's CLI (gevent's monkey-patching)
    r = subprocess.run([sys.executable, "-c",
                        ("import sys; from sglang_deploy.controller import hostshell; "
                        "sys.stdout.write(hostshell.journal_since_last_start(sys.argv[1], sys.argv[2]))"),
                        str(testbed.inventory), host], check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "systemd[1]: Starting sglang.service" in lines[0] or "systemd[1]: Started sglang.service" in lines[0]
    assert any(READY in line and f"python[{after}]" in line for line in lines)
    assert not any(f"python[{before}]" in line for line in lines)
    # the same journal, analysed: `logs --explain` (explain-log's analysis of the last start)
    r = tool("logs", str(testbed.inventory), host, "--explain", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert (result["outcome"], result["phase"], result["cause"]) == ("ready", "ready", None)
    assert [p["name"] for p in result["phases"]][-1] == "ready"


@pytest.mark.parametrize("case, words", [
    ("missing", ["no such file", "ssh-keyscan"]),
    ("unknown", ["no entry for", "ssh-keyscan"]),
    ("changed", ["a different key", "ssh-keygen -R"]),
])
def test_host_key_problems_are_one_actionable_line(testbed, host, tmp_path, case, words):
    known = tmp_path / "known_hosts"
    if case == "unknown":
        known.write_text("")
    elif case == "changed":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
                       check=True, timeout=30)
        other = (tmp_path / "other.pub").read_text().split()
        known.write_text(f"{testbed.address(host)} {other[0]} {other[1]}\n")
    inv = inventory(tmp_path, testbed, host, ssh_known_hosts_file=str(known),
                    ssh_key=testbed.state["key"], ssh_user="root")
    r = tool("logs", str(inv), host, "-n", "1")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def inventory(tmp_path: Path, testbed, host: str, **data) -> Path:
    data = {"ssh_hostname": testbed.address(host), "ssh_strict_host_key_checking": "yes", **data}
    path = tmp_path / "inventory.py"
    path.write_text(f"hosts = [({host!r}, {data!r})]\n")
    return path


@pytest.fixture
def agent(tmp_path):
    """A private ssh-agent for this test (stopped by its pid)."""
    sock = tmp_path / "agent.sock"
    out = subprocess.run(["ssh-agent", "-s", "-a", str(sock)], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        yield {"SSH_AUTH_SOCK": str(sock)}
    finally:
        os.kill(pid, signal.SIGTERM)


def test_logs_uses_ssh_config_and_the_agent(testbed, host, tmp_path, agent):
    """Only an alias in the inventory: address and user from the SSH config, the key from the
    agent (none in the inventory, no default key files)."""
    key = tmp_path / "id"
    shutil.copy(testbed.state["key"], key)
    key.chmod(0o600)
    subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, **agent}, check=True, timeout=30,
                   capture_output=True)
    key.unlink()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {host}-alias\n  HostName {testbed.address(host)}\n  User root\n")
    inv = inventory(tmp_path, testbed, host, ssh_hostname=f"{host}-alias", ssh_config_file=str(config),
                    ssh_known_hosts_file=testbed.state["known_hosts"], ssh_look_for_keys=False)
    r = tool("logs", str(inv), host, "-n", "5", env=agent)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 5
    r = tool("logs", str(inv), host, "-n", "5", env={"SSH_AUTH_SOCK": str(tmp_path / "none")})
    assert r.returncode == 2 and "authentication as root" in r.stderr, r.stderr


def test_logs_unlocks_a_key_with_the_inventorys_passphrase(testbed, host, tmp_path):
    key = tmp_path / "id"
    shutil.copy(testbed.state["key"], key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "pass phrase", "-f", str(key)], check=True,
                   timeout=30, capture_output=True)
    base = {"ssh_user": "root", "ssh_key": str(key), "ssh_known_hosts_file": testbed.state["known_hosts"],
                "ssh_allow_agent": False, "ssh_look_for_keys": False}
    r = tool("logs", str(inventory(tmp_path, testbed, host, **base)), host, "-n", "1")
    assert r.returncode == 2 and "ssh_key_password" in r.stderr, r.stderr
    r = tool("logs", str(inventory(tmp_path, testbed, host, ssh_key_password="pass phrase",
                                               **base)), host, "-n", "1")
    assert r.returncode == 0, r.stderr
    assert "pass phrase" not in r.stdout + r.stderr


def test_cache_save_streams_the_cache_folder(testbed, host, tmp_path):
    archive = tmp_path / "cache.tar.gz"
    r = tool("cache", "save", str(testbed.inventory), host, str(archive))
    assert r.returncode == 0, r.stderr
    import tarfile

    with tarfile.open(archive) as tf:
        names = tf.getnames()
    assert any(n.endswith("rank_tp0_pp0_dp0.json") for n in names), names
    assert list(tmp_path.glob("*cache.tar.gz*")) == [archive]  # no temporary left beside it


def test_logs_goes_through_a_proxyjump_of_the_ssh_config(testbed, host, tmp_path):
    """The jump host is the host itself: the target's session then arrives from its own address."""
    address, key = testbed.address(host), testbed.state["key"]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {host}-jump\n  HostName {address}\n  User root\n  IdentityFile {key}\n"
                      f"Host {host}-via-jump\n  HostName {address}\n  User root\n  IdentityFile {key}\n"
                      f"  ProxyJump {host}-jump\n")
    inv = inventory(tmp_path, testbed, host, ssh_hostname=f"{host}-via-jump", ssh_config_file=str(config),
                    ssh_known_hosts_file=testbed.state["known_hosts"], ssh_allow_agent=False,
                    ssh_look_for_keys=False)

    def logins_from_itself() -> int:
        return testbed.ssh(host, "journalctl -u ssh --no-pager -o cat", check=True).stdout.count(
            f"Accepted publickey for root from {address} ")

    before = logins_from_itself()
    r = tool("logs", str(inv), host, "-n", "1")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 1
    assert logins_from_itself() == before + 1

"""The command line on a real testbed host: bad input fails before any connection, with exit
status 2, and a command never reports success for something it did not do.

- a launch-flag typo fails on the controller, against the flags of the LOCKED sglang wheel,
  naming the closest flag, in `sglang-deploy rollout` and in plain `pyinfra ... deploy.py`
  (config.py's before-connect validation), and the host sees no SSH login at all;
- `rebuild INVENTORY nosuchhost` and `status missing.py` exit 2 and name what exists;
- `status --json` prints only JSON on stdout, and the host's own error when it has no record.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
TYPO = 'sglang_flags={"tp-sizee": 8}'


def run(testbed, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    return r


def logins(testbed, host: str) -> int:
    """SSH logins the host's sshd accepted so far (this query's own login included)."""
    r = testbed.ssh(host, "journalctl -q --no-pager -t sshd -t sshd-session "
                          "| grep -c 'Accepted publickey' || true", check=True)
    return int(r.stdout.strip() or 0)


def test_a_flag_typo_fails_before_any_connection_naming_the_closest_locked_flag(testbed):
    host = testbed.hosts[0]
    inv = str(testbed.inventory)
    before = logins(testbed, host)
    tool = run(testbed, str(BIN / "sglang-deploy"), "rollout", inv, "--data", TYPO)
    plain = run(testbed, str(BIN / "pyinfra"), "-y", inv, "deploy.py", "--data", TYPO)
    after = logins(testbed, host)

    assert tool.returncode == 2, tool.stderr
    line = tool.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    # an input error reads as one (issue 30): the host first, then the key
    assert f"[{host}] invalid data: sglang_flags: expected" in line
    assert "locked SGLang 0.5.12.post1" in line
    assert "--tp-sizee is not a flag of SGLang 0.5.12.post1" in line
    assert "did you mean --tp-size?" in line
    assert "rollout order" not in tool.stdout  # stopped before planning anything

    assert plain.returncode == 2  # pyinfra too ends on an input error with the input status
    assert f"[{host}] invalid data: sglang_flags" in plain.stdout + plain.stderr
    assert "did you mean --tp-size?" in plain.stdout + plain.stderr
    assert "Connected" not in plain.stdout + plain.stderr
    assert after - before == 1, f"{after - before - 1} SSH login(s) during the two runs"


def test_rebuild_of_an_unknown_host_fails_naming_the_hosts(testbed):
    r = run(testbed, str(BIN / "sglang-deploy"), "rebuild", str(testbed.inventory), "nosuchhost")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "nothing matches 'nosuchhost'" in r.stderr
    assert all(h in r.stderr for h in testbed.hosts)
    assert "rebuilt" not in r.stdout + r.stderr


def test_status_of_a_missing_inventory_fails_instead_of_an_empty_table(testbed):
    r = run(testbed, str(BIN / "sglang-deploy"), "status", "missing.py")
    assert r.returncode == 2 and r.stdout == ""
    assert "no file missing.py" in r.stderr and "Traceback" not in r.stderr


def test_status_json_is_only_json_and_names_the_hosts_state(testbed):
    host = testbed.hosts[0]
    r = run(testbed, str(BIN / "sglang-deploy"), "status", str(testbed.inventory),
            "--limit", host[:-1] + "*", "--json")
    doc = json.loads(r.stdout)  # nothing but JSON on stdout
    rows = doc["hosts"]
    assert doc["router"] is None  # no `routers` group in this inventory
    assert [row["host"] for row in rows] == testbed.hosts
    assert all(row["reachable"] is True and isinstance(row["healthy"], bool) for row in rows)
    # whatever state earlier tests left: the exit status says whether every host is in sync
    assert r.returncode == (0 if all(row["in_sync"] and row["healthy"] for row in rows) else 1)
    assert "see the pyinfra output" not in json.dumps(rows)

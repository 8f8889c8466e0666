"""unitstart.start_command, run by /bin/sh against a stand-in `systemctl` and `journalctl`
that play back a sequence of start results and record every call."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sglang_deploy.core import unitstart

STUB = r"""#!/bin/sh
# stand-in systemctl: each start|restart takes the next status of $STUB_DIR/statuses
# (0: started; N: failed with ExecMainStatus=N, Result=exit-code)
echo "systemctl $*" >> "$STUB_DIR/calls"
case "$1" in
  start|restart)
    st=$(head -n 1 "$STUB_DIR/statuses"); sed -i 1d "$STUB_DIR/statuses"
    echo "$st" > "$STUB_DIR/status"
    [ "$st" = 0 ] && exit 0
    echo "Job for $2 failed because the control process exited with error code." >&2; exit 1;;
  show)
    case "$3" in
      ExecMainStatus) cat "$STUB_DIR/status";;
      Result) echo exit-code;;
    esac;;
esac
exit 0
"""
JOURNAL = """#!/bin/sh
echo "journalctl $*" >> "$STUB_DIR/calls"
echo "sglang.service: Failed at step NAMESPACE spawning /opt/x/python: No such file or directory"
"""


def run(tmp_path: Path, statuses: list[int], verb: str = "restart") -> tuple[int, str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("systemctl", STUB), ("journalctl", JOURNAL), ("sleep", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "statuses").write_text("".join(f"{s}\n" for s in statuses))
    (tmp_path / "status").write_text("0\n")
    (tmp_path / "calls").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path)}
    r = subprocess.run(["/bin/sh", "-c", unitstart.start_command(verb, "sglang.service")],
                       env=env, capture_output=True, text=True, timeout=30, check=False)
    return r.returncode, r.stderr, (tmp_path / "calls").read_text().splitlines()


def starts(calls: list[str]) -> list[str]:
    return [c for c in calls if c.split()[1] in ("start", "restart", "reset-failed")]


def test_a_start_that_succeeds_runs_systemctl_once_and_says_nothing(tmp_path):
    rc, err, calls = run(tmp_path, [0])
    assert rc == 0 and err == ""
    assert starts(calls) == ["systemctl restart sglang.service"]


def test_a_cgroup_race_is_started_again_after_a_reset(tmp_path):
    """219/CGROUP: the process never ran; the unit's failed state (and start counter) is
    reset and the restart runs again, which succeeds."""
    rc, err, calls = run(tmp_path, [219, 0])
    assert rc == 0, err
    assert starts(calls) == ["systemctl restart sglang.service",
                             "systemctl reset-failed sglang.service",
                             "systemctl restart sglang.service"]
    assert "219/CGROUP" in err and "starting it again" in err


def test_a_cgroup_race_that_persists_fails_after_the_last_attempt_with_the_fix(tmp_path):
    rc, err, calls = run(tmp_path, [219] * unitstart.ATTEMPTS + [0], verb="start")
    assert rc != 0
    assert [c for c in starts(calls) if "reset-failed" not in c] == \
        ["systemctl start sglang.service"] * unitstart.ATTEMPTS
    assert "sglang.service did not start: systemd result exit-code, exit status 219" in err
    assert "cgroup file system is not writable" in err  # the fix
    assert ("journalctl -n 15 --no-pager -o cat UNIT=sglang.service + "
            "_SYSTEMD_UNIT=sglang.service") in calls


@pytest.mark.parametrize("status,name", [(226, "NAMESPACE"), (203, "EXEC"), (217, "USER")])
def test_any_other_failure_is_not_retried_and_says_what_the_status_means(tmp_path, status, name):
    rc, err, calls = run(tmp_path, [status, 0])
    assert rc != 0
    assert starts(calls) == ["systemctl restart sglang.service"]
    meaning, fix = unitstart.PRE_EXEC_STATUSES[status][1:]
    assert f"status {status}/{name}: {meaning}. Fix: {fix}." in err
    # the journal's last lines follow (here: the step systemd failed at)
    assert "Failed at step NAMESPACE spawning" in err.split("the last 15 lines of its journal:")[1]


def test_a_server_that_exits_during_its_start_points_to_its_journal(tmp_path):
    rc, err, _ = run(tmp_path, [1])
    assert rc != 0
    assert "exit status 1" in err and "read the journal lines below" in err


def test_only_start_and_restart_are_accepted():
    with pytest.raises(ValueError):
        unitstart.start_command("stop", "sglang.service")

"""The host-side deploy lock (sglang_deploy.deploylock): the stale/live rule and the holder
shell, run here against a temporary lock folder."""

from __future__ import annotations

import json
import subprocess

from sglang_deploy import deploylock as D

MINE = {"controller": "laptop", "pid": 100, "user": "ops", "started": "t", "command": "pyinfra deploy"}


def test_same_controller_dead_pid_is_stale_everything_else_live():
    owner = {**MINE, "pid": 42, "holder_pid": 7}
    assert D.decide(owner, MINE, alive=lambda pid: False).kind == "stale"
    live = D.decide(owner, MINE, alive=lambda pid: True)
    assert live.kind == "live" and "ops@laptop pid 42" in live.message and "holder pid 7" in live.message
    # another controller: its pid cannot be checked from here
    assert D.decide({**owner, "controller": "other"}, MINE, alive=lambda pid: False).kind == "live"
    assert D.decide(None, MINE, alive=lambda pid: False).kind == "live"


def test_live_error_names_owner_and_fix():
    err = D.live_error("gpu-1", {**MINE, "holder_pid": 7})
    text = str(err)
    assert "gpu-1" in text and "ops@laptop pid 100" in text and "kill 7" in text


def _holder(tmp_path, owner):
    cmd = D.holder_command(owner).replace(D.LOCK_DIR, str(tmp_path))
    return subprocess.Popen(["sh", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_holder_takes_holds_and_frees_the_lock_with_its_stdin(tmp_path):
    owner = {**MINE, "command": "it's \"quoted\" $HOME"}
    first = _holder(tmp_path, owner)
    assert first.stdout.readline().strip() == "LOCKED"
    written = json.loads((tmp_path / "owner.json").read_text())
    assert written == {**owner, "holder_pid": first.pid}
    second = _holder(tmp_path, MINE)
    out, _ = second.communicate(timeout=10)
    assert out.splitlines()[0] == "BUSY" and D.parse_busy(out.splitlines()[1:]) == written
    first.stdin.close()  # the connection ends: the lock is free again
    assert first.wait(10) == 0
    third = _holder(tmp_path, MINE)
    assert third.stdout.readline().strip() == "LOCKED"
    third.stdin.close()
    third.wait(10)

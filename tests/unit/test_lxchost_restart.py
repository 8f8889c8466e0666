"""core/lxchost/restart.py: the restart decision per situation and dialect."""

from __future__ import annotations

import pytest
from lxchost_fixtures import run_standin

from sglang_deploy.core.lxchost import restart as r


def decide(**kw):
    base = {"changed": True, "running": True, "serving": True}
    return r.decide(kw.pop("dialect", "lxc"), "gpu-node-1", **{**base, **kw})


def test_unchanged_does_nothing():
    assert decide(changed=False).action == r.NOTHING


def test_stopped_is_started():
    d = decide(running=False, dialect="proxmox", ctid=105)
    assert (d.action, d.command) == (r.START, "pct start 105")


def test_not_serving_restarts_now():
    d = decide(serving=False)
    assert (d.action, d.command) == (r.RESTART, "lxc-stop -n gpu-node-1 && lxc-start -n gpu-node-1")


def test_serving_when_idle_is_only_reported_with_the_command():
    d = decide(dialect="incus")
    assert (d.action, d.command) == (r.NEEDED, "incus restart gpu-node-1")
    assert "when-idle" in d.reason


def test_now_restarts_a_serving_container_or_drains_it_behind_a_router():
    assert decide(policy="now").action == r.RESTART
    d = decide(policy="now", behind_router=True, dialect="lxd")
    assert (d.action, d.command) == (r.DRAIN, "lxc restart gpu-node-1")


def test_never_leaves_even_an_idle_container():
    d = decide(policy="never", serving=False, dialect="proxmox", ctid=105)
    assert (d.action, d.command) == (r.NEEDED, "pct reboot 105")


@pytest.mark.parametrize("dialect", ["proxmox", "incus", "lxd"])
def test_restart_and_start_argv_are_accepted_by_the_stand_ins(tmp_path, dialect):
    for argv in r.restart_argv(dialect, "gpu-node-1", 105) + r.start_argv(dialect, "gpu-node-1", 105):
        done, calls = run_standin(argv, tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
        assert calls[-1]["argv"] == list(argv)

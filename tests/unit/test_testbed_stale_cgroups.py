"""The testbed after a killed run: the empty cgroups its containers left are removed before
a container of the same name starts again (else LXC names the new one NAME-1 and the
testbed's liveness check, which looks for lxc.payload.NAME, calls a booting host stopped)."""

from __future__ import annotations

from testbed import lxc


def test_a_killed_runs_empty_cgroups_are_removed_and_busy_ones_kept(tmp_path):
    for d in ("cpu/lxc.payload.tz1/init.scope", "cpu/lxc.monitor.tz1",
              "unified/lxc.payload.tz1/system.slice/ssh.service", "lxc.payload.tz1",
              "memory/lxc.payload.tz2", "memory/lxc.payload.tz10"):
        (tmp_path / d).mkdir(parents=True)
    busy = tmp_path / "pids/lxc.payload.tz1/init.scope"
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("4242\n")  # a process still in it: rmdir refuses
    assert lxc.clear_stale_cgroups("tz1", root=tmp_path) == 7
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("lxc.*"))
    assert left == ["memory/lxc.payload.tz10", "memory/lxc.payload.tz2",
                    "pids/lxc.payload.tz1"]
    assert busy.is_dir()
    assert lxc.clear_stale_cgroups("tz9", root=tmp_path) == 0

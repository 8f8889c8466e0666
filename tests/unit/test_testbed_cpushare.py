"""testbed/cpushare.py: a host held to its own share of the machine's cores (cgroup v1 cpu),
against a fake cgroup folder."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from testbed import TestbedError as _TestbedError  # not a test class
from testbed import cpushare


def test_a_host_is_held_to_its_cores_and_let_go(tmp_path, monkeypatch):
    root = tmp_path / "cpu"
    root.mkdir()
    (root / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setattr(cpushare, "CPU_CGROUP", root)
    monkeypatch.setattr(cpushare.procs, "_descendants", lambda pid: [pid])
    (root / "testbed-cpu-tb1").mkdir()  # the kernel makes a cgroup's files with it
    (root / "testbed-cpu-tb1" / "cgroup.procs").write_text("")
    cg = cpushare.limit("tb1", os.getpid(), 0.5)
    assert (cg / "cpu.cfs_quota_us").read_text() == "50000\n"
    assert (cg / "cpu.shares").read_text() == "8192\n"  # its share first on a busy machine
    assert (cg / "cgroup.procs").read_text().split() == [str(os.getpid())]
    assert cpushare.cores_of("tb1") == 0.5
    (cg / "cgroup.procs").write_text("")  # a real cgroup empties as its processes move out
    # a real cgroup's files go with its rmdir
    monkeypatch.setattr(pathlib.Path, "rmdir", lambda self: shutil.rmtree(self))
    cpushare.unlimit("tb1")
    assert not cg.exists() and cpushare.cores_of("tb1") is None


def test_no_cpu_controller_is_said_with_the_equivalent(tmp_path, monkeypatch):
    monkeypatch.setattr(cpushare, "CPU_CGROUP", tmp_path)
    with pytest.raises(_TestbedError, match="CPUQuota"):
        cpushare.limit("tb1", os.getpid(), 0.5)

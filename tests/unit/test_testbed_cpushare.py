"""testbed/cpushare.py: a host held to its own share of the machine's cores (cgroup v1 cpu
quota on its LXC container's cgroup), against a fake cgroup folder."""

from __future__ import annotations

import os

import pytest

from testbed import TestbedError as _TestbedError  # not a test class
from testbed import cpushare


def test_a_host_is_held_to_its_cores_and_let_go(tmp_path, monkeypatch):
    root = tmp_path / "cpu"
    cg = root / "lxc.payload.tb1"
    cg.mkdir(parents=True)
    (root / "cpu.cfs_quota_us").write_text("-1\n")
    for f, v in (("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000"), ("cpu.shares", "1024")):
        (cg / f).write_text(v + "\n")
    monkeypatch.setattr(cpushare, "CPU_CGROUP", root)
    monkeypatch.setattr(cpushare, "cgroup_of", lambda pid: cg)
    assert cpushare.cores_of(os.getpid()) is None
    assert cpushare.limit("tb1", os.getpid(), 0.5) == cg
    assert (cg / "cpu.cfs_quota_us").read_text() == "50000\n"
    assert (cg / "cpu.shares").read_text() == "8192\n"  # its share first on a busy machine
    assert cpushare.cores_of(os.getpid()) == 0.5
    cpushare.unlimit("tb1", os.getpid())
    assert (cg / "cpu.shares").read_text() == "1024\n"
    assert cpushare.cores_of(os.getpid()) is None


def test_no_cpu_controller_is_said_with_the_equivalent(tmp_path, monkeypatch):
    monkeypatch.setattr(cpushare, "CPU_CGROUP", tmp_path)
    with pytest.raises(_TestbedError, match=r"lxc\.cgroup2\.cpu\.max"):
        cpushare.limit("tb1", os.getpid(), 0.5)

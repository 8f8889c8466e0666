"""The testbed's cgroup modes (``testbed/cgroupmode.py``): how a host's container boots, so that
its systemd can apply DevicePolicy (unified) or cannot (legacy, as an unprivileged LXC)."""

from __future__ import annotations

from testbed import cgroupmode


def test_a_legacy_host_boots_as_before(monkeypatch):
    monkeypatch.setenv("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")  # never leaks from our env
    for h in ({}, {"cgroup": "legacy"}):
        assert cgroupmode.mode(h) == "legacy"
        assert cgroupmode.nspawn_options(h) == []
        assert "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY" not in cgroupmode.nspawn_env(h)


def test_a_unified_host_gets_cgroup_v2_and_may_load_bpf_device_programs():
    h = {"cgroup": "unified"}
    assert cgroupmode.nspawn_env(h)["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] == "1"
    opts = cgroupmode.nspawn_options(h)
    assert "--capability=CAP_BPF,CAP_PERFMON" in opts and "--system-call-filter=bpf" in opts

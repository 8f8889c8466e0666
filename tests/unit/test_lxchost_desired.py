"""core/lxchost/desired.py and pve.py: the passthrough lines per dialect, from real host
facts, and which Proxmox VE takes devN entries."""

from __future__ import annotations

import pytest
from lxchost_fixtures import fixture, grep_excerpt

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import desired as d
from sglang_deploy.core.lxchost import facts as f
from sglang_deploy.core.lxchost import pve


def rtx(cgroup="cgroup2fs"):
    """The real Proxmox host of nodes/rtx-proxmox-511.txt (uvm 511, caps 236)."""
    return f.host_facts(grep_excerpt("proc-devices/grep-rtx-proxmox-511.txt"),
                        fixture("nodes/rtx-proxmox-511.txt"), cgroup_fstype=cgroup)


def eight(uvm=511):
    """An 8-GPU host: the listing is made here (no real 8-GPU listing in the fixtures)."""
    nodes = "".join(f"/dev/nvidia{n}|character special file|c3|{n:x}|666\n" for n in range(8))
    nodes += ("/dev/nvidiactl|character special file|c3|ff|666\n"
              f"/dev/nvidia-uvm|character special file|{uvm:x}|0|666\n"
              f"/dev/nvidia-uvm-tools|character special file|{uvm:x}|1|666\n")
    return f.host_facts(f"Character devices:\n195 nvidia\n{uvm} nvidia-uvm\n", nodes)


def lines(dialect, facts, gpus=None, **kw):
    return [d.render(x, dialect, i) for i, x in enumerate(d.desired_directives(
        dialect, facts, gpus, **kw))]


def test_proxmox_lines_of_a_real_host_one_rule_per_major():
    assert lines("proxmox", rtx()) == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 511:* rwm",
        "lxc.cgroup2.devices.allow: c 236:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
    ]


def test_plain_lxc_on_a_cgroup_v1_host_uses_v1_rules_and_key_equals_value():
    out = lines("lxc", rtx("tmpfs"))
    assert out[0] == "lxc.cgroup.devices.allow = c 195:* rwm"
    assert out[3] == "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"


def test_eight_gpus_each_mounted_and_no_caps_without_its_folder():
    out = lines("lxc", eight())
    assert sum("create=file" in x for x in out) == 8 + 3
    assert not any("nvidia-caps" in x for x in out)
    assert [x for x in out if "devices.allow" in x] == [
        "lxc.cgroup2.devices.allow = c 195:* rwm", "lxc.cgroup2.devices.allow = c 511:* rwm"]


def test_some_gpus_get_per_minor_rules_so_the_cgroup_keeps_the_others_out():
    out = lines("proxmox", eight(), gpus=[2, 5])
    assert [x for x in out if "devices.allow" in x] == [
        "lxc.cgroup2.devices.allow: c 195:2 rwm", "lxc.cgroup2.devices.allow: c 195:5 rwm",
        "lxc.cgroup2.devices.allow: c 195:255 rwm", "lxc.cgroup2.devices.allow: c 511:* rwm"]
    assert [x.split()[1] for x in out if "/dev/nvidia" in x and "create=file" in x][:2] == [
        "/dev/nvidia2", "/dev/nvidia5"]


def test_a_gpu_the_host_lacks_is_a_typed_error():
    with pytest.raises(LxcHostError) as e:
        d.desired_directives("lxc", eight(), [3, 9])
    assert "no /dev/nvidia9" in e.value.found and "[0, 1, 2, 3, 4, 5, 6, 7]" in e.value.found


def test_proxmox_dev_entries_carry_the_host_modes():
    out = [x.value for x in d.desired_directives("proxmox", rtx(), dev_entries_ok=True)]
    assert out == ["/dev/nvidia0,mode=0666", "/dev/nvidiactl,mode=0666",
                   "/dev/nvidia-uvm,mode=0666", "/dev/nvidia-uvm-tools,mode=0666",
                   "/dev/nvidia-caps/nvidia-cap1,mode=0600",
                   "/dev/nvidia-caps/nvidia-cap2,mode=0444"]


def test_plain_lxc_never_gets_dev_entries():
    assert d.desired_directives("lxc", rtx(), dev_entries_ok=True)[0].key.startswith("lxc.")


def test_a_host_that_cannot_pass_its_gpus_raises_before_any_line():
    broken = f.host_facts(grep_excerpt("proc-devices/grep-open-rtx5060-no-uvm.txt"),
                          fixture("nodes/rtx-proxmox-511.txt"))
    with pytest.raises(LxcHostError, match="nvidia_uvm"):
        d.desired_directives("proxmox", broken)


def test_render_refuses_a_dev_without_index_or_outside_proxmox():
    with pytest.raises(ValueError):
        d.render(d.Directive(d.DEV, "/dev/nvidia0"), "lxc", 0)
    with pytest.raises(ValueError):
        d.render(d.Directive(d.DEV, "/dev/nvidia0"), "proxmox")


@pytest.mark.parametrize(("name", "manager", "container", "dev"), [
    ("pve/pveversion-7.4.txt", (7, 4), None, False),
    ("pve/pveversion-8.1.3.txt", (8, 1, 3), None, True),
    ("pve/pveversion-v-8.4.txt", (8, 4, 16), (5, 3, 3), True),
])
def test_pveversion(name, manager, container, dev):
    v = pve.parse_pveversion(fixture(name))
    assert (v.manager, v.container, v.dev_entries) == (manager, container, dev)


def test_pve_container_decides_over_the_manager():
    v = pve.parse_pveversion("pve-manager: 8.1.0 (running version: 8.1.0/x)\n"
                             "pve-container: 5.0.6\n")
    assert not v.dev_entries
    assert pve.parse_pveversion("pve-manager: 8.0.4\npve-container: 5.0.7\n").dev_entries


def test_not_proxmox():
    with pytest.raises(LxcHostError, match="Proxmox VE host"):
        pve.parse_pveversion("bash: pveversion: command not found\n")


def test_all_gpus_named_in_another_order_are_still_all():
    out = lines("lxc", eight(), gpus=[7, 6, 5, 4, 3, 2, 1, 0])
    assert out[0] == "lxc.cgroup2.devices.allow = c 195:* rwm"

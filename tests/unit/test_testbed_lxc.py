"""testbed/lxc.py and the node choice of testbed/fleet.py: the containers' base config, the
id ranges, the uid-shifted tree of an unprivileged container, the nodes a scenario wants."""

from __future__ import annotations

import os
import stat

from testbed import fleet, lxc

STATE = {"state_dir": "/tb", "bridge": "ltbr0", "gateway": "10.242.0.1", "base": "/base"}


def _host(**kw) -> dict:
    h = fleet.host_record({**STATE, "prefix": "lt"}, 1, **kw)
    return h


def test_an_unprivileged_host_is_mapped_as_proxmox_maps_it(monkeypatch):
    monkeypatch.setattr(fleet, "SUBNET", "10.242.0")
    h = _host()
    text = lxc.config_text(STATE, h)
    lines = text.splitlines()
    assert "lxc.idmap = u 0 100000 65536" in lines and "lxc.idmap = g 0 100000 65536" in lines
    assert "lxc.include = /usr/share/lxc/config/userns.conf" in lines
    assert f"lxc.rootfs.path = dir:{h['merged']}" in lines
    assert "lxc.net.0.link = ltbr0" in lines and "lxc.net.0.veth.pair = vlt1" in lines
    assert f"lxc.net.0.ipv4.address = {h['address']}/24" in lines
    assert "lxc.net.0.ipv4.gateway = 10.242.0.1" in lines
    assert "lxc.net.0.hwaddr = 02:74:0a:f2:00:0b" in lines  # net.host_mac: kept on a wipe
    assert lxc.kind(h) == "unprivileged" and lxc.root_id(h) == 100000
    assert "nvidia" not in text  # the passthrough block is lxc_host.py's, merged in after


def test_a_privileged_host_has_no_id_map():
    h = _host(privileged=True)
    text = lxc.config_text(STATE, h)
    assert "lxc.idmap" not in text and "userns.conf" not in text
    assert lxc.kind(h) == "privileged" and lxc.root_id(h) == 0
    assert lxc.lower_dir(STATE, h) == "/base"


def test_root_sub_ids_added_once_and_other_lines_kept(tmp_path):
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("alice:200000:65536\n")
    for _ in range(2):
        lxc.ensure_subids((subuid, subgid))
    assert subuid.read_text() == "alice:200000:65536\nroot:100000:65536\n"
    assert subgid.read_text() == "root:100000:65536\n"


def test_shift_tree_moves_every_owner_and_keeps_set_id_bits(tmp_path):
    if os.geteuid() != 0:
        raise AssertionError("needs root (chown), as the testbed does")
    root = tmp_path / "t"
    (root / "usr/bin").mkdir(parents=True)
    sudo = root / "usr/bin/sudo"
    sudo.write_text("x")
    sudo.chmod(0o4755)
    (root / "bin").symlink_to("usr/bin")
    copied_up = root / "etc"  # an overlay's copy of a folder of the shifted base
    copied_up.mkdir()
    os.chown(copied_up, 100000, 100000)
    lxc.shift_tree(root, 100000)
    assert os.stat(copied_up).st_uid == 100000  # not moved twice
    for p in (root, root / "usr", sudo, root / "bin"):
        st = os.lstat(p)
        assert (st.st_uid, st.st_gid) == (100000, 100000), p
    assert stat.S_IMODE(sudo.stat().st_mode) == 0o4755
    lxc.shift_tree(root, -100000)
    assert (sudo.stat().st_uid, stat.S_IMODE(sudo.stat().st_mode)) == (0, 0o4755)


PASSED = [*(f"/dev/nvidia{i}" for i in range(8)), "/dev/nvidiactl", "/dev/nvidia-uvm",
          "/dev/nvidia-uvm-tools"]


def test_gpu_nodes_wanted_follow_the_scenario_and_the_count():
    present, absent = fleet.gpu_nodes_wanted(PASSED, {"SCENARIO": "healthy", "GPU_COUNT": "8"})
    assert present == PASSED and absent == []
    present, absent = fleet.gpu_nodes_wanted(PASSED, {"SCENARIO": "gpu-missing", "GPU_COUNT": "8"})
    assert absent == ["/dev/nvidia7"] and "/dev/nvidia6" in present
    present, absent = fleet.gpu_nodes_wanted(PASSED, {"SCENARIO": "uvm-missing"})
    assert absent == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert "/dev/nvidiactl" in present and "/dev/nvidia7" in present
    present, absent = fleet.gpu_nodes_wanted(PASSED, {"SCENARIO": "gpu-missing", "GPU_COUNT": "2"})
    assert [p for p in present if p[-1].isdigit()] == ["/dev/nvidia0"]
    assert absent[0] == "/dev/nvidia1" and len(absent) == 7


def test_passed_nodes_are_read_from_the_config(tmp_path):
    state = {**STATE, "state_dir": str(tmp_path)}
    h = {"name": "lt1"}
    cfg = lxc.config_path(state, h)
    cfg.parent.mkdir(parents=True)
    cfg.write_text("lxc.uts.name = lt1\n"
                   "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                   "lxc.mount.entry = /srv/x srv/x none bind 0 0\n"
                   "lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n")
    assert lxc.passed_nodes(state, h) == ["/dev/nvidia0", "/dev/nvidia-uvm"]

"""core/lxchost/facts.py on real /proc/devices, node listings, module versions and GPU
information files of several driver generations (tests/fixtures/lxchost)."""

from __future__ import annotations

import pytest
from lxchost_fixtures import fixture, grep_excerpt

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import facts as f


def test_frontend_driver_with_nvlink_nvswitch_and_gdrdrv():
    m = f.parse_proc_devices(fixture("proc-devices/frontend-nvlink-caps-uvm-nvswitch.txt"))
    assert (m.gpu, m.gpu_name, m.uvm, m.caps) == (195, "nvidia-frontend", 510, 235)
    assert m.passed == (195, 510, 235)
    assert m.others == (("nvidia-nvlink", 234), ("nvidia-nvswitch", 511))
    assert m.nvidia == {195, 510, 235, 234, 511}
    assert 509 in m.char_majors and 509 not in m.nvidia  # gdrdrv is not NVIDIA's driver
    assert 259 not in m.char_majors  # blkext: a block major, ignored


def test_550_names_nvidia_and_lists_nvidiactl_and_modeset_on_the_same_major():
    m = f.parse_proc_devices(fixture("proc-devices/nvidia-550-modeset-caps-uvm.txt"))
    assert (m.gpu, m.gpu_name, m.uvm, m.caps, m.others) == (195, "nvidia", 506, 236, ())


def test_frontend_with_uvm_below_the_dynamic_range():
    m = f.parse_proc_devices(fixture("proc-devices/frontend-uvm-caps.txt"))
    assert (m.gpu_name, m.uvm, m.caps) == ("nvidia-frontend", 234, 506)


def test_imex_channels_are_seen_and_not_passed_with_the_reason():
    m = f.parse_proc_devices(grep_excerpt("proc-devices/grep-580-imex-nvswitch.txt"))
    assert m.uvm is None and m.caps is None
    assert m.others == (("nvidia-caps-imex-channels", 234), ("nvidia-nvswitch", 509))
    lines = m.not_passed()
    assert lines[0].startswith("nvidia-caps-imex-channels (major 234): IMEX channels")
    assert "Fabric Manager" in lines[1]


def test_an_unknown_nvidia_entry_is_reported_not_passed():
    m = f.parse_proc_devices("Character devices:\n195 nvidia\n240 nvidia-vgpu-vfio\n")
    assert m.others == (("nvidia-vgpu-vfio", 240),)
    assert "not a device CUDA opens" in m.not_passed()[0]


def test_a_host_without_the_nvidia_module_is_a_typed_error_with_the_fix():
    with pytest.raises(LxcHostError) as e:
        f.parse_proc_devices(fixture("proc-devices/no-nvidia-debian12.txt"))
    assert "no nvidia entry" in e.value.found
    assert "nvidia-modprobe -u -c=0" in e.value.fix and "LXC host" in e.value.fix


def test_text_that_is_not_proc_devices_is_refused():
    with pytest.raises(LxcHostError, match="Character devices"):
        f.parse_proc_devices("195 nvidia\n")


def test_two_gpu_majors_are_refused():
    with pytest.raises(LxcHostError, match="one GPU major"):
        f.parse_proc_devices("Character devices:\n195 nvidia\n196 nvidia-frontend\n")


def test_block_section_entries_do_not_count():
    with pytest.raises(LxcHostError):
        f.parse_proc_devices("Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia\n")


def h200():
    return f.host_facts("Character devices:\n195 nvidia\n238 nvidia-uvm\n241 nvidia-caps\n",
                        fixture("nodes/h200-580.txt"))


def test_nodes_of_a_real_h200_host():
    facts = h200()
    assert [n.path for n in facts.nodes] == [
        "/dev/nvidia0", "/dev/nvidia-caps", "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl"]
    uvm = facts.by_role("uvm")[0]
    assert (uvm.major, uvm.minor, uvm.mode) == (238, 0, "0666")
    assert facts.by_role("cap")[0].mode == "0400"
    assert facts.gpu_minors == (0,)
    assert facts.stale_nodes() == ()
    f.check_host(facts)


def test_gpus_sort_by_number_not_text():
    listing = "".join(f"/dev/nvidia{n}|character special file|c3|{n:x}|666\n"
                      for n in (10, 2, 1, 0))
    assert [n.path for n in f.parse_dev_nodes(listing)] == [
        "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia10"]


def test_nodes_left_from_before_a_driver_update_are_stale():
    facts = f.host_facts(grep_excerpt("proc-devices/grep-rtx-proxmox-511.txt").replace(
        "511 nvidia-uvm", "510 nvidia-uvm"), fixture("nodes/rtx-proxmox-511.txt"))
    assert [n.path for n in facts.stale_nodes()] == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    with pytest.raises(LxcHostError) as e:
        f.check_host(facts)
    assert "/dev/nvidia-uvm is stale: major 511, but /proc/devices gives its driver 510" \
        in e.value.found
    assert "rm /dev/nvidia-uvm && nvidia-modprobe -u -c=0" in e.value.fix


def test_uvm_not_loaded_names_the_fix():
    facts = f.host_facts(grep_excerpt("proc-devices/grep-open-rtx5060-no-uvm.txt"),
                         "/dev/nvidia0|character special file|c3|0|666\n"
                         "/dev/nvidiactl|character special file|c3|ff|666\n")
    with pytest.raises(LxcHostError) as e:
        f.check_host(facts)
    assert "nvidia_uvm module is not loaded" in e.value.found
    assert "nvidia-modprobe -u -c=0" in e.value.fix
    assert "/etc/modules-load.d/nvidia-uvm.conf" in e.value.fix


def test_uvm_loaded_but_its_nodes_not_created_yet():
    facts = f.host_facts("Character devices:\n195 nvidia\n511 nvidia-uvm\n",
                         "/dev/nvidia0|character special file|c3|0|666\n"
                         "/dev/nvidiactl|character special file|c3|ff|666\n")
    problems = [what for what, _ in f.host_problems(facts)]
    assert problems == [("/dev/nvidia-uvm or /dev/nvidia-uvm-tools is missing (the module "
                        "creates them only when first used)")]


def test_no_nodes_at_all():
    facts = f.host_facts("Character devices:\n195 nvidia\n511 nvidia-uvm\n", "")
    assert len(f.host_problems(facts)) == 3  # uvm nodes, GPU nodes, nvidiactl


def test_a_bad_listing_line_is_named():
    with pytest.raises(LxcHostError, match="line 2"):
        f.parse_dev_nodes("/dev/nvidia0|character special file|c3|0|666\ncrw-rw-rw- 1 root\n")
    with pytest.raises(LxcHostError, match="hex major"):
        f.parse_dev_nodes("/dev/nvidia0|character special file|zz|0|666\n")


@pytest.mark.parametrize(("name", "version", "is_open"), [
    ("version/proprietary-440.txt", "440.95.01", False),
    ("version/proprietary-515.txt", "515.76", False),
    ("version/open-570.txt", "570.195.03", True),
    ("version/open-580-142.txt", "580.142", True),
])
def test_module_versions(name, version, is_open):
    m = f.parse_module_version(fixture(name))
    assert (m.version, m.open, m.arch) == (version, is_open, "x86_64")


def test_the_issue_quoted_module_lines_and_a_jetson_one():
    assert f.parse_module_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 ...").version \
        == "580.95.05"
    assert f.parse_module_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                  "580.95.05  Release Build ...").open
    # gpu_monitor_test.cpp's Jetson line (file id 47068738273)
    jetson = f.parse_module_version("NVRM version: NVIDIA UNIX Kernel Module for aarch64  "
                                    "34.1.1  Release Build  ")
    assert (jetson.version, jetson.open, jetson.arch) == ("34.1.1", False, "aarch64")


def test_no_module_loaded_is_a_typed_error():
    with pytest.raises(LxcHostError) as e:
        f.parse_module_version("")
    assert e.value.found == "nothing" and "modprobe nvidia" in e.value.fix


def test_cgroup_layout():
    assert f.parse_cgroup_fstype("cgroup2fs\n") == 2
    assert f.parse_cgroup_fstype("tmpfs\n") == 1
    with pytest.raises(LxcHostError):
        f.parse_cgroup_fstype("ext4")


def test_gpu_information_gives_minor_and_pci_and_skips_a_block_without_minor():
    text = fixture("gpus/a10g-minor3.txt") + fixture("gpus/gtx650-no-minor.txt")
    assert f.parse_gpu_information(text) == ((3, "0000:00:1e.0"),)
    assert f.parse_gpu_information("") == ()

"""The stand-in CLIs (tests/fixtures/lxchost/bin): they answer from real fixtures in the
real tools' formats and refuse argv the real tools would refuse, so that the planners'
argv are checked against something that can say no."""

from __future__ import annotations

import pytest
from lxchost_fixtures import fixture, run_standin

from sglang_deploy.core.lxchost import confmerge as cm
from sglang_deploy.core.lxchost import pve


def test_pct_config_prints_the_main_section_only(tmp_path):
    answers = {"pct/100.conf": fixture("pve/100-snapshots.conf")}
    done, calls = run_standin(["pct", "config", "100"], tmp_path, answers)
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == "unprivileged: 1"
    assert "snaptime" not in done.stdout and "[fresh]" not in done.stdout
    assert calls == [{"tool": "pct", "argv": ["pct", "config", "100"]}]


def test_pct_config_turns_comment_lines_into_the_description(tmp_path):
    answers = {"pct/110.conf": "#GPU node\n#second line\n" + fixture("pve/110-dev-entries.conf")}
    done, _ = run_standin(["pct", "config", "110"], tmp_path, answers)
    assert done.stdout.splitlines()[0] == "description: GPU node%0Asecond line"
    assert "dev0: /dev/dri/card0,gid=44" in done.stdout.splitlines()


def test_pct_list_and_status(tmp_path):
    answers = {"pct/100.conf": fixture("pve/100-snapshots.conf"),
               "pct/110.conf": fixture("pve/110-dev-entries.conf"), "pct/110.status": "running"}
    done, _ = run_standin(["pct", "list"], tmp_path, answers)
    assert [line.split() for line in done.stdout.splitlines()] == [
        ["VMID", "Status", "Lock", "Name"], ["100", "stopped", "testing"],
        ["110", "running", "jellyfin"]]
    done, _ = run_standin(["pct", "status", "110"], tmp_path, answers)
    assert done.stdout == "status: running\n"


def test_pveversion_answers_are_parsed(tmp_path):
    answers = {"pveversion.txt": fixture("pve/pveversion-8.1.3.txt"),
               "pveversion-v.txt": fixture("pve/pveversion-v-8.4.txt")}
    done, _ = run_standin(["pveversion"], tmp_path, answers)
    assert pve.parse_pveversion(done.stdout).dev_entries
    done, _ = run_standin(pve.PVEVERSION_COMMAND.split(), tmp_path, answers)
    assert pve.parse_pveversion(done.stdout).container == (5, 3, 3)


@pytest.mark.parametrize("argv", [
    ["pct", "config", "gpu-node-1"],          # a name where the CTID goes
    ["pct", "set", "105", "--dev0"],          # an option without its value
    ["pct", "set", "105", "--mp0", "/x"],     # not a devN option
    ["pct", "frobnicate", "105"],
    ["pct", "create", "105", "/srv/rootfs"],  # not a template volume
    ["incus", "config", "device", "add", "c1", "gpus", "gpu", "gputype"],  # no value
    ["incus", "config", "device", "add", "c1", "gpus", "gpu-x"],  # not a device type
    ["lxc", "config", "device", "unset", "c1", "gpus", "pci=1"],
    ["lxc", "restart", "c1", "c2"],
    ["incus", "launch", "images:debian/12", "c1", "--vm"],
    ["pveversion", "-x"],
])
def test_shapes_the_real_tools_refuse_are_refused(tmp_path, argv):
    done, calls = run_standin(argv, tmp_path)
    assert done.returncode != 0 and done.stderr
    assert calls[-1]["argv"] == argv


def test_config_show_of_an_unknown_instance_fails(tmp_path):
    done, _ = run_standin(["incus", "config", "show", "nope"], tmp_path)
    assert done.returncode == 1 and "not found" in done.stderr


def test_a_merged_proxmox_config_reads_back_through_pct_config(tmp_path):
    from test_lxchost_confmerge import merge, rtx

    merged = merge(fixture("pve/100-snapshots.conf"), "proxmox", rtx()).text
    done, _ = run_standin(["pct", "config", "100"], tmp_path, {"pct/100.conf": merged})
    assert "lxc.cgroup2.devices.allow: c 511:* rwm" in done.stdout.splitlines()
    assert cm.BEGIN not in merged  # no marker comment: it would become the description

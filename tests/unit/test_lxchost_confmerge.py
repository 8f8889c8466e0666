"""core/lxchost/confmerge.py on real plain-LXC and Proxmox configs: the tool's lines
merged idempotently, the operator's kept byte for byte, conflicts refused with their line
numbers, a driver update's new majors replacing the tool's old lines."""

from __future__ import annotations

import json

import pytest
from lxchost_fixtures import fixture, on_full_listing

from sglang_deploy.core.errors import LxcHostError
from sglang_deploy.core.lxchost import confmerge as cm
from sglang_deploy.core.lxchost import desired as d
from sglang_deploy.core.lxchost import facts as f


def rtx(uvm=511, cgroup="cgroup2fs"):
    """The real Proxmox host of nodes/rtx-proxmox-511.txt; UVM: its nvidia-uvm major now."""
    devices = on_full_listing("proc-devices/grep-rtx-proxmox-511.txt").replace(
        "511 nvidia-uvm", f"{uvm} nvidia-uvm")
    nodes = fixture("nodes/rtx-proxmox-511.txt").replace("|1ff|", f"|{uvm:x}|")
    return f.host_facts(devices, nodes, cgroup_fstype=cgroup)


def merge(text, dialect, facts, record=None, dev=False, **kw):
    want = d.desired_directives(dialect, facts, dev_entries_ok=dev)
    return cm.merge(text, want, dialect, facts.majors, record, **kw)


def test_proxmox_lines_go_to_the_main_section_before_the_snapshots():
    text = fixture("pve/100-snapshots.conf")
    r = merge(text, "proxmox", rtx())
    main, snaps = r.text.split("\n[fresh]\n")
    assert main.endswith("unprivileged: 1\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
                         "lxc.cgroup2.devices.allow: c 511:* rwm\n"
                         "lxc.cgroup2.devices.allow: c 236:* rwm\n"
                         "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                         "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,"
                         "create=file\nlxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none "
                         "bind,optional,create=file\nlxc.mount.entry: /dev/nvidia-uvm-tools "
                         "dev/nvidia-uvm-tools none bind,optional,create=file\nlxc.mount.entry: "
                         "/dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir\n")
    assert "[fresh]\n" + snaps == text[text.index("[fresh]"):]  # snapshots untouched
    assert r.changed and len(r.added) == 8 and r.removed == ()
    assert r.record.lines == r.added


def test_a_second_merge_changes_nothing():
    first = merge(fixture("pve/100-snapshots.conf"), "proxmox", rtx())
    again = merge(first.text, "proxmox", rtx(), first.record)
    assert (again.text, again.changed, again.added, again.removed) == (first.text, False, (), ())
    assert again.record == first.record


def test_a_driver_update_replaces_the_tools_lines_in_place_and_keeps_the_rest():
    text = fixture("pve/100-snapshots.conf").replace("unprivileged: 1\n\n[fresh]",
                                                     "unprivileged: 1\nonboot: 1\n\n[fresh]", 1)
    before = merge(text, "proxmox", rtx(511))
    # the operator adds a line after the tool's; then the host's uvm major moves to 510
    edited = before.text.replace("create=dir\n\n[fresh]", "create=dir\ntags: gpu\n\n[fresh]")
    after = merge(edited, "proxmox", rtx(510), cm.Record.from_json(before.record.to_json()))
    assert after.removed == ("lxc.cgroup2.devices.allow: c 511:* rwm",)
    assert after.added == ("lxc.cgroup2.devices.allow: c 510:* rwm",)
    assert after.text == edited.replace("c 511:* rwm", "c 510:* rwm")


def test_real_proxmox_dev_entries_keep_the_operators_indices():
    text = fixture("pve/110-dev-entries.conf")
    r = merge(text, "proxmox", rtx(), dev=True)
    ours = [line for line in r.text.splitlines() if line not in text.splitlines()]
    assert ours == ["dev2: /dev/nvidia0,mode=0666", "dev3: /dev/nvidiactl,mode=0666",
                    "dev4: /dev/nvidia-uvm,mode=0666", "dev5: /dev/nvidia-uvm-tools,mode=0666",
                    "dev6: /dev/nvidia-caps/nvidia-cap1,mode=0600",
                    "dev7: /dev/nvidia-caps/nvidia-cap2,mode=0444"]
    assert r.text.startswith(text)  # every operator byte kept (`tags:  ` included)
    assert merge(r.text, "proxmox", rtx(), r.record, dev=True).text == r.text


def test_dev_entries_survive_a_driver_update_unchanged():
    r = merge(fixture("pve/110-dev-entries.conf"), "proxmox", rtx(511), dev=True)
    assert not merge(r.text, "proxmox", rtx(510), r.record, dev=True).changed


def test_an_operators_identical_line_is_adopted_and_keeps_its_place():
    text = fixture("pve/110-dev-entries.conf") + "dev9: /dev/nvidia0,mode=0666\n"
    r = merge(text, "proxmox", rtx(), dev=True)
    assert r.adopted == ("dev9: /dev/nvidia0,mode=0666",)
    assert "dev9: /dev/nvidia0,mode=0666" in r.text.splitlines()
    assert r.text.count("/dev/nvidia0,") == 1


def test_forum_lines_with_another_hosts_majors_conflict_with_line_numbers():
    text = fixture("pve/110-dev-entries.conf") + fixture("pve/1138-forum-lines.conf")
    with pytest.raises(LxcHostError) as e:
        merge(text, "proxmox", rtx())
    at = [i for i, line in enumerate(text.splitlines(), 1) if ":* rwm" in line and "195" not in line]
    assert at == [21, 22]
    found = e.value.found.splitlines()
    assert found == [
        ("line 21: lxc.cgroup2.devices.allow: c 506:* rwm  (a device rule for all of major 506, "
        "which no driver on this host registers, beside hand-written NVIDIA lines: an NVIDIA "
        "major of another host or of an earlier driver, not written by sglang-deploy)"),
        ("line 22: lxc.cgroup2.devices.allow: c 509:* rwm  (a device rule for all of major 509, "
        "which no driver on this host registers, beside hand-written NVIDIA lines: an NVIDIA "
        "major of another host or of an earlier driver, not written by sglang-deploy)")]
    assert "adopt_passthrough_lines: true" in e.value.fix
    assert [x["number"] for x in e.value.details["lines"]] == at


def test_adopting_replaces_the_conflicting_lines_and_keeps_the_other_devices():
    text = fixture("pve/110-dev-entries.conf") + fixture("pve/1138-forum-lines.conf")
    r = merge(text, "proxmox", rtx(), adopt=True)
    assert "c 506:* rwm" not in r.text and "c 509:* rwm" not in r.text
    assert "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir\n" in r.text
    assert "lxc.mount.entry: /dev/apex_0 dev/apex_0" in r.text
    assert len(r.adopted) == 6 and set(r.removed) == {"lxc.cgroup2.devices.allow: c 506:* rwm",
                                                      "lxc.cgroup2.devices.allow: c 509:* rwm"}
    assert merge(r.text, "proxmox", rtx(), r.record).text == r.text


def test_per_minor_rules_and_staged_nodes_of_a_real_config_conflict():
    text = fixture("pve/2051-per-minor-nvidia.conf")
    numbers = [i for i, line in enumerate(text.splitlines(), 1)
               if "195:" in line or "devices/nvidia" in line]
    with pytest.raises(LxcHostError) as e:
        merge(text, "proxmox", rtx())
    assert [x["number"] for x in e.value.details["lines"]] == numbers == [28, 29, 30, 31]
    assert "a bind mount of an NVIDIA device node" in e.value.found


def test_plain_lxc_gets_a_marked_block_and_the_rest_stays():
    text = fixture("lxc/testbed-lxc5-debian12.conf")
    r = merge(text, "lxc", rtx(cgroup="tmpfs"))
    assert r.text.startswith(text)
    block = r.text[len(text):].splitlines()
    assert block[0] == cm.BEGIN and block[-1] == cm.END
    assert block[1] == "lxc.cgroup.devices.allow = c 195:* rwm"
    assert merge(r.text, "lxc", rtx(cgroup="tmpfs"), r.record).text == r.text


def test_plain_lxc_block_is_known_by_its_markers_without_the_record():
    r = merge(fixture("lxc/testbed-lxc5-debian12.conf"), "lxc", rtx(511))
    later = merge(r.text, "lxc", rtx(510), record=None)
    assert later.removed == ("lxc.cgroup2.devices.allow = c 511:* rwm",)
    assert later.text == r.text.replace("c 511:* rwm", "c 510:* rwm")


def test_plain_lxc_with_v1_rules_and_comments():
    text = fixture("lxc/2991-cgroup-v1-rules.conf")
    r = merge(text, "lxc", rtx(cgroup="tmpfs"))
    assert r.text.startswith(text) and r.warnings == ()


def test_a_hand_written_uvm_mount_that_differs_conflicts_in_plain_lxc():
    text = fixture("lxc/testbed-lxc5-debian12.conf") + \
        "lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,create=file\n"
    with pytest.raises(LxcHostError, match="line 7: lxc.mount.entry = /dev/nvidia-uvm"):
        merge(text, "lxc", rtx())


def test_a_rule_for_an_unregistered_major_alone_is_a_warning():
    text = fixture("lxc/testbed-lxc5-debian12.conf") + "lxc.cgroup2.devices.allow = c 120:0 rwm\n"
    r = merge(text, "lxc", rtx())
    assert r.warnings == (("line 7: lxc.cgroup2.devices.allow = c 120:0 rwm (major 120, which "
                          "no driver on this host registers; left as it is)"),)
    assert "c 120:0 rwm\n" in r.text


def test_a_file_without_final_newline_gets_one_before_the_tools_lines():
    r = merge("arch: amd64\nhostname: x", "proxmox", rtx())
    assert r.text.startswith("arch: amd64\nhostname: x\nlxc.cgroup2")


def test_record_round_trip_and_bad_records():
    rec = cm.Record(("a", "b"))
    assert cm.Record.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert cm.Record.from_json(None) == cm.Record()
    with pytest.raises(LxcHostError, match="delete the record file"):
        cm.Record.from_json({"version": 7, "lines": []})
    with pytest.raises(LxcHostError):
        cm.Record.from_json({"version": 1, "lines": [1]})


def test_proxmox_reads_lxc_keys_with_equals_too():
    assert cm.key_value("lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind", "proxmox") == \
        ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind")
    assert cm.key_value("#lxc.mount.entry: x", "proxmox") is None


def test_a_begin_marker_without_its_end_claims_nothing_of_the_operators():
    text = fixture("lxc/testbed-lxc5-debian12.conf")
    r = merge(text, "lxc", rtx())
    # the operator deletes the END marker and adds a line below the block
    edited = r.text.replace(cm.END + "\n", "") + "lxc.start.auto = 1\n"
    again = merge(edited, "lxc", rtx(), record=None)  # no record: only markers could tell
    assert again.text.count(cm.BEGIN) == 1 and again.text.count(cm.END) == 1
    assert again.text.endswith(cm.END + "\nlxc.start.auto = 1\n")
    assert len(again.adopted) == 8  # the block's lines, identical to the desired ones
    assert not merge(again.text, "lxc", rtx(), again.record).changed


@pytest.mark.parametrize(("name", "dialect", "dev"), [
    ("pve/100-snapshots.conf", "proxmox", False), ("pve/100-snapshots.conf", "proxmox", True),
    ("pve/110-dev-entries.conf", "proxmox", False), ("pve/110-dev-entries.conf", "proxmox", True),
    ("lxc/testbed-lxc5-debian12.conf", "lxc", False), ("lxc/2991-cgroup-v1-rules.conf", "lxc", False),
])
@pytest.mark.parametrize("uvm", [511, 508])
def test_every_real_config_merges_once_then_never_again(name, dialect, dev, uvm):
    text = fixture(name)
    first = merge(text, dialect, rtx(uvm), dev=dev)
    second = merge(first.text, dialect, rtx(uvm), first.record, dev=dev)
    assert first.changed and not second.changed and second.text == first.text
    kept = [line for line in text.splitlines() if line in first.text.splitlines()]
    assert kept == text.splitlines()  # no operator line lost

"""Which hardening is really in force (``core.hardening``), and the release smoke's sandbox
step that observes it (``remote/release_smoke.py``: the GPUs' doors, not their memory)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from sglang_deploy.core import hardening, smoke
from sglang_deploy.core.hostrecords import Hardening
from sglang_deploy.remote import release_smoke as rs

ENFORCED = {
    "status": {"NoNewPrivs": "1", "Seccomp": "2", "CapBnd": "0000000000000000"},
    "devices": {"/dev/nvidia0": "ok", "/dev/nvidiactl": "ok"},
    "outside": {"/dev/net/tun": "refused EPERM"},
    "write_outside": {"path": "/opt/sglang/releases/r/venv", "result": "refused-readonly"},
    "cuda": {"library": "libcuda.so.1", "init": 0, "count": 8},
}
# an unprivileged LXC container: systemd cannot load BPF device programs, says nothing
UNPRIVILEGED = {**ENFORCED, "outside": {"/dev/net/tun": "ok"}}

LISTING = """crw-rw-rw- 1 root root 195,   0 Dec  4 10:00 /dev/nvidia0
crw-rw-rw- 1 root root 195,   1 Dec  4 10:00 /dev/nvidia1
crw-rw-rw- 1 root root 195, 255 Dec  4 10:00 /dev/nvidiactl
crw-rw-rw- 1 root root 510,   0 Dec  4 10:00 /dev/nvidia-uvm

/dev/nvidia-caps:
cr-------- 1 root root 234,   1 Dec  4 10:00 /dev/nvidia-caps/nvidia-cap1
drwxr-xr-x 2 root root 80 Dec  4 10:00 /dev/nvidia-caps
"""



def summary(rec: dict | None) -> dict | None:
    """``hardening.summary`` of the typed record (``Hardening.from_json``) of REC."""
    return hardening.summary(Hardening.from_json(rec))

def _by_name(props):
    return {p["name"]: p for p in props}


def test_every_property_in_force_where_the_sandbox_applied():
    props = _by_name(hardening.judge(ENFORCED))
    assert set(props) == set(hardening.PROPERTIES)
    assert all(p["in_force"] is True for p in props.values()), props
    assert props["DevicePolicy"]["found"] == "/dev/net/tun refused EPERM"


def test_device_policy_not_in_force_in_an_unprivileged_container_says_why_and_what_to_do():
    rec = hardening.record(UNPRIVILEGED, "r1", "2026-12-04T19:00:00+00:00")
    s = summary(rec)
    assert [p["name"] for p in s["not_in_force"]] == ["DevicePolicy"]
    gap = s["not_in_force"][0]
    assert "unprivileged container" in gap["why"] and "23198" in gap["why"]
    assert "/dev/net/tun opened" in gap["found"]
    assert "lxc.cgroup2.devices.allow" in gap["fix"]
    assert "DevicePolicy" not in s["in_force"] and "NoNewPrivileges" in s["in_force"]
    (line,) = hardening.lines("hb1", s)
    assert line.startswith("hb1: DevicePolicy not in force: the container's systemd cannot")


@pytest.mark.parametrize("change, name", [
    ({"status": {"NoNewPrivs": "0", "Seccomp": "2", "CapBnd": "0"}}, "NoNewPrivileges"),
    ({"status": {"NoNewPrivs": "1", "Seccomp": "0", "CapBnd": "0"}}, "SystemCallFilter"),
    ({"status": {"NoNewPrivs": "1", "Seccomp": "2", "CapBnd": "000001ffffffffff"}},
     "CapabilityBoundingSet"),
    ({"write_outside": {"path": "/opt", "result": "written"}}, "ProtectSystem"),
    ({"write_outside": {"path": "/opt", "result": "refused EACCES"}}, "ProtectSystem"),
])
def test_each_property_not_in_force(change, name):
    s = summary(hardening.record({**ENFORCED, **change}, "r", "t"))
    assert [p["name"] for p in s["not_in_force"]] == [name]
    assert s["not_in_force"][0]["fix"]


def test_cannot_tell_without_a_node_outside_device_allow():
    s = summary(hardening.record({**ENFORCED, "outside": {}}, "r", "t"))
    assert s["unknown"] == ["DevicePolicy"] and not s["not_in_force"]


def test_no_record_no_summary():
    assert summary(None) is None and hardening.lines("h", None) == []


def test_smoke_devices_are_the_character_nodes_of_the_preflight_listing():
    assert hardening.smoke_devices(LISTING) == [
        "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
        "/dev/nvidia-caps/nvidia-cap1"]
    assert hardening.smoke_devices(None) == []


def test_smoke_argv_passes_the_doors_only_with_devices():
    argv = smoke.smoke_argv("py", "t.py", ["import"], ["--tp-size", "8"],
                            devices=["/dev/nvidia0"], device_allow=("/dev/nvidia0", "/dev/x"))
    assert argv == ["py", "t.py", "--steps", "import", "--device", "/dev/nvidia0",
                    "--device-allow", "/dev/nvidia0", "--device-allow", "/dev/x", "--",
                    "--tp-size", "8"]
    assert smoke.control_argv("py", "t.py", ["/dev/a"], ["/dev/b"]) == [
        "py", "t.py", "--control", "--device", "/dev/a", "--device-allow", "/dev/b"]
    assert "--device-allow" not in smoke.smoke_argv("py", "t.py", ["import"], [],
                                                    device_allow=("/dev/x",))


# ------------------------------------------------------------------ the smoke's sandbox step

def test_door_problems_name_a_refused_node_and_whether_device_allow_lists_it():
    box = {"devices": {"/dev/nvidia0": "ok", "/dev/nvidia8": "refused EPERM",
                       "/dev/nvidiactl": "refused EPERM",
                       "/dev/nvidia-caps/nvidia-cap2": "refused EPERM"},
           "device_allow": ["/dev/nvidia0", "/dev/nvidiactl"], "cuda": {}}
    assert rs.door_problems(box) == [
        "/dev/nvidia8: refused EPERM (the unit's DeviceAllow does not list it)",
        "/dev/nvidiactl: refused EPERM"]  # nvidia-caps: outside by design, not a door of the server
    box = {**box, "devices": {"/dev/nvidia0": "ok"},
           "cuda": {"library": "libcuda.so.1", "init": 999}}
    assert rs.door_problems(box) == ["cuInit returned 999 under the unit's sandbox"]


def test_open_node_tells_refused_from_missing_and_from_a_node_without_its_driver(tmp_path):
    assert rs.open_node("/dev/null") == "ok"
    assert rs.open_node(str(tmp_path / "absent")) == "missing"
    if os.geteuid() != 0:  # root opens a 0000 file
        locked = tmp_path / "locked"
        locked.write_text("")
        locked.chmod(0)
        assert rs.open_node(str(locked)) == "refused EACCES"


def test_write_outside_tells_a_read_only_mount_from_permissions(tmp_path, monkeypatch):
    assert rs.write_outside(str(tmp_path)) == "written"
    assert list(tmp_path.iterdir()) == []  # removed again

    def refuse(code):
        def mkstemp(**_):
            raise OSError(code, os.strerror(code))
        return mkstemp

    monkeypatch.setattr(rs.tempfile, "mkstemp", refuse(errno.EROFS))
    assert rs.write_outside(str(tmp_path)) == "refused-readonly"
    monkeypatch.setattr(rs.tempfile, "mkstemp", refuse(errno.EACCES))
    assert rs.write_outside(str(tmp_path)) == "refused EACCES"


def test_the_control_run_names_the_nodes_outside_device_allow_that_open(monkeypatch):
    seen = {"/dev/nvidia-caps/nvidia-cap2": "ok", "/dev/net/tun": "ok", "/dev/fuse": "missing"}
    monkeypatch.setattr(rs, "open_node", lambda path: seen.get(path, "ok"))
    assert rs.control(["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap2"], ["/dev/nvidia0"]) == [
        "/dev/nvidia-caps/nvidia-cap2", "/dev/net/tun"]


def test_the_sandbox_step_runs_first_and_its_failure_stops_the_smoke(monkeypatch):
    monkeypatch.setattr(rs, "cuda_in_child", lambda: {"library": None, "error": "absent"})
    result = rs.run(["import"], [], [], devices=["/dev/null-not-there"], allowed=[])
    # not a node the server needs: the step passes, and the import runs next
    assert [s["step"] for s in result["steps"]][:2] == ["sandbox", "import"]
    assert result["steps"][0]["status"] == "passed"
    assert result["sandbox"]["devices"] == {"/dev/null-not-there": "missing"}
    monkeypatch.setattr(rs, "open_node", lambda path: "refused EPERM")
    result = rs.run(["import"], [], [], devices=["/dev/nvidia3"], allowed=["/dev/nvidia0"])
    assert not result["ok"] and [s["step"] for s in result["steps"]] == ["sandbox"]
    assert result["error"]["message"] == \
        "/dev/nvidia3: refused EPERM (the unit's DeviceAllow does not list it)"
    err = smoke.error_for(result, "host hb1")
    assert "/dev/nvidia3" in err.found and "sandbox" in err.what and "DeviceAllow" in err.fix


def test_the_smoke_says_which_step_runs_and_cuda_count_runs_without_a_driver():
    out = subprocess.run([sys.executable, rs.__file__, "--cuda-count"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    got = json.loads(out)
    assert set(got) & {"library", "error"}
    # a smoke without sglang: the import step announces itself, then fails
    proc = subprocess.run([sys.executable, rs.__file__, "--steps", "import"],
                          capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stdout.splitlines()
    assert lines[0] == "release smoke: import: import sglang ..."
    assert smoke.parse_result(proc.stdout)["error"]["step"] == "import"


# ------------------------------------------------------------------ status and report show it

def _row(host: str, sandbox: dict | None) -> dict:
    rec = hardening.record(sandbox, "r1", "2026-12-04T19:00:00+00:00") if sandbox else None
    return {"host": host, "reachable": True, "unit": "active/running", "health": 200,
            "in_sync": True, "healthy": True, "changes": [], "models": ["m"],
            "hardening": summary(rec)}


def test_status_lists_the_properties_not_in_force_under_the_table(capsys):
    from sglang_deploy.commands import status

    status.render_hardening([_row("hb1", ENFORCED), _row("hb2", UNPRIVILEGED), _row("hb3", None)])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("hardening: hb2: DevicePolicy not in force: ")
    assert "unprivileged container" in out[0] and "fix: " in out[0]


def test_the_report_shows_the_properties_not_in_force():
    from sglang_deploy.commands import htmlreport
    from sglang_deploy.core import fleetreport

    doc = fleetreport.build("inv.py", ["hb1", "hb2"], [_row("hb1", ENFORCED),
                                                        _row("hb2", UNPRIVILEGED)],
                            {}, {}, {}, "2026-12-04T19:00:00+00:00")
    assert doc["hosts"][1]["status"]["hardening"]["not_in_force"][0]["name"] == "DevicePolicy"
    html = htmlreport.render_html(doc)
    assert html.count('class="hardening"') == 1
    assert 'data-host="hb2" data-property="DevicePolicy"' in html


def test_lock_check_says_which_step_of_the_smoke_runs(tmp_path, capsys):
    from pathlib import Path

    from sglang_deploy.controller import releasecheck

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    venv = releasecheck.Venv(Path(tmp_path), False, 0.0, 0)
    # whether sglang imports in this venv or not, the step says that it starts
    result, _ = releasecheck.run_smoke(venv, releasecheck.FlagSet(["h"], [], ["import"]))
    err = capsys.readouterr().err
    assert "lock --check: release smoke: import: import sglang ..." in err
    assert result is not None and result["steps"][0]["step"] == "import"


def test_a_required_property_not_in_force_is_an_error_naming_it():
    rec = hardening.record(UNPRIVILEGED, "r1", "t")
    assert hardening.required_error(rec, [], "hb1") is None
    assert hardening.required_error(rec, ["NoNewPrivileges"], "hb1") is None
    err = hardening.required_error(rec, ["DevicePolicy", "NoNewPrivileges"], "hb1")
    assert "sglang_hardening_required" in err.what and "hb1" in err.what
    assert err.found.startswith("DevicePolicy: not in force: the container's systemd cannot")
    assert err.fix.startswith("DevicePolicy: let the container's systemd apply device rules")
    # no record (the smoke saw nothing of the sandbox): not proven, an error too
    err = hardening.required_error({}, ["ProtectSystem"], "hb1")
    assert err.found == "ProtectSystem: cannot tell (not observed)"


def test_the_data_key_names_only_known_properties():
    from sglang_deploy.core import data
    from sglang_deploy.core.errors import DataError

    base = {"sglang_model_path": "/srv/models/m", "ssh_hostname": "10.0.0.1"}
    assert data.resolve(base, environ={}).sglang_hardening_required == []  # shown, not enforced
    assert data.resolve({**base, "sglang_hardening_required": ["DevicePolicy"]},
                        environ={}).sglang_hardening_required == ["DevicePolicy"]
    with pytest.raises(DataError) as e:
        data.resolve({**base, "sglang_hardening_required": ["DevicePolcy"]}, environ={})
    assert e.value.key == "sglang_hardening_required"

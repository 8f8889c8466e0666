"""remote/hoststate.py `state` run locally (it is a stdlib script fed to the host's python)."""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "hoststate.py"


def test_state_lists_the_users(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                          "--service", "sglang-deploy-test-absent"],
                         capture_output=True, text=True, check=True).stdout
    state = json.loads(out)
    assert "root" in state["users"]
    assert state["users"] == sorted({p.pw_name for p in pwd.getpwall()})
    assert state["releases"] == {} and state["current"] is None


def test_state_reports_the_shas_the_controller_decides_on(tmp_path):
    """Per release: sha256 of the file its patch record names and of server_args.py, so that a
    no-op deploy needs neither the venv's python nor the 350 KB file."""
    import hashlib

    _releases_tree(tmp_path)  # r2: a release without venv nor record
    rel = tmp_path / "releases" / "r1"
    srt = rel / "venv/lib/python3.11/site-packages/sglang/srt"
    (srt / "model_runner.py").write_text("patched\n")
    (rel / "autotune-patch.json").write_text(json.dumps({"file": str(srt / "model_runner.py")}))
    out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                          "--service", "sglang-deploy-test-absent"],
                         capture_output=True, text=True, check=True).stdout
    releases = json.loads(out)["releases"]
    assert releases["r1"]["server_args_sha256"] == hashlib.sha256(b"ARGS = 1\n").hexdigest()
    assert releases["r1"]["patch_file_sha256"] == hashlib.sha256(b"patched\n").hexdigest()
    assert releases["r2"] == {"complete": False, "patch": None}


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hoststate_under_test", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_gives_the_exit_code_and_stdout_and_drops_stderr():
    run = _module().run
    assert run(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n")
    assert run(["sh", "-c", "kill -TERM $$"])[0] == -15
    assert run(["sglang-deploy-no-such-command"]) == (127, "")
    big = run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x"])  # more than a pipe holds
    assert big == (0, "x" * 300000)


def test_state_reads_the_uv_version_of_the_tool_venv(tmp_path):
    uv = tmp_path / "tools" / "venv" / "bin" / "uv"
    uv.parent.mkdir(parents=True)

    def state():
        out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                              "--service", "sglang-deploy-test-absent"],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)["uv_version"]

    uv.write_text("#!/bin/sh\necho 'uv 0.13.9 (x86_64-unknown-linux-gnu)'\n")
    uv.chmod(0o755)
    assert state() == "0.13.9"
    uv.write_text("#!/bin/sh\necho 'uv 0.13.9'; exit 1\n")  # a failing uv is no version
    assert state() is None


def _releases_tree(root: Path) -> None:
    """Releases as an install leaves them, plus what a listing must not mistake for one."""
    rel = root / "releases" / "r1"
    srt = rel / "venv/lib/python3.11/site-packages/sglang/srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text("ARGS = 1\n")
    (rel / "release.json").write_text('{"id": "r1"}')
    (rel / ".complete").write_text("")
    (root / "releases" / "r2").mkdir()
    (root / "releases" / ".tmp-r3").mkdir()  # an install in progress: hidden, not a release
    (root / "releases" / ".tmp-r3" / "release.json").write_text("{}")
    (root / "releases" / "stray-file").write_text("")
    (root / "releases" / "r4").mkdir()
    (root / "releases" / "r4" / "release.json").symlink_to(root / "nowhere.json")  # dangling


def test_state_from_the_facts_argv_reads_releases_paths_cache_and_devices(tmp_path):
    """The options as SglangHostState.args builds them (the pre-flight's form) reach the one
    parser: releases listed without hidden installs in progress, paths, cache count, dev-open."""
    from sglang_deploy.hostops.facts import SglangHostState

    _releases_tree(tmp_path)
    unit = tmp_path / "a unit.service"
    unit.write_text("[Unit]\n")
    argv = SglangHostState.args(root=str(tmp_path), service="sglang-deploy-test-absent",
                                cache=str(tmp_path / "releases"), dev_open=True,
                                paths=(str(unit), str(tmp_path / "absent")))
    out = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL).stdout
    state = json.loads(out)
    assert set(state["releases"]) == {"r1", "r2", "r4", "stray-file"}
    assert state["releases"]["r1"]["complete"] is True
    assert state["paths"][str(unit)]["kind"] == "file"
    assert state["paths"][str(tmp_path / "absent")] is None
    # every file under the folder: r1's three, .tmp-r3's record, stray-file, r4's dangling link
    assert state["cache_files"] == 6
    assert isinstance(state["dev_open"], str) and "model" not in state


def test_state_refuses_bad_options_without_reading(tmp_path):
    for argv in (["state", "--service", "s"], ["state", "--root", "/x", "--service", "s", "--rot", "1"],
                 ["state-json", "{}"], []):
        r = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True,
                           check=False, stdin=subprocess.DEVNULL)
        assert r.returncode == 2 and r.stdout == "", (argv, r)
        assert r.stderr.startswith("usage: hoststate.py"), (argv, r.stderr)


def test_run_gives_the_command_no_stdin_and_keeps_no_pipe_open():
    run = _module().run
    # stdin is /dev/null: a command that reads it ends at once instead of waiting
    assert run(["sh", "-c", "cat; echo read-all"]) == (0, "read-all\n")
    # a command that leaves a child running with its stdout elsewhere still returns
    assert run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo started"]) == (0, "started\n")
    # many runs leak no descriptor
    import os

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        run(["true"])
    assert len(os.listdir("/proc/self/fd")) == before


def test_run_kills_a_command_past_its_deadline():
    import time

    run = _module().run
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        run(["sh", "-c", "echo partial; exec sleep 30"], timeout_s=0.5)
    assert time.monotonic() - t0 < 20  # killed, not waited for


def test_state_and_platform_report_the_pythons_version_and_glibcs(tmp_path):
    """What decides whether the lock's wheels install, read by the python that runs the
    script (the host's `sglang_system_python`) in the pre-flight's one round trip."""
    import os

    want = {"python": "%d.%d" % sys.version_info[:2],
            "glibc": os.confstr("CS_GNU_LIBC_VERSION").split()[1]}
    out = subprocess.run([sys.executable, str(TOOL), "state", "--root", str(tmp_path),
                          "--service", "sglang-deploy-test-absent"],
                         capture_output=True, text=True, check=True).stdout
    state = json.loads(out)
    assert {k: state[k] for k in want} == want
    out = subprocess.run([sys.executable, str(TOOL), "platform"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == want


def test_glibc_version_without_glibc_is_none(monkeypatch):
    """musl has no CS_GNU_LIBC_VERSION (os.confstr raises ValueError) and
    platform.libc_ver() finds no glibc: no version, not a guess."""
    mod = _module()

    def unknown_name(name):
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(mod.os, "confstr", unknown_name)
    monkeypatch.setattr(mod.platform, "libc_ver", lambda: ("", ""))
    assert mod.glibc_version() is None
    monkeypatch.setattr(mod.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert mod.glibc_version() == "2.31"  # the fallback when confstr cannot say
    monkeypatch.setattr(mod.os, "confstr", lambda name: "glibc 2.34")
    assert mod.glibc_version() == "2.34"
    monkeypatch.setattr(mod.os, "confstr", lambda name: None)
    monkeypatch.setattr(mod.platform, "libc_ver", lambda: ("", ""))
    assert mod.glibc_version() is None

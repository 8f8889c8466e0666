"""remote/hoststate.py `state` run locally (it is a stdlib script fed to the host's python)."""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
from pathlib import Path

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

    rel = tmp_path / "releases" / "r1"
    srt = rel / "venv/lib/python3.11/site-packages/sglang/srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text("ARGS = 1\n")
    (srt / "model_runner.py").write_text("patched\n")
    (rel / "release.json").write_text("{}")
    (rel / "autotune-patch.json").write_text(json.dumps({"file": str(srt / "model_runner.py")}))
    (tmp_path / "releases" / "r2").mkdir()  # a release without venv nor record
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


def test_uv_version_comes_from_the_installed_record_when_it_matches_the_binary(tmp_path):
    """The installer's uv-X.dist-info names the version when its RECORD gives the binary's size;
    a binary of another size (replaced by hand) or two records mean asking the binary."""
    venv = tmp_path / "venv"
    uv = venv / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("#!/bin/sh\necho 'uv 0.14.0'\n")  # what the binary itself says
    uv.chmod(0o755)
    info = venv / "lib" / "python3.11" / "site-packages" / "uv-0.13.9.dist-info"
    info.mkdir(parents=True)
    size = uv.stat().st_size

    def record(n):
        (info / "RECORD").write_text(f"uv-0.13.9.dist-info/METADATA,sha256=x,10\n"
                                     f"../../../bin/uv,sha256=abc,{n}\nuv-0.13.9.dist-info/RECORD,,\n")

    uv_version = _module().uv_version
    record(size)
    assert uv_version(str(venv)) == "0.13.9"  # from the record: the binary did not run
    record(size + 1)
    assert uv_version(str(venv)) == "0.14.0"  # the binary is not the one recorded
    record(size)
    (info.parent / "uv-0.14.0.dist-info").mkdir()
    assert uv_version(str(venv)) == "0.14.0"  # two records: ask the binary
    uv.chmod(0o644)
    assert uv_version(str(venv)) is None  # not executable: no uv

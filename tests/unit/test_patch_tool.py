"""Unit tests of sglang_deploy.remote.patch_tool (the host side of the autotune patch: files,
state record, CLI) on a fake site-packages, and of the two shipped files run as on a host."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from patchsources import (
    MARKED,
    METHOD_LINE,
    METHOD_SRC,
    NO_FUNC_SRC,
    OPTIN_SRC,
    UPSTREAM_FN_SRC,
    UPSTREAM_SRC,
    PackagePatchError,
    assert_stdlib_only_imports,
    changed_lines,
    code_of,
    make_site,
    ship_tools,
)

from sglang_deploy.core import patch
from sglang_deploy.core.hostrecords import PatchRecord
from sglang_deploy.remote import patch_tool as P


def test_locate_accepts_site_package_dir_prefix_and_file(tmp_path):
    site = make_site(tmp_path / "venv/lib/python3.11/site-packages")
    target = site / "sglang/srt/model_executor/model_runner.py"
    for given in (site, site / "sglang", tmp_path / "venv", target):
        assert P.locate(given) == target, given


def test_locate_prefers_the_file_that_defines_the_predicate(tmp_path):
    site = make_site(tmp_path, NO_FUNC_SRC)
    runner = site / "sglang/srt/model_executor/runner"
    runner.mkdir()
    (runner / "base_runner.py").write_text("class BaseRunner:\n    pass\n")
    assert P.locate(site).name == "model_runner.py"  # nothing defines it: model_runner.py
    (runner / "flashinfer_autotune.py").write_text(UPSTREAM_FN_SRC)
    assert P.locate(site).name == "flashinfer_autotune.py"
    (runner / "flashinfer_autotune.py").unlink()
    (runner / "base_runner.py").write_text(UPSTREAM_SRC.replace("ModelRunner", "BaseRunner"))
    assert P.locate(site).name == "base_runner.py"


def test_locate_not_found(tmp_path):
    assert code_of(P.locate, tmp_path / "missing") == "not-found"
    assert code_of(P.locate, tmp_path) == "not-found"


def test_version_sources(tmp_path):
    site = make_site(tmp_path / "a", version="0.5.9")
    assert P.status(site).version == "0.5.9"  # _version.py, not version.py's fallback
    site = make_site(tmp_path / "b", version="0.5.6", scm=False)
    assert P.read_version(site / "sglang") == "0.5.6"
    site = make_site(tmp_path / "c")
    (site / "sglang/_version.py").unlink()
    assert P.read_version(site / "sglang") is None
    (site / "sglang-0.5.11.dist-info").mkdir()
    (site / "sglang-0.5.11.dist-info/METADATA").write_text(
        "Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.11\n\nbody\n")
    assert P.read_version(site / "sglang") == "0.5.11"


def test_status_is_read_only(tmp_path):
    site = make_site(tmp_path)
    f = site / "sglang/srt/model_executor/model_runner.py"
    before = f.read_bytes()
    r = P.status(site)
    assert (r.state, r.version, r.line) == ("needed", "0.5.12.post1", METHOD_LINE)
    assert r.diff.startswith("--- a/sglang/srt/model_executor/model_runner.py")
    assert f.read_bytes() == before
    assert not (f.parent / "__pycache__").exists()


def test_apply_writes_atomically_keeps_mode_compiles_and_records(tmp_path):
    site = make_site(tmp_path / "site")
    f = site / "sglang/srt/model_executor/model_runner.py"
    os.chmod(f, 0o640)
    st = f.stat()
    record = tmp_path / "state/patch.json"
    r = P.apply(site, record_path=record)
    assert r.state == "applied" and r.changed
    assert changed_lines(METHOD_SRC, f.read_text()) == [
        (METHOD_LINE, ' ' * 12 + '# "flashinfer_cutlass",', " " * 12 + MARKED)]
    st2 = f.stat()
    assert stat.S_IMODE(st2.st_mode) == 0o640 and (st2.st_uid, st2.st_gid) == (st.st_uid, st.st_gid)
    assert st2.st_ino != st.st_ino  # replaced by rename, not rewritten in place
    assert [p.name for p in f.parent.iterdir() if p.name.endswith(".tmp")] == []
    pyc = Path(importlib.util.cache_from_source(str(f)))
    assert r.pyc == str(pyc) and pyc.is_file()
    rec = json.loads(record.read_text())
    assert rec == {
        "patch": "flashinfer-cutlass-autotune", "tool": "sglang-deploy", "version": "0.5.12.post1",
        "file": str(f), "state": "applied", "sha256_before": r.sha256_before,
        "sha256_after": r.sha256, "line": METHOD_LINE,
    }
    assert rec["sha256_before"] != rec["sha256_after"]

    # second run: no-op, file and record untouched
    mtime, rec_mtime = f.stat().st_mtime_ns, record.stat().st_mtime_ns
    r2 = P.apply(site, record_path=record)
    assert (r2.state, r2.changed, r2.diff, r2.pyc) == ("already-applied", False, "", None)
    assert r2.sha256 == r2.sha256_before == r.sha256
    assert f.stat().st_mtime_ns == mtime and record.stat().st_mtime_ns == rec_mtime
    assert P.status(site).state == "already-applied"


def test_apply_with_an_explicit_interpreter(tmp_path):
    site = make_site(tmp_path)
    r = P.apply(site / "sglang", python=sys.executable)
    assert r.state == "applied"
    assert r.pyc == importlib.util.cache_from_source(r.file) and Path(r.pyc).is_file()


def test_apply_compile_failure_is_reported(tmp_path):
    site = make_site(tmp_path)
    with pytest.raises(PackagePatchError) as ei:
        P.apply(site, python=str(tmp_path / "no-python"))
    assert ei.value.code == "compile-failed" and "no-python" in str(ei.value)
    # the source was written (and verified) before compiling: a rerun is a no-op
    assert P.apply(site).state == "already-applied"


def test_apply_crlf_file_keeps_bytes_but_one_line(tmp_path):
    site = make_site(tmp_path, METHOD_SRC.replace("\n", "\r\n"))
    f = site / "sglang/srt/model_executor/model_runner.py"
    before = f.read_bytes()
    assert P.apply(site).state == "applied"
    after = f.read_bytes()
    assert after.count(b"\r\n") == before.count(b"\r\n")
    diff = [(a, b) for a, b in zip(before.split(b"\r\n"), after.split(b"\r\n")) if a != b]
    assert len(diff) == 1


def test_apply_refuses_and_leaves_file_alone(tmp_path):
    site = make_site(tmp_path, OPTIN_SRC, version="0.5.6", scm=False)
    f = site / "sglang/srt/model_executor/model_runner.py"
    before = f.read_bytes()
    record = tmp_path / "rec.json"
    assert code_of(P.apply, site, record_path=record) == "no-autotune-list"
    assert f.read_bytes() == before and not record.exists()


def test_apply_write_failure_leaves_file_and_no_temp(tmp_path, monkeypatch):
    site = make_site(tmp_path)
    f = site / "sglang/srt/model_executor/model_runner.py"
    before = f.read_bytes()

    def deny(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(P.os, "replace", deny)
    with pytest.raises(PackagePatchError) as ei:
        P.apply(site)
    assert ei.value.code == "write-failed" and "Permission denied" in str(ei.value)
    assert f.read_bytes() == before
    assert sorted(p.name for p in f.parent.iterdir()) == ["model_runner.py"]


def test_result_json():
    r = P.PatchResult(state="applied", file="/x", version="0.5.12.post1", sha256="a",
                      diff="d", message="m", sha256_before="b", line=3)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["state"] == "applied" and d["file"] == "/x" and d["changed"] is True
    assert d["version"] == "0.5.12.post1" and d["sha256"] == "a"


# ----------------------------------------------------------------------------- CLI


def parse(argv):
    parser = argparse.ArgumentParser(prog="sglang-deploy")
    sub = parser.add_subparsers(dest="command")
    P.add_parser(sub)
    return parser.parse_args(argv)


def test_cli_status_and_apply_json(tmp_path, capsys):
    site = make_site(tmp_path / "site")
    args = parse(["patch", "status", str(site), "--json"])
    assert args.func is P.run
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "needed" and out["version"] == "0.5.12.post1"
    assert out["file"].endswith("sglang/srt/model_executor/model_runner.py")

    record = tmp_path / "rec.json"
    args = parse(["patch", "apply", str(site), "--json", "--record", str(record)])
    assert P.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "applied" and out["changed"] and out["record"] == str(record)
    assert record.is_file()

    assert P.run(parse(["patch", "apply", str(site)])) == 0
    assert capsys.readouterr().out.startswith("already-applied: ")


def test_cli_errors_exit_1_with_message_on_stderr(tmp_path, capsys):
    site = make_site(tmp_path, NO_FUNC_SRC, version="0.5.5", scm=False)
    assert P.run(parse(["patch", "apply", str(site), "--json"])) == 1
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["state"] == "no-autotune-list" and out["version"] == "0.5.5"
    assert out["file"].endswith("model_runner.py") and "0.5.7 .. 0.5.12.post1" in out["error"]
    assert "no-autotune-list" in cap.err and "fix:" in cap.err

    assert P.run(parse(["patch", "status", str(tmp_path / "nope")])) == 1
    cap = capsys.readouterr()
    assert cap.out == "" and "not-found" in cap.err


def test_cli_requires_a_subcommand():
    with pytest.raises(SystemExit):
        parse(["patch"])


# ----------------------------------------------------------------------------- standalone


def test_module_level_imports_are_stdlib_only():
    """Shipped to the hosts: stdlib only; ``patch`` comes from the package when imported
    from it, else from the script's own folder."""
    tree = assert_stdlib_only_imports(P)
    (branch,) = [n for n in tree.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "__package__"]
    assert [a.name for n in branch.orelse if isinstance(n, ast.Import) for a in n.names] == ["patch"]
    assert P.patch is patch  # in the package: the one sglang_deploy.core.patch


def test_standalone_script_without_site_packages(tmp_path):
    """What the deploy does on a host: ship patch.py and patch_tool.py side by side, run
    patch_tool.py with the venv python."""
    script = ship_tools(tmp_path / "ship")
    site = make_site(tmp_path / "site")
    record = tmp_path / "rec.json"
    # -I -S: no site-packages, no cwd on sys.path: sglang_deploy/pyinfra are not importable
    cmd = [sys.executable, "-I", "-S", str(script)]
    proc = subprocess.run(cmd + ["apply", str(site), "--json", "--record", str(record)],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "applied" and out["version"] == "0.5.12.post1"
    assert json.loads(record.read_text())["state"] == "applied"

    proc = subprocess.run(cmd + ["status", str(site), "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "already-applied"

    bad = make_site(tmp_path / "old", OPTIN_SRC, version="0.5.6", scm=False)
    proc = subprocess.run(cmd + ["apply", str(bad), "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["state"] == "no-autotune-list" and out["version"] == "0.5.6"
    assert "cannot patch SGLang: expected" in proc.stderr  # same text as the package's error

    proc = subprocess.run(cmd + ["frobnicate"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2


def test_status_from_record_agrees_with_status_and_refuses_a_changed_file(tmp_path):
    """The deploy's no-op path reads the release's record instead of running `status` in the
    venv: it must say what `status` says while the file is the recorded bytes, and nothing
    (ask the host) once the file differs or the record is odd."""
    import hashlib

    site = make_site(tmp_path / "site")
    f = site / "sglang/srt/model_executor/model_runner.py"
    record = tmp_path / "patch.json"
    P.apply(site, record_path=record)
    raw = json.loads(record.read_text())
    rec = PatchRecord.from_json(raw)
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    got = patch.status_from_record(rec, sha)
    assert got["state"] == P.status(site).state == "already-applied"
    assert got["file"] == str(f) and got["version"] == "0.5.12.post1"

    f.write_text(METHOD_SRC)  # reinstalled by hand: the unpatched bytes again
    changed = hashlib.sha256(f.read_bytes()).hexdigest()
    assert patch.status_from_record(rec, changed) is None and P.status(site).state == "needed"
    assert patch.status_from_record(rec, None) is None  # the file is gone
    assert patch.status_from_record(None, sha) is None
    assert patch.status_from_record(PatchRecord.from_json({**raw, "state": "weird"}), sha) is None
    assert patch.status_from_record(PatchRecord.from_json([raw]), sha) is None  # not a record
    upstream = PatchRecord.from_json({**raw, "state": "enabled-upstream"})
    assert patch.status_from_record(upstream, sha)["state"] == "enabled-upstream"

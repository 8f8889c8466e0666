"""Unit tests of sglang_deploy.core.patch on small synthetic sources (no wheels, no network)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_deploy.core import patch as P
from sglang_deploy.core.errors import PatchError as PackagePatchError

MARKED = '"flashinfer_cutlass",  # sglang-deploy: autotune patch'
TODO = "# TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed."

# 0.5.10 .. 0.5.12.post1 shape (trtllm_routed commented just above), plus a decoy list with a
# commented cutlass line in another method: only the predicate's own list counts.
METHOD_SRC = f'''\
import torch


class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        """Check if flashinfer autotune should be run."""
        if self.server_args.disable_flashinfer_autotune:
            return False

        backend_str = self.server_args.moe_runner_backend

        if backend_str not in [
            "flashinfer_trtllm",
            # TODO: Enable for flashinfer_trtllm_routed once https://github.com/x/y/issues/2749 is fixed.
            # "flashinfer_trtllm_routed",
            "flashinfer_mxfp4",
            {TODO}
            # "flashinfer_cutlass",
        ]:
            return False

        major, _ = torch.cuda.get_device_capability()
        return major >= 9

    def other(self):
        return [
            "flashinfer_other",
            # "flashinfer_cutlass",
        ]
'''
METHOD_LINE = 18  # 1-based line of '# "flashinfer_cutlass",' in METHOD_SRC

# 0.5.7 .. 0.5.9 shape (no trtllm_routed line)
METHOD_057_SRC = f'''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        backend_str = self.server_args.moe_runner_backend
        if backend_str not in [
            "flashinfer_trtllm",
            "flashinfer_mxfp4",
            {TODO}
            # "flashinfer_cutlass",
        ]:
            return False
        return True
'''

# A module-function layout (0.5.15+ shape) that still had the TODO: 8-space items.
MODULE_FN_SRC = f'''\
def should_run_flashinfer_autotune(model_runner, *, for_speculative_draft=False) -> bool:
    mr = model_runner
    backend_str = mr.server_args.moe_runner_backend

    moe_needs_autotune = backend_str in [
        "flashinfer_trtllm",
        "flashinfer_mxfp4",
        {TODO}
        # "flashinfer_cutlass",
    ]
    return moe_needs_autotune
'''

UPSTREAM_SRC = '''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        backend_str = self.server_args.moe_runner_backend
        moe_needs_autotune = backend_str in [
            "flashinfer_trtllm",
            "flashinfer_trtllm_routed",
            "flashinfer_mxfp4",
            "flashinfer_cutedsl",
            "flashinfer_cutlass",
        ]
        model_uses_fp4 = self.model_config.quantization in (
            "modelopt_fp4",
            "modelopt_mixed",
        )
        return moe_needs_autotune or model_uses_fp4
'''

UPSTREAM_FN_SRC = '''\
def should_run_flashinfer_autotune(model_runner, *, for_speculative_draft=False) -> bool:
    moe_needs_autotune = model_runner.backend in [
        "flashinfer_trtllm",
        "flashinfer_cutlass",
        "flashinfer_megamoe",
    ]
    return moe_needs_autotune
'''

# 0.5.6.x: opt-in flag, no MoE list
OPTIN_SRC = '''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        """Check if flashinfer autotune should be run."""
        if not self.server_args.enable_flashinfer_autotune:
            return False
        backend_str = self.server_args.attention_backend
        if backend_str not in ["flashinfer", "trtllm_mla", "trtllm_mha"]:
            return False
        return True
'''

NO_FUNC_SRC = '''\
class ModelRunner:
    def init_device_graphs(self):
        pass
'''


def changed_lines(old: str, new: str) -> list[tuple[int, str, str]]:
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b)
    return [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]


def code_of(fn, *args, **kw) -> str:
    with pytest.raises(PackagePatchError) as ei:
        fn(*args, **kw)
    return ei.value.code


# ----------------------------------------------------------------------------- pure core


def test_method_shape_with_trtllm_routed_above():
    plan = P.analyse(METHOD_SRC, "sglang/srt/model_executor/model_runner.py")
    assert plan.state == "needed"
    assert plan.function == "ModelRunner._should_run_flashinfer_autotune"
    assert plan.line == METHOD_LINE
    assert plan.old_line == ' ' * 12 + '# "flashinfer_cutlass",'
    assert plan.new_line == " " * 12 + MARKED
    new, state = P.apply_text(METHOD_SRC)
    assert state == "applied"
    assert changed_lines(METHOD_SRC, new) == [(METHOD_LINE, plan.old_line, plan.new_line)]
    # the trtllm_routed line and the TODO stay commented, the decoy list is untouched
    assert '            # "flashinfer_trtllm_routed",\n' in new
    assert f"            {TODO}\n" in new
    assert new.count('# "flashinfer_cutlass",') == 1  # the decoy one
    compile(new, "model_runner.py", "exec")


def test_diff_is_one_line_unified_diff():
    plan = P.analyse(METHOD_SRC, "sglang/srt/model_executor/model_runner.py")
    lines = plan.diff.splitlines()
    assert lines[0] == "--- a/sglang/srt/model_executor/model_runner.py"
    assert lines[1] == "+++ b/sglang/srt/model_executor/model_runner.py"
    assert [x for x in lines[2:] if x.startswith(("-", "+"))] == [
        "-" + " " * 12 + '# "flashinfer_cutlass",',
        "+" + " " * 12 + MARKED,
    ]


def test_057_shape():
    new, state = P.apply_text(METHOD_057_SRC)
    assert state == "applied"
    assert changed_lines(METHOD_057_SRC, new) == [
        (8, ' ' * 12 + '# "flashinfer_cutlass",', " " * 12 + MARKED)
    ]


def test_module_function_shape_keeps_8_spaces():
    plan = P.analyse(MODULE_FN_SRC)
    assert plan.function == "should_run_flashinfer_autotune"
    new, state = P.apply_text(MODULE_FN_SRC)
    assert state == "applied"
    assert changed_lines(MODULE_FN_SRC, new) == [
        (9, ' ' * 8 + '# "flashinfer_cutlass",', " " * 8 + MARKED)
    ]


def test_second_apply_is_already_applied_and_a_noop():
    once, _ = P.apply_text(METHOD_SRC)
    plan = P.analyse(once)
    assert (plan.state, plan.marker, plan.line, plan.diff) == ("already-applied", True, METHOD_LINE, "")
    twice, state = P.apply_text(once)
    assert (twice, state) == (once, "already-applied")


def test_uncommented_by_hand_under_todo_is_already_applied_without_marker():
    src = METHOD_SRC.replace('            # "flashinfer_cutlass",\n        ]:',
                             '            "flashinfer_cutlass",\n        ]:')
    plan = P.analyse(src)
    assert plan.state == "already-applied" and not plan.marker
    assert "by hand" in plan.message
    assert P.apply_text(src) == (src, "already-applied")


@pytest.mark.parametrize("src", [UPSTREAM_SRC, UPSTREAM_FN_SRC,
                                 UPSTREAM_SRC.replace("class ModelRunner", "class BaseRunner")])
def test_enabled_upstream_untouched(src):
    plan = P.analyse(src)
    assert plan.state == "enabled-upstream" and not plan.marker and plan.diff == ""
    assert P.apply_text(src) == (src, "enabled-upstream")


def test_crlf_line_endings_are_kept():
    src = METHOD_SRC.replace("\n", "\r\n")
    new, state = P.apply_text(src)
    assert state == "applied"
    assert new.count("\r\n") == src.count("\r\n") and "\n" not in new.replace("\r\n", "")
    assert f"\r\n{' ' * 12}{MARKED}\r\n" in new
    assert P.apply_text(new) == (new, "already-applied")


def test_form_feed_and_unicode_separators_do_not_shift_lines():
    # str.splitlines() would split on \f and \u2028; Python's line numbers do not.
    src = "# \u2028 odd \x0c comment\n" + METHOD_SRC
    new, state = P.apply_text(src)
    assert state == "applied"
    assert changed_lines(src.replace("\u2028", "U").replace("\x0c", "F"),
                         new.replace("\u2028", "U").replace("\x0c", "F"))[0][0] == METHOD_LINE + 1


def test_no_function_is_no_autotune_list_with_actionable_message():
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(NO_FUNC_SRC, "sglang/srt/model_executor/model_runner.py", version="0.5.5")
    err = ei.value
    assert err.code == "no-autotune-list" and err.details["code"] == "no-autotune-list"
    text = str(err)
    assert "0.5.7 .. 0.5.12.post1" in text and ">= 0.5.13" in text
    assert "SGLang 0.5.5" in text and "turn the autotune patch off" in text


def test_optin_scheme_of_056_is_no_autotune_list():
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(OPTIN_SRC, version="0.5.6")
    assert ei.value.code == "no-autotune-list"
    assert "--enable-flashinfer-autotune" in ei.value.found


UNRECOGNISED = {
    "no-list": METHOD_057_SRC.replace(
        'if backend_str not in [\n            "flashinfer_trtllm",\n            "flashinfer_mxfp4",\n'
        f"            {TODO}\n" '            # "flashinfer_cutlass",\n        ]:',
        'if backend_str != "flashinfer_trtllm":'),
    "two-lists": METHOD_057_SRC.replace(
        "        return True", '        x = ["flashinfer_a", "flashinfer_b"]\n        return True'),
    "commented-twice": METHOD_057_SRC.replace(
        '            # "flashinfer_cutlass",\n',
        '            # "flashinfer_cutlass",\n            # "flashinfer_cutlass",\n'),
    "no-todo-above": METHOD_057_SRC.replace(f"            {TODO}\n", ""),
    "todo-elsewhere": METHOD_057_SRC.replace(
        f"            {TODO}\n            # \"flashinfer_cutlass\",\n",
        f"            {TODO}\n            \"flashinfer_x\",\n            # \"flashinfer_cutlass\",\n"),
    "todo-other-indent": METHOD_057_SRC.replace(f"            {TODO}", f"        {TODO}"),
    "commented-other-indent": METHOD_057_SRC.replace(
        '            # "flashinfer_cutlass",', '                # "flashinfer_cutlass",'),
    "enabled-and-commented": METHOD_057_SRC.replace(
        '            "flashinfer_mxfp4",\n', '            "flashinfer_mxfp4",\n            "flashinfer_cutlass",\n'),
    "marker-elsewhere": METHOD_057_SRC.replace(
        '            "flashinfer_mxfp4",', '            "flashinfer_mxfp4",  # sglang-deploy: autotune patch'),
    "no-cutlass": METHOD_057_SRC.replace('            # "flashinfer_cutlass",\n', ""),
    "commented-outside-list": METHOD_057_SRC.replace(
        f'            {TODO}\n            # "flashinfer_cutlass",\n        ]:\n',
        f"        ]:\n            {TODO}\n            # \"flashinfer_cutlass\",\n"),
    "one-line-list": 'class M:\n    def _should_run_flashinfer_autotune(self):\n'
                     '        return self.b in ["flashinfer_trtllm", "flashinfer_cutlass2"]\n',
    "items-share-line": METHOD_057_SRC.replace(
        '            "flashinfer_trtllm",\n            "flashinfer_mxfp4",\n',
        '            "flashinfer_trtllm", "flashinfer_mxfp4",\n'),
    "defined-twice": METHOD_057_SRC + "\n\n" + METHOD_057_SRC.replace("ModelRunner", "Other"),
    "method-and-function": METHOD_057_SRC + "\n\n" + MODULE_FN_SRC,
    "syntax-error": METHOD_057_SRC + "\n    def broken(:\n",
}


@pytest.mark.parametrize("name", sorted(UNRECOGNISED))
def test_unrecognised_shapes_are_refused(name):
    src = UNRECOGNISED[name]
    assert src not in (METHOD_057_SRC,)  # the mutation applied
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(src, "sglang/srt/model_executor/model_runner.py")
    assert ei.value.code == "unrecognised", str(ei.value)
    assert ei.value.fix and "0.5.7 .. 0.5.12.post1" in str(ei.value) or name == "syntax-error"
    with pytest.raises(PackagePatchError):
        P.apply_text(src)


def test_function_named_in_a_nested_scope_is_not_the_predicate():
    src = "def outer():\n    def should_run_flashinfer_autotune():\n        return 1\n"
    assert code_of(P.analyse, src) == "no-autotune-list"


# ----------------------------------------------------------------------------- files


def make_site(root: Path, source: str = METHOD_SRC, *, version: str = "0.5.12.post1",
              rel: str = "srt/model_executor/model_runner.py", scm: bool = True) -> Path:
    """A fake site-packages with sglang/<rel> and the version files of 0.5.7+ (scm=True) or
    of <= 0.5.6 (version literal in version.py)."""
    pkg = root / "sglang"
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(source)
    if scm:
        (pkg / "version.py").write_text(
            "try:\n    from sglang._version import __version__\nexcept ImportError:\n"
            '    __version__ = "0.0.0.dev0"\n')
        (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    else:
        (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


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
    d = json.loads(r.to_json())
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
    tree = ast.parse(Path(P.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    assert names - {"__future__"} <= set(sys.stdlib_module_names)
    # the one non-stdlib import is guarded
    guarded = [n for n in tree.body if isinstance(n, ast.Try)]
    assert guarded and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                           for h in guarded[0].handlers)


def test_standalone_script_without_site_packages(tmp_path):
    """What the deploy does on a host: ship patch.py, run it with the venv python."""
    script = tmp_path / "ship/patch.py"
    script.parent.mkdir()
    shutil.copy(P.__file__, script)
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
    rec = json.loads(record.read_text())
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    got = P.status_from_record(rec, sha)
    assert got["state"] == P.status(site).state == "already-applied"
    assert got["file"] == str(f) and got["version"] == "0.5.12.post1"

    f.write_text(METHOD_SRC)  # reinstalled by hand: the unpatched bytes again
    changed = hashlib.sha256(f.read_bytes()).hexdigest()
    assert P.status_from_record(rec, changed) is None and P.status(site).state == "needed"
    assert P.status_from_record(rec, None) is None  # the file is gone
    assert P.status_from_record(None, sha) is None
    assert P.status_from_record({**rec, "state": "weird"}, sha) is None
    assert P.status_from_record({**rec, "state": "enabled-upstream"}, sha)["state"] == "enabled-upstream"

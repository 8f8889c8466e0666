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


def _releases_tree(root: Path) -> None:
    """Releases as an install leaves them, plus what a listing must not mistake for one."""
    rel = root / "releases" / "r1"
    srt = rel / "venv/lib/python3.11/site-packages/sglang/srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text("ARGS = 1\n")
    (rel / "release.json").write_text('{"id": "r1"}')
    (rel / ".complete").write_text("")
    (rel / "venv/lib/python3.11/site-packages/uv-0.9.1.dist-info").mkdir()
    (root / "releases" / "r2").mkdir()
    (root / "releases" / ".tmp-r3").mkdir()  # an install in progress: hidden, not a release
    (root / "releases" / ".tmp-r3" / "release.json").write_text("{}")
    (root / "releases" / "stray-file").write_text("")
    (root / "releases" / "r4").mkdir()
    (root / "releases" / "r4" / "release.json").symlink_to(root / "nowhere.json")  # dangling
    tools = root / "tools" / "venv" / "lib" / "python3.11" / "site-packages"
    tools.mkdir(parents=True)
    (tools / "uv-0.13.9.dist-info").mkdir()
    (tools / "uv-helper").mkdir()


def test_entries_lists_what_glob_lists(tmp_path):
    import glob

    _releases_tree(tmp_path)
    entries = _module().entries
    for folder, prefix, suffix in [(tmp_path / "releases", "", ""), (tmp_path / "releases", "r", ""),
                                   (tmp_path / "tools/venv/lib/python3.11/site-packages", "uv-", ".dist-info"),
                                   (tmp_path / "tools/venv/lib", "python", ""),
                                   (tmp_path / "no-such-folder", "", ""), (Path("/dev"), "nvidia", "")]:
        assert entries(str(folder), prefix, suffix) == sorted(glob.glob(f"{folder}/{prefix}*{suffix}"))
    assert entries(str(tmp_path / "releases")) == [str(tmp_path / "releases" / n)
                                                   for n in ("r1", "r2", "r4", "stray-file")]


def test_state_json_reads_the_same_as_state(tmp_path):
    _releases_tree(tmp_path)
    (tmp_path / "unit.service").write_text("[Unit]\n")
    opts = {"root": str(tmp_path), "service": "sglang-deploy-test-absent", "model": None,
            "secrets": None, "cache": str(tmp_path / "releases"), "dev_open": True,
            "path": [str(tmp_path / "unit.service"), str(tmp_path / "absent")]}
    argv = ["state", "--root", opts["root"], "--service", opts["service"], "--cache", opts["cache"],
            "--dev-open", "--path", opts["path"][0], "--path", opts["path"][1]]
    results = []
    for args in (argv, ["state-json", json.dumps(opts)]):
        out = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                             check=True).stdout
        state = json.loads(out)
        state.pop("monotonic_now")
        results.append(state)
    assert results[0] == results[1]
    assert set(results[1]["releases"]) == {"r1", "r2", "r4", "stray-file"}
    assert results[1]["releases"]["r1"]["complete"] is True
    assert results[1]["paths"][opts["path"][0]]["kind"] == "file"
    assert results[1]["paths"][opts["path"][1]] is None


def test_state_json_refuses_bad_options_without_reading(tmp_path):
    for text, words in [('{"root": "/x", "service": "s", "rot": 1}', "unknown state option(s): rot"),
                        ('{"service": "s"}', "'root' is required"),
                        ('{"root": "/x", "service": "s", "path": "/one"}', "list of strings"),
                        ('[1]', "one JSON object"), ("{not json", "")]:
        r = subprocess.run([sys.executable, str(TOOL), "state-json", text], capture_output=True,
                           text=True, check=False)
        assert r.returncode == 2 and r.stdout == "", (text, r)
        assert r.stderr.startswith("hoststate.py state-json: ") and words in r.stderr, (text, r.stderr)
    r = subprocess.run([sys.executable, str(TOOL), "state-json"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2 and "state-json" in r.stderr


def _state_json_imports(tmp_path, *modules: str) -> tuple[dict, list[bool]]:
    """Run `hoststate.py state-json` (-I -S, as the snapshot runs it) in a fresh python:
    its state, and whether each of MODULES was imported by the end."""
    import ast

    # exec'd as a script without runpy (which imports re, through pkgutil and typing)
    code = ("import sys; sys.argv = ['hoststate.py', 'state-json', sys.argv[1]]\n"
            f"source = open({str(TOOL)!r}).read()\n"
            "try:\n    exec(compile(source, 'hoststate.py', 'exec'), {'__name__': '__main__'})\n"
            "except SystemExit:\n    pass\n"
            f"print('\\n' + repr([m in sys.modules for m in {list(modules)!r}]))")
    opts = json.dumps({"root": str(tmp_path), "service": "sglang-deploy-test-absent"})
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, opts], capture_output=True,
                         text=True, check=True, stdin=subprocess.DEVNULL, timeout=60).stdout
    lines = out.strip().splitlines()
    return json.loads(lines[-3]), ast.literal_eval(lines[-1])


def test_state_json_does_not_import_argparse_or_glob(tmp_path):
    state, imported = _state_json_imports(tmp_path, "argparse", "glob")
    assert "service" in state and imported == [False, False]


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


def test_a_state_read_imports_no_subprocess_json_or_re(tmp_path):
    state, imported = _state_json_imports(tmp_path, "subprocess", "json", "re")
    assert "service" in state and imported == [False, False, False]


def test_run_kills_a_command_past_its_deadline():
    import time

    run = _module().run
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        run(["sh", "-c", "echo partial; exec sleep 30"], timeout_s=0.5)
    assert time.monotonic() - t0 < 20  # killed, not waited for


# ------------------------------------------------------------------ JSON without the json package
CORPUS = [
    {}, [], "", 0, -1, 10 ** 30, 1.5, -0.0, 1e300, 2.5e-10, True, False, None,
    {"b": [1, {"c": [None, "x"]}], "a": "\u00e9\u4e2d\U0001f600", "k\n\"\\": "\t\b\f\r"},
    [[[[[]]]], {"": {"": ""}}],
    {"n": float("inf"), "m": float("-inf")},
]


@pytest.mark.parametrize("obj", CORPUS)
def test_codec_answers_as_the_json_package(obj):
    mod = _module()
    assert mod.dumps(obj) == json.dumps(obj, sort_keys=True)
    text = json.dumps(obj, indent=2)
    assert mod.loads(text) == json.loads(text)
    assert mod.loads(text.encode()) == json.loads(text)
    assert mod.loads(f" \n\t{text}\r\n ") == obj


def test_codec_rejects_what_json_rejects_with_its_words():
    mod = _module()
    for bad in ("", " ", "{", '{"a": 1} x', "[1,]", "{'a': 1}", '"\x01"', "nul", "\ufeff{}"):
        with pytest.raises(ValueError) as theirs:
            json.loads(bad)
        with pytest.raises(ValueError) as ours:
            mod.loads(bad)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="not JSON serializable"):
        mod.dumps({"a": object()})
    import math

    assert math.isnan(mod.loads("NaN")) and mod.dumps([float("nan")]) == "[NaN]"


def test_codec_uses_the_accelerator_and_falls_back_without_it(tmp_path):
    assert _module().loads.__module__ != "json"  # the accelerator on this Python
    # a Python without _json: the json package itself, same answers
    code = ("import sys; sys.modules['_json'] = None\n"
            "import importlib.util as u\n"
            f"s = u.spec_from_file_location('h', {str(TOOL)!r}); m = u.module_from_spec(s)\n"
            "s.loader.exec_module(m)\n"
            "print(m.loads.__module__, m.dumps({'b': 1, 'a': [True]}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(None, 1) == ["json", '{"a": [true], "b": 1}\n']

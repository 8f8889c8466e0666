"""The one CLI convention (commands/cli.py, commands/common.py, controller/hosts.py) and the
launch flags checked on the controller against the locked sglang (controller/lockedflags.py)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from sglang_deploy.commands import cli, common, status
from sglang_deploy.controller import flagcache, hosts, lockedflags, runner
from sglang_deploy.core import data
from sglang_deploy.core.errors import DataError, UsageError
from testbed.wheels import fetch_sglang

REPO = Path(__file__).resolve().parents[2]
PINNED = "0.5.12.post1"

INVENTORY = '''
_data = {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt"}
gpu_a = ([("a1", _data), ("a2", _data)], {})
gpu_b = ([("b1", _data), ("web-9", _data)], {})
'''


@pytest.fixture
def inv(tmp_path) -> str:
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    return str(path)


@pytest.fixture
def no_pyinfra(monkeypatch):
    """Any pyinfra run (a connection) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"pyinfra was run: {args}")

    monkeypatch.setattr(runner, "run_pyinfra", refuse)


@pytest.fixture
def locked_wheel(tmp_path, monkeypatch) -> Path:
    """The real sglang wheel the testbed lock pins (downloaded once into the shared wheel
    cache), with a fresh, empty cache of parsed flags."""
    wheel = fetch_sglang(PINNED)
    monkeypatch.setenv("SGLANG_DEPLOY_WHEEL_CACHE", str(wheel.parent))
    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    lockedflags._locked_flags_once.cache_clear()
    yield wheel
    lockedflags._locked_flags_once.cache_clear()


# ------------------------------------------------------------------ --version, --help, -v

def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"sglang-deploy {version('sglang-deploy')}"


def _commands(parser=None, path=()) -> list[tuple[str, argparse.ArgumentParser]]:
    """("cache save", its parser) of every command and subcommand of sglang-deploy."""
    found = []
    for action in (parser or cli.build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((" ".join((*path, name)), sub))
                found += _commands(sub, (*path, name))
    return found


COMMANDS = dict(_commands())
def test_the_convention_test_sees_every_command():
    assert {"patch", "patch status", "patch apply", "doctor", "lock", "wheelhouse", "rollout",
            "status", "logs", "cache", "cache save", "rebuild", "bench", "explain-log",
            "report", "data-table", "data", "metrics-targets"} == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_uppercase_positionals_v_and_its_exit_statuses(command):
    sub = COMMANDS[command]
    text = sub.format_help()
    positionals = [a.metavar or a.dest for a in sub._actions
                   if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    assert all(m == m.upper() for m in positionals), (command, positionals)
    assert "-v, --verbose" in text
    assert "exit status:" in text
    assert re.search(r"^  0   ", text, re.MULTILINE) and re.search(r"^  2   usage", text, re.MULTILINE), text


@pytest.mark.parametrize("command", ["rollout", "status", "rebuild", "bench", "doctor",
                                     "wheelhouse", "lock", "data-table", "logs", "cache",
                                     "cache save", "report", "metrics-targets"])
def test_every_command_lists_its_exit_codes(command):
    text = COMMANDS[command].format_help()
    assert "exit status:" in text
    for code in ("0   success", "1   ", "2   usage or input error", "130 interrupted"):
        assert code in text, (command, code)
    if command == "rollout":
        assert "3   ROLLBACK FAILED" in text


@pytest.mark.parametrize("argv", [["cache", "save", "-v", "i.py", "h", "f.tgz"],
                                  ["cache", "save", "i.py", "h", "f.tgz", "-v"],
                                  ["report", "i.py", "-v"], ["patch", "status", "p", "-v"],
                                  ["doctor", "-v"], ["data-table", "-v"]])
def test_v_is_taken_after_any_command(argv):
    assert cli.build_parser().parse_args(argv).verbose == 1


def test_patch_lists_its_exit_codes():
    patch = cli.build_parser()._subparsers._group_actions[0].choices["patch"]
    assert "exit status:" in patch.format_help()


@pytest.mark.parametrize("argv", [
    ["rollout", "inv.py", "--limit", "g*", "--data", "k=v", "--json"],
    ["status", "inv.py", "--limit", "g*", "--data", "k=v", "--json"],
    ["bench", "inv.py", "--limit", "g*", "--data", "k=v", "--json"],
    ["rebuild", "inv.py", "g1", "--data", "k=v", "--json"],
])
def test_host_commands_take_inventory_positional_limit_data_json(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.inventory == "inv.py" and args.data == ["k=v"] and args.json is True


def test_verbose_reaches_pyinfra_from_before_or_after_the_command(monkeypatch):
    parser = cli.build_parser()
    assert parser.parse_args(["-vv", "status", "i.py"]).verbose == 2
    assert parser.parse_args(["status", "i.py", "-v"]).verbose == 1
    assert parser.parse_args(["status", "i.py"]).verbose == 0
    monkeypatch.setattr(runner, "pyinfra_bin", lambda: "pyinfra")
    monkeypatch.delenv(runner.VERBOSITY_ENV, raising=False)
    with runner.verbose(2):
        assert runner.pyinfra_argv("i.py", "deploy.py")[:3] == ["pyinfra", "-y", "-vv"]
    assert "-v" not in " ".join(runner.pyinfra_argv("i.py", "deploy.py"))  # the block ended
    with runner.verbose(0):
        assert "-v" not in " ".join(runner.pyinfra_argv("i.py", "deploy.py"))
    assert runner.VERBOSITY_ENV not in os.environ


def test_the_clis_verbose_reaches_the_pyinfra_it_starts_and_ends_with_the_command(monkeypatch):
    seen: list[list[str]] = []
    monkeypatch.delenv(runner.VERBOSITY_ENV, raising=False)
    monkeypatch.setattr(runner, "pyinfra_bin", lambda: "pyinfra")
    module = cli.build_parser().parse_args(["status", "i.py"])._module

    def run(args):
        seen.append(runner.pyinfra_argv("i.py", "deploy.py"))
        return 0

    monkeypatch.setattr(module, "run", run)
    assert cli.main(["-vv", "status", "i.py"]) == 0
    assert seen == [["pyinfra", "-y", "-vv", "i.py", "deploy.py"]]
    assert runner.VERBOSITY_ENV not in os.environ


# ------------------------------------------------------------------ the top-level handler

def _raise(exc):
    def run(args):
        raise exc
    return run


def test_typed_input_error_is_one_line_with_the_fix_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(status, "run", _raise(DataError(
        key="sglang_port", what="`sglang_port` must be integer", found="str 'x'",
        fix="set it to a number")))
    assert cli.main(["status", "inv.py"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert err.startswith("sglang-deploy status: invalid data: sglang_port: expected")
    assert "found: str 'x'" in err and "fix: set it to a number" in err


def test_a_traceback_only_with_v(monkeypatch, capsys):
    monkeypatch.setattr(status, "run", _raise(UsageError(what="x", found="y", fix="z")))
    assert cli.main(["-v", "status", "inv.py"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("exc, rc, words", [
    (FileNotFoundError(2, "No such file or directory", "locks/x.txt"), 2,
     "cannot use locks/x.txt: No such file or directory; fix: check the path"),
    (PermissionError(13, "Permission denied", "/etc/shadow"), 2, "Permission denied; fix: run as"),
    (ConnectionRefusedError(111, "Connection refused"), 1, "Connection refused"),
])
def test_os_errors_are_one_line(monkeypatch, capsys, exc, rc, words):
    monkeypatch.setattr(status, "run", _raise(exc))
    assert cli.main(["status", "inv.py"]) == rc
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_a_host_failure_keeps_its_exit_status(monkeypatch):
    from sglang_deploy.core.errors import VerifyError

    monkeypatch.setattr(status, "run", _raise(VerifyError(what="ready", found="no")))
    assert cli.main(["status", "inv.py"]) == 1


# ------------------------------------------------------------------ --limit (pyinfra's rules)

@pytest.mark.parametrize("patterns, expected", [
    (["a1"], ["a1"]),
    (["gpu_b"], ["b1", "web-9"]),            # a group
    (["a*"], ["a1", "a2"]),                   # a glob on host names
    (["web-?", "a2"], ["a2", "web-9"]),       # several, inventory order
    (["inv"], ["a1", "a2", "b1", "web-9"]),  # the group pyinfra names after the file
])
def test_limit_matches_names_groups_and_globs_as_pyinfra_does(inv, tmp_path, patterns, expected):
    from pyinfra_cli.cli import _get_inventory_pattern_matches

    inventory = hosts.load(inv, tmp_path)
    got = [h.name for h in hosts.match(inventory, patterns)]
    assert got == expected
    assert sorted(h.name for h in _get_inventory_pattern_matches(inventory, patterns, "--limit")) \
        == sorted(expected)


def test_a_limit_that_matches_nothing_names_the_hosts_and_groups(inv, no_pyinfra, capsys):
    assert cli.main(["status", inv, "--limit", "a1", "--limit", "gpu-c*"]) == 2
    err = capsys.readouterr().err
    assert "nothing matches 'gpu-c*'" in err
    assert "hosts: a1, a2, b1, web-9" in err and "groups: gpu_a, gpu_b, inv" in err


@pytest.mark.parametrize("argv", [["status", "missing.py"], ["bench", "missing.py"],
                                  ["rollout", "missing.py"], ["rebuild", "missing.py", "h"]])
def test_a_missing_inventory_is_exit_2_not_an_empty_result(argv, tmp_path, monkeypatch,
                                                          no_pyinfra, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no file missing.py" in err and "Traceback" not in err


def test_rebuild_of_a_host_not_in_the_inventory_fails_before_running(inv, no_pyinfra, capsys):
    assert cli.main(["rebuild", inv, "nosuchhost"]) == 2
    err = capsys.readouterr().err
    assert "HOST patterns" in err and "nothing matches 'nosuchhost'" in err
    assert "rebuilt" not in err


def test_rebuild_reports_the_hosts_own_error(inv, monkeypatch, capsys, locked_wheel):
    """The host's outcome record decides and says why; pyinfra's printed text is not read."""
    from sglang_deploy.core import outcome
    from sglang_deploy.core.errors import PreflightError
    from sglang_deploy.integration import journal

    err = PreflightError(what="7 of 8 GPUs", found="7 GPUs (0-6)", fix="pass /dev/nvidia7 through")
    misleading = "    [a1] Connected\n    [a1] all good\n"

    def fake(*a, spec=None, **k):
        journal.Writer(spec.journal).put("a1", "outcome", outcome.record(
            "a1", outcome.FAILED, "preflight", phase="execute", error=outcome.error_of(err)))
        return runner.Run(argv=[], rc=1, output=misleading, seconds=1.0)

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(runner, "run_pyinfra", fake)
    assert cli.main(["rebuild", inv, "a1", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["ok"] is False and doc["hosts"][0]["host"] == "a1"
    assert doc["hosts"][0]["error"].startswith("GPU pre-flight failed: 7 of 8 GPUs")
    assert "fix:      pass /dev/nvidia7 through" in captured.err


# ------------------------------------------------------------------ --data

def test_data_items_parse_like_pyinfras_and_need_an_equals_sign():
    assert hosts.parse_data(["a=1", "b=true", "c={\"x\": 2}", "d=text", "e=x=y"]) == \
        {"a": 1, "b": True, "c": {"x": 2}, "d": "text", "e": "x=y"}
    for bad in ("noequals", "=1"):
        with pytest.raises(UsageError, match="KEY=VALUE"):
            hosts.parse_data([bad])


def test_rollout_data_noequals_is_one_line_exit_2(inv, no_pyinfra, capsys):
    assert cli.main(["rollout", inv, "--data", "noequals"]) == 2
    err = capsys.readouterr().err
    assert "--data 'noequals'" in err and err.strip().count("\n") == 0


@pytest.mark.parametrize("item, words", [
    ("verify_timeout_s=abc", "`verify_timeout_s` must be integer or number"),
    ("sglang_portt=1", "did you mean `sglang_port`?"),
    ('sglang_env={"HF_TOKEN": "hf_x"}', "sglang_hf_token_env"),
])
def test_data_is_checked_like_the_inventorys_before_any_connection(inv, no_pyinfra, capsys,
                                                                   monkeypatch, locked_wheel,
                                                                   item, words):
    monkeypatch.chdir(REPO)
    assert cli.main(["status", inv, "--data", item]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sglang-deploy status: [a1] invalid data: ") and words in err


# ------------------------------------------------------------------ the controller flag check

def _settings(**flags) -> data.Settings:
    return data.resolve({"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt",
                         "sglang_flags": flags}, environ={})


def test_a_flag_typo_fails_on_the_controller_naming_the_closest_locked_flag(locked_wheel):
    with pytest.raises(DataError) as exc:
        lockedflags.check(_settings(**{"tp-sizee": 8}), REPO)
    err = exc.value
    assert err.key == "sglang_flags" and f"locked SGLang {PINNED}" in err.what
    assert f"--tp-sizee is not a flag of SGLang {PINNED}" in err.found
    assert "did you mean --tp-size?" in err.fix
    assert lockedflags.check(_settings(**{"tp-size": 8, "disable-cuda-graph": True}), REPO) == []


def test_the_locked_flags_are_cached_by_the_wheels_sha256(locked_wheel, tmp_path, monkeypatch):
    first = lockedflags.locked_flags(REPO / "locks" / "testbed.txt")
    assert first.source == str(locked_wheel) and first.spec is not None
    cached = list(lockedflags.spec_cache().iterdir())
    assert len(cached) == 1 and cached[0].name.split(".")[0] in first_hashes()
    # a new controller process without any wheel reads the cached flags
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    monkeypatch.setenv("SGLANG_DEPLOY_WHEEL_CACHE", str(tmp_path / "no-wheels"))
    again = lockedflags.locked_flags(REPO / "locks" / "testbed.txt")
    assert again.spec == first.spec and "(cached)" in again.source


def first_hashes() -> frozenset[str]:
    from sglang_deploy.core.lockfile import sglang_pin

    return sglang_pin((REPO / "locks" / "testbed.txt").read_text()).hashes


def test_the_wheel_is_taken_from_the_wheelhouse_when_it_is_on_the_controller(
        locked_wheel, tmp_path, monkeypatch):
    house = tmp_path / "house"
    house.mkdir()
    (house / locked_wheel.name).write_bytes(locked_wheel.read_bytes())
    monkeypatch.setenv("SGLANG_DEPLOY_WHEEL_CACHE", str(tmp_path / "no-wheels"))
    got = lockedflags.locked_flags(REPO / "locks" / "testbed.txt", str(house))
    assert got.source == str(house / locked_wheel.name) and got.spec is not None


def test_without_a_wheel_the_check_warns_and_leaves_it_to_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SGLANG_DEPLOY_WHEEL_CACHE", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    monkeypatch.setattr(flagcache, "_MEMORY", {})
    lockedflags._locked_flags_once.cache_clear()
    warnings: list[str] = []
    try:
        assert lockedflags.check(_settings(**{"tp-sizee": 8}), REPO, warnings.append) == []
    finally:
        lockedflags._locked_flags_once.cache_clear()
    assert len(warnings) == 1 and "not checked on the controller" in warnings[0]
    assert "the host checks them after the install" in warnings[0]


# ------------------------------------------------------------------ the failing host's error

def test_host_error_shows_pyinfras_own_error_where_no_record_says_why():
    """Display only (no outcome is decided on it): the typed block pyinfra printed without a
    host prefix, else its `--> pyinfra error` line, else the last lines."""
    out = ("    [h1] Connected\n"
           "sglang_deploy.core.errors.DataError: invalid deploy data: expected a lock\n"
           "  found:    no file locks/x.txt\n"
           "--> pyinfra error: No hosts remaining!\n")
    assert common.host_error(out) == ("DataError: invalid deploy data: expected a lock\n"
                                      "  found:    no file locks/x.txt")
    assert common.host_error("x\n--> pyinfra error: boom\n").startswith("--> pyinfra error: boom")
    assert common.host_error("") == "pyinfra printed nothing"


def test_status_row_of_a_silent_host_carries_its_real_error():
    """No plan record: the host's outcome record says why (its failed command's own words)."""
    from sglang_deploy.core import outcome
    from sglang_deploy.core.journal import Journal

    ran = Journal({"d": {"outcome": outcome.record("d", "failed", "preflight",
                                                   error=outcome.operation_error(
                                                       "Host state", ["sudo: a password is required"]))}})
    row = status.rows_from_plans(["d"], ran, fallback="--> pyinfra error: No hosts remaining!")[0]
    assert row["problem"] == "the operation `Host state` failed on the host\nsudo: a password is required"
    assert "see the pyinfra output" not in row["problem"] and "No hosts remaining" not in row["problem"]


# ------------------------------------------------------------------ tables

def _plain(text: str) -> list[str]:
    """TEXT's lines, checked to be what a pipe should get: ASCII only, no colour, no border
    drawn, no line padded with spaces (to the widest row or to a console width)."""
    assert text and "\x1b[" not in text and all(ord(c) < 128 for c in text)
    lines = text.splitlines()
    assert all(line == line.rstrip() for line in lines), [ln for ln in lines if ln != ln.rstrip()]
    assert not any(set(line) <= set("-+|= ") and line for line in lines)
    return lines


def test_tables_are_plain_text_rows_when_not_a_terminal():
    buf = io.StringIO()
    t = common.table(("host", "state", "note"), title="a title", out=buf)
    t.add_row("h1", "ok", "x" * 300)  # never wrapped onto a second line
    t.add_row("h2", "failed", "boom")
    common.print_table(t, buf)
    lines = _plain(buf.getvalue())
    assert lines[0] == "a title"
    assert lines[1].split() == ["host", "state", "note"]
    assert lines[2].split() == ["h1", "ok", "x" * 300] and lines[3].split() == ["h2", "failed", "boom"]
    assert len(lines[3]) < 30  # not padded to the long row above


def test_status_table_when_not_a_terminal():
    rows = [{"host": "a1", "reachable": False,
             "problem": "Could not connect (Unable to connect to port 22 on 127.0.0.1)"},
            {"host": "a2", "reachable": True, "in_sync": True, "healthy": True,
             "unit": "active/running", "uptime_s": 100, "release": "r1", "sglang_version": "0.5",
             "patch_state": "applied", "health": 200, "models": ["m"], "last_verified": "t",
             "changes": []}]
    buf = io.StringIO()
    status.render(rows, buf)
    lines = _plain(buf.getvalue())
    assert lines[0] == "sglang-deploy status" and lines[1].split()[:4] == ["host", "group", "reachable", "unit"]
    assert lines[2].split()[:3] == ["a1", "-", "no"] and lines[2].endswith("127.0.0.1)")
    assert lines[3].split() == ["a2", "-", "yes", "active/running", "1m40s", "r1", "0.5", "applied",
                                "200", "-", "m", "t", "in", "sync"]  # gpus: no health read


def test_doctor_table_when_not_a_terminal(capsys):
    from sglang_deploy.commands import doctor

    cases = REPO / "tests" / "fixtures" / "doctor"
    assert cli.main(["doctor", "--from", str(cases / "p2p-corrupt"), "--expected-count", "8"]) == 1
    lines = _plain(capsys.readouterr().out)
    assert lines[0].startswith("GPU pre-flight (from: ") and lines[1].split() == ["status", "check", "result"]
    assert lines[-1] == "overall: fail" and "P2P matrix:" in lines
    report = doctor.run_doctor(from_dir=cases / "uvm-missing")
    buf = io.StringIO()
    doctor.render(report, buf)
    assert _plain(buf.getvalue())[-1] == "overall: fail"


# ------------------------------------------------------------------ --limit in doctor and report

@pytest.fixture
def recorded_runs(monkeypatch) -> list[list[str]]:
    """Each pyinfra run's --limit hosts, recorded instead of run (every host then has no
    record: what a run that reached none of them leaves); the data check is not the point."""
    from sglang_deploy.integration import hooks

    limits: list[list[str]] = []

    def record(inventory, deploy_file, *, limit=(), **kwargs):
        limits.append(list(limit))
        return runner.Run(argv=[], rc=1, output="", seconds=0.0)

    monkeypatch.setattr(runner, "run_pyinfra", record)
    monkeypatch.setattr(hooks, "validate_inventory", lambda *a, **k: None)
    return limits


@pytest.mark.parametrize("patterns, expected", [
    (["gpu_b"], ["b1", "web-9"]), (["a*"], ["a1", "a2"]), (["web-?", "a2"], ["a2", "web-9"])])
def test_doctor_limit_takes_groups_and_globs(inv, recorded_runs, capsys, patterns, expected):
    argv = ["doctor", inv, "--json"] + [x for p in patterns for x in ("--limit", p)]
    assert cli.main(argv) == 1  # no host left a record
    assert recorded_runs == [expected]
    assert [h["host"] for h in json.loads(capsys.readouterr().out)["hosts"]] == expected


@pytest.mark.parametrize("patterns, expected", [
    (["gpu_b"], ["b1", "web-9"]), (["a*"], ["a1", "a2"]), (["web-?", "a2"], ["a2", "web-9"])])
def test_report_limit_takes_groups_and_globs(inv, recorded_runs, tmp_path, monkeypatch, capsys,
                                             patterns, expected):
    monkeypatch.chdir(tmp_path)
    limits = [x for p in patterns for x in ("--limit", p)]
    assert cli.main(["report", inv, "--json", "--no-status"] + limits) == 0
    assert [h["host"] for h in json.loads(capsys.readouterr().out)["hosts"]] == expected
    assert recorded_runs == []  # --no-status: nothing run
    assert cli.main(["report", inv, "--json"] + limits) == 0
    assert [h["host"] for h in json.loads(capsys.readouterr().out)["hosts"]] == expected
    assert recorded_runs == [expected]


@pytest.mark.parametrize("command", [["doctor"], ["report"], ["report", "--no-status"]])
def test_a_doctor_or_report_limit_that_matches_nothing_names_the_hosts(inv, no_pyinfra, capsys,
                                                                      command):
    assert cli.main([command[0], inv, *command[1:], "--limit", "gpu-c*"]) == 2
    err = capsys.readouterr().err
    assert "nothing matches 'gpu-c*'" in err
    assert "hosts: a1, a2, b1, web-9" in err and "groups: gpu_a, gpu_b, inv" in err


# ------------------------------------------------------------------ logs / cache save: HOST

@pytest.mark.parametrize("argv", [["logs", "{inv}", "gpu-9"],
                                  ["logs", "{inv}", "gpu-9", "--explain"],
                                  ["cache", "save", "{inv}", "gpu-9", "{out}"]])
def test_a_host_not_in_the_inventory_is_said_so_exit_2(inv, tmp_path, monkeypatch, capsys, argv):
    from sglang_deploy.controller import hostshell

    def refuse(*a, **k):
        raise AssertionError("connected")

    monkeypatch.setattr(hostshell, "connect", refuse)
    monkeypatch.setattr(hostshell, "connection", refuse)
    out = tmp_path / "cache.tgz"
    assert cli.main([a.format(inv=inv, out=out) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "'gpu-9' is not in the inventory" in err and "cannot reach" not in err
    assert "use one of the hosts: a1, a2, b1, web-9" in err and err.count("\n") == 1
    assert list(tmp_path.glob("*cache.tgz*")) == []  # neither the archive nor a temporary


# ------------------------------------------------------------------ status --json

def test_status_json_help_describes_what_it_prints(inv, monkeypatch, capsys):
    rows = [{"host": "a1", "reachable": True, "in_sync": True, "healthy": True}]
    router = {"host": "r1", "url": "http://r1:30000", "error": None,
              "workers": [{"host": "a1", "url": "http://a1:30000", "state": "ready"}]}
    monkeypatch.setattr(status, "collect_status", lambda *a, **k: (rows, {}))
    monkeypatch.setattr(status, "router_status", lambda *a, **k: router)
    assert cli.main(["status", inv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    help_text = " ".join(COMMANDS["status"].format_help().split())
    assert '{"hosts": [one object per host, with "group" and "node_rank"' in help_text
    assert '"groups": [{"name", "nodes" (rank order), "dist_init_addr", "state"' in help_text
    assert '"router": null (no routers group) or {' in help_text
    assert set(doc) == {"hosts", "groups", "router"} and doc["hosts"] == rows and doc["groups"] == []
    for key in (*doc["router"], *doc["router"]["workers"][0]):
        assert f'"{key}"' in help_text


# ------------------------------------------------------------------ report --out

def test_report_out_in_a_missing_folder_is_refused_before_any_connection(inv, no_pyinfra,
                                                                         tmp_path, capsys):
    page = tmp_path / "no-such-dir" / "fleet.html"
    assert cli.main(["report", inv, "--out", str(page)]) == 2
    err = capsys.readouterr().err
    assert f"no folder {page.parent}" in err and f"mkdir -p {page.parent}" in err
    assert not page.parent.exists()


def test_report_default_folder_is_created_and_said_so(inv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", inv, "--no-status"]) == 0
    err = capsys.readouterr().err
    assert "created the folder .sglang-deploy/" in err
    assert (tmp_path / ".sglang-deploy" / "report.html").is_file()
    assert cli.main(["report", inv, "--no-status", "--out", "here.html"]) == 0
    assert "created" not in capsys.readouterr().err and (tmp_path / "here.html").is_file()

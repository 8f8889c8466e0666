"""`sglang-deploy explain-log` and `logs --explain` as commands: the input they refuse
(empty, binary, compressed), the hint on a terminal, their verdict exit statuses beside the
global ones, --sglang-version, and the ranks against the log's own server args."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import pytest

from sglang_deploy.commands import cli, common
from sglang_deploy.commands import explain as explain_log
from sglang_deploy.controller import hostshell
from sglang_deploy.core.logs.explain import explain, render_text

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "real"
READY = REAL / "061-ready-qwq32b-tp4-l4-ecs-04x.log"                  # outcome ready
FAILED = REAL / "060-glm5-mi355x-tp8-capture-forwardmetadata-typeerror.log"
INCOMPLETE = REAL / "037-stuck-capture-2node-nccl-info.log"          # no verdict
W047 = REAL / "047-nccl-watchdog-after-load-tp8.log"


class _Stdin:
    def __init__(self, data: bytes, tty: bool) -> None:
        self.buffer = io.BytesIO(data)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def _one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("sglang-deploy explain-log: ") and err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------------------------------
# input that is no log
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("data, words", [
    (bytes(range(256)) * 40, "is binary data"),
    (b"\x7fELF\x02\x01\x01" + b"\x00" * 2000 + b"[TP0] x\n", "is binary data"),
    (gzip.compress(READY.read_bytes()), "a gzip-compressed file; fix: read it as text: zcat "),
    (b"LPKSHHRH" + b"\x00" * 200, "a systemd journal file; fix: read it as text: journalctl --file "),
])
def test_binary_input_is_refused_in_one_line_exit_2(tmp_path, capsys, data, words):
    path = tmp_path / "sglang.log"
    path.write_bytes(data)
    assert cli.main(["explain-log", str(path)]) == common.EXIT_USAGE
    err = _one_line_error(capsys)
    assert words in err and "cannot explain this input" in err


@pytest.mark.parametrize("data", [b"", b"\n  \n\t\n", b"-- No entries --\n"])
def test_empty_input_is_refused_not_incomplete(tmp_path, capsys, monkeypatch, data):
    path = tmp_path / "empty.log"
    path.write_bytes(data)
    assert cli.main(["explain-log", str(path), "--json"]) == common.EXIT_USAGE
    err = _one_line_error(capsys)
    assert "expected a log to explain" in err and "journalctl -u sglang" in err
    monkeypatch.setattr(sys, "stdin", _Stdin(data, tty=False))
    assert cli.main(["explain-log", "-"]) == common.EXIT_USAGE
    assert "standard input" in _one_line_error(capsys)


def test_a_missing_file_is_an_input_error(tmp_path, capsys):
    assert cli.main(["explain-log", str(tmp_path / "nope.log")]) == common.EXIT_USAGE
    assert "nope.log: No such file or directory; fix: check the path" in _one_line_error(capsys)


def test_text_with_a_crashs_nul_tail_or_in_utf16_is_still_read(tmp_path, capsys):
    """A file cut short by a crash ends in NUL bytes; PowerShell's `>` writes UTF-16."""
    path = tmp_path / "cut.log"
    path.write_bytes(FAILED.read_bytes() + b"\x00" * 8192)
    assert cli.main(["explain-log", str(path)]) == common.EXIT_FAILED
    text = capsys.readouterr().out
    assert "\x00" not in text and "cause:       cuda-graph-capture" in text
    path.write_bytes(READY.read_text().encode("utf-16"))
    assert cli.main(["explain-log", str(path), "--json"]) == common.EXIT_OK
    assert json.loads(capsys.readouterr().out)["outcome"] == "ready"


def test_reading_a_terminal_prints_a_hint_first_and_a_pipe_does_not(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(READY.read_bytes(), tty=True))
    assert cli.main(["explain-log", "-"]) == common.EXIT_OK
    out, err = capsys.readouterr()
    assert err == f"sglang-deploy explain-log: {explain_log.TERMINAL_HINT}\n"
    assert "paste it and press Ctrl-D" in err and "outcome:     ready" in out
    monkeypatch.setattr(sys, "stdin", _Stdin(READY.read_bytes(), tty=False))
    assert cli.main(["explain-log", "-"]) == common.EXIT_OK
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------
# exit statuses: distinct from the global ones, listed in --help
# ---------------------------------------------------------------------------------------


def test_the_verdict_exit_statuses_do_not_collide_with_the_global_ones(capsys):
    assert explain_log.EXIT == {"ready": 0, "failed": 1, "incomplete": 4}
    assert explain_log.EXIT_INCOMPLETE not in (common.EXIT_USAGE, common.EXIT_ROLLBACK_FAILED,
                                               common.EXIT_INTERRUPTED)
    for path, rc in ((READY, 0), (FAILED, 1), (INCOMPLETE, 4)):
        assert cli.main(["explain-log", str(path)]) == rc, path.name
    capsys.readouterr()


@pytest.mark.parametrize("command", ["explain-log", "logs"])
def test_help_lists_the_verdict_exit_statuses(command):
    sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
    text = sub.format_help()
    for code in ("0   success", "1   ", "the log shows a failed start or a crash",
                 "2   usage or input error", "4   ", "the log ends with no verdict",
                 "130 interrupted"):
        assert code in text, (command, code)
    assert "\n  3   " not in text


@pytest.mark.parametrize("path, outcome, rc", [(READY, "ready", 0), (FAILED, "failed", 1),
                                               (INCOMPLETE, "incomplete", 4)])
def test_logs_explain_exits_as_explain_log_does(monkeypatch, capsys, path, outcome, rc):
    monkeypatch.setattr(hostshell, "last_start",
                        lambda inventory, host: hostshell.LastStart(path.read_text()))
    assert cli.main(["logs", "inv.py", "gpu-1", "--explain", "--json"]) == rc
    result = json.loads(capsys.readouterr().out)
    assert result["outcome"] == outcome and result["watchdog_restart"] is None


WEDGE = {"at": 1.0, "at_iso": "2026-12-05T19:00:00Z", "host": "gpu-1", "verdict": "wedged",
         "evidence": ["1-token generation failed 3 time(s) in a row since 30s ago"],
         "action": "restart", "reason": "wedged", "invocation": "inv-old",
         "new_invocation": "inv-new", "outcome": "restarted and verified in 12.0s"}


@pytest.mark.parametrize("invocation, relation", [("inv-new", "started"), ("inv-old", "ended"),
                                                  ("inv-other", None)])
def test_logs_explain_names_the_watchdogs_restart_of_this_run(monkeypatch, capsys, invocation,
                                                               relation):
    report = {**WEDGE, "action": "report", "new_invocation": invocation, "invocation": invocation}
    monkeypatch.setattr(hostshell, "last_start", lambda inventory, host: hostshell.LastStart(
        READY.read_text(), invocation, (WEDGE, report)))
    assert cli.main(["logs", "inv.py", "gpu-1", "--explain", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["watchdog_restart"]
    if relation is None:  # a restart of another run, and a report (no restart) of this one
        assert got is None
    else:
        assert got["relation"] == relation and got["at"] == WEDGE["at_iso"]
        assert got["evidence"] == WEDGE["evidence"] and got["outcome"] == WEDGE["outcome"]
    assert cli.main(["logs", "inv.py", "gpu-1", "--explain"]) == 0
    text = capsys.readouterr().out
    if relation == "started":
        assert ("watchdog:    this run was started by the watchdog's restart at "
                "2026-12-05T19:00:00Z (wedged: 1-token generation failed 3 time(s)") in text
        assert "outcome: restarted and verified in 12.0s" in text
    else:
        assert ("watchdog:    the watchdog restarted this run" in text) == (relation == "ended")


# ---------------------------------------------------------------------------------------
# --sglang-version
# ---------------------------------------------------------------------------------------


def test_sglang_version_is_checked_as_a_version(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["explain-log", "x.log", "--sglang-version", "0.5.12.post1"]) \
        .sglang_version == "0.5.12.post1"
    assert parser.parse_args(["explain-log", "x.log"]).sglang_version is None
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["explain-log", "x.log", "--sglang-version", "banana"])
    assert exc.value.code == common.EXIT_USAGE
    assert "expected an SGLang version such as 0.5.12.post1, got 'banana'" in capsys.readouterr().err


def test_version_is_no_option_of_explain_log_any_more(capsys):
    """It hid the global --version (the tool's own) and took any text."""
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["explain-log", "x.log", "--version", "0.5.9"])
    assert exc.value.code == common.EXIT_USAGE
    assert "unrecognized arguments: --version" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# ranks and the parallel sizes of the log's own server args
# ---------------------------------------------------------------------------------------

SERVER_ARGS = ("[2025-02-07 01:16:02] server_args=ServerArgs(model_path='/models/DeepSeek-V3', "
               "tp_size=8, stream_interval=1, random_seed=393109793, moe_dp_size=4, "
               "api_key=None, dp_size={dp}, pp_size=1, nnodes=1, enable_dp_attention=False)")


def test_ranks_are_the_ones_seen_without_server_args():
    r = explain(W047.read_text().splitlines())
    assert r["parallel"] is None
    assert "ranks:       6 seen (TP0, TP1, TP3, TP5, TP7, rank6)\n" in render_text(r)


def test_ranks_are_told_against_the_tp_size_of_the_logs_server_args():
    r = explain([SERVER_ARGS.format(dp=1), *W047.read_text().splitlines()])
    assert r["parallel"] == {"tp_size": 8, "dp_size": 1, "pp_size": 1, "nnodes": 1}
    assert "ranks:       6 seen of tp_size=8 (TP0, TP1, TP3, TP5, TP7, rank6)\n" in render_text(r)
    r = explain([SERVER_ARGS.format(dp=2), *W047.read_text().splitlines()])
    assert "ranks:       6 seen of tp_size=8, dp_size=2 (TP0," in render_text(r)


def test_a_real_log_with_server_args_and_no_rank_prefix():
    r = explain((REAL / "072-nccl-unhandled-system-error-tp8-conda.log").read_text().splitlines())
    assert r["ranks"] == [] and r["parallel"]["tp_size"] == 8
    assert "ranks:       none seen of tp_size=8\n" in render_text(r)


def test_a_multi_node_server_args_line_names_the_nodes():
    line = ("[2026-03-01 12:00:00] server_args=ServerArgs(tp_size=16, moe_dp_size=2, "
            "nnodes=2, node_rank=1)")
    r = explain([line])
    assert r["parallel"] == {"tp_size": 16, "nnodes": 2}
    assert "ranks:       none seen of tp_size=16, nnodes=2\n" in render_text(r)

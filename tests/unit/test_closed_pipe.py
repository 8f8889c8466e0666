"""A reader that goes away (`sglang-deploy ... | head`) ends every command quietly: a real
pipe whose read end is closed before the command writes (exit 0 or 141, nothing on stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        return subprocess.run([sys.executable, "-m", "sglang_deploy.commands.cli", *args],
                              stdout=write_end, stderr=subprocess.PIPE, cwd=ROOT, text=True,
                              timeout=120, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["data-table"], ["--help"], ["lock", "--help"]],
                         ids=lambda a: " ".join(a))
def test_a_closed_pipe_ends_the_command_quietly(args):
    proc = _run_into_closed_pipe(*args)
    assert proc.returncode in (0, 141)
    assert proc.stderr == ""


def test_a_closed_pipe_is_not_reported_as_a_disk_problem_in_process(monkeypatch, capsys):
    from sglang_deploy.commands import cli

    def write_to_a_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli.importlib.import_module("sglang_deploy.commands.status"), "run",
                        write_to_a_closed_pipe)
    assert cli.main(["status", "inventory/testbed.py", "--json"]) == cli.EXIT_CLOSED_PIPE
    assert capsys.readouterr().err == ""

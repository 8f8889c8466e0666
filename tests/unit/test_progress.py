"""The rollout's per-host progress lines (commands/progress.py)."""

from __future__ import annotations

import io

import pytest

from sglang_deploy.commands.progress import HostProgress, line_event


@pytest.fixture(autouse=True)
def not_a_terminal(monkeypatch):
    """The output is a StringIO or a captured stream: plain lines, whatever the environment
    tells rich (FORCE_COLOR would make it draw a live table)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("line,event", [
    ("--> Starting operation: Verify: block until the model really serves | Verify startup",
     ("verifying", None, None)),
    ("--> Starting operation: Rollback: back to the last known-good configuration | Restore",
     ("rolling back", None, None)),
    ("--> Starting operation: Runtime: user, folders | uv", (None, None, None)),
    ("    [tb1]      verify: phase loading, elapsed 3s", (None, "tb1", "verify: phase loading, elapsed 3s")),
    ("    [tb2] release venv: 12/180 packages, 1.2 GB, 35 s", (None, "tb2", "release venv: 12/180 packages, 1.2 GB, 35 s")),
    ("--> Results:", (None, None, None)),
    ("    [tb1] Success", (None, None, None)),
    ("    [tb1] Ready: deploy.py", (None, None, None)),
])
def test_line_event(line, event):
    assert line_event(line) == event


def test_plain_lines_on_each_change():
    out = io.StringIO()
    p = HostProgress(out=out)
    p.start(["a", "b"])
    p.update(["a"], "deploying")
    p.feed("    [a] verify: phase starting, elapsed 0s")  # a detail: no line of its own
    p.feed("--> Starting operation: Verify: block until the model really serves | x")
    p.update("a", "verifying")  # no change: no line
    p.update("a", "done")
    p.update("b", "draining")
    p.update(["b"], "untouched")
    p.stop()
    assert out.getvalue().splitlines() == ["a: waiting", "b: waiting", "a: deploying",
                                          "a: verifying", "a: done", "b: draining", "b: untouched"]


def test_live_table_shows_state_time_and_detail():
    from rich.console import Console

    now = [100.0]
    p = HostProgress(out=io.StringIO(), clock=lambda: now[0])
    p.start(["gpu-1", "gpu-2"])
    p.update("gpu-1", "deploying")
    p.feed("    [gpu-1] release venv: 40/180 packages, 2.1 GB installed, 35 s")
    now[0] = 112.0
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(p.table(), markup=False)  # as when text is printed above the live table
    lines = [line.split() for line in console.export_text().splitlines() if line.strip()]
    assert lines[0][:3] == ["gpu-1", "deploying", "12s"] and "40/180" in lines[0]
    assert lines[1] == ["gpu-2", "waiting", "12s"]


def test_print_passes_through_without_live():
    out = io.StringIO()
    HostProgress().print("rollout order (2 hosts):", out)
    assert out.getvalue() == "rollout order (2 hosts):\n"

"""`status` on a 120-column terminal: short forms, a host's drift or problem under the table,
long cells wrapped, nothing cut with an ellipsis; `--wide` and a pipe show every value whole."""

from __future__ import annotations

import io
import re

import pytest

from sglang_deploy.commands import cli, status

ROWS = [
    {"host": "gpu-node-1", "group": "tbg1", "node_rank": 0, "reachable": True, "in_sync": True,
     "unit": "active/running", "uptime_s": 5000, "release": "d5e0ed0f12ab34cd",
     "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200,
     "models": ["glm-5"], "last_verified": "2026-12-04T19:29:44+00:00", "changes": [],
     "gpu_health": {"verdict": "healthy", "findings": []}},
    {"host": "gpu-node-2", "group": "tbg1", "node_rank": 1, "reachable": True, "in_sync": False,
     "unit": "active/running", "uptime_s": 5000, "release": "d5e0ed0f12ab34cd",
     "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200, "models": [],
     "last_verified": "2026-12-04T19:29:44+00:00",
     "changes": ["install the release venv d5e0ed0f12ab34cd",
                 "render the unit /etc/systemd/system/sglang.service"],
     "gpu_health": {"verdict": "warning", "findings": [
         {"code": "remap-pending", "severity": "warning", "gpu": 3, "bus_id": "00000000:61:00.0",
          "message": "a row remapping is pending (applied at the next GPU reset)",
          "fix": "at the next maintenance window, reset the GPU", "source": "nvidia-smi"}]}},
    {"host": "gpu-node-12", "reachable": False,
     "problem": "Could not connect ([Errno None] Unable to connect to port 22 on 10.223.0.14)"},
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _shown(monkeypatch, width: int, wide: bool = False) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    out = Terminal()
    status.render(ROWS, out, wide=wide)
    return [ANSI.sub("", line).rstrip() for line in out.getvalue().splitlines()]


def test_the_table_fits_120_columns_and_cuts_nothing(monkeypatch):
    lines = _shown(monkeypatch, 120)
    assert max(len(line) for line in lines) <= 120
    assert not any("…" in line for line in lines)
    header = next(line for line in lines if line.split()[:2] == ["host", "group"])
    assert header.split() == ["host", "group", "ssh", "unit", "up", "release", "sglang", "patch",
                              "http", "gpu", "model", "verified", "drift"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(" gpu-node")}
    assert rows["gpu-node-1"] == ["gpu-node-1", "tbg1/0", "yes", "running", "1h23m", "d5e0ed0f",
                                  "0.5.12.post1", "applied", "200", "ok", "glm-5", "12-04",
                                  "19:29", "in", "sync"]
    assert rows["gpu-node-2"][-2:] == ["2", "change(s)"] and "warn" in rows["gpu-node-2"]
    assert rows["gpu-node-12"] == ["gpu-node-12", "-", "no", "-", "see", "below"]
    text = " ".join(lines)
    assert ("gpu-node-2: 2 change(s): install the release venv d5e0ed0f12ab34cd; render the "
            "unit /etc/systemd/system/sglang.service") in text
    assert "gpu-node-12: Could not connect ([Errno None] Unable to connect to port 22 on " \
           "10.223.0.14)" in text


def test_wide_shows_every_value_whole_and_wraps_instead_of_cutting(monkeypatch):
    lines = _shown(monkeypatch, 120, wide=True)
    assert not any("…" in line for line in lines)
    # the long headers and values (wrapped inside the column at 120, never cut)
    assert "reachabl" in " ".join(lines) and not any(" ssh " in line for line in lines)
    assert "warning:" in " ".join(lines) and "remap-pe" in " ".join(lines)


def test_piped_every_value_stays_whole_on_one_line(capsys):
    status.render(ROWS)
    out = capsys.readouterr().out
    assert "active/running" in out and "d5e0ed0f12ab34cd" in out
    assert "2026-12-04T19:29:44+00:00" in out


def test_wide_is_an_option_of_status():
    args = cli.build_parser().parse_args(["status", "inv.py", "--wide"])
    assert args.wide is True


@pytest.mark.parametrize("unit, shown", [("active/running", "running"),
                                         ("failed/failed", "failed"),
                                         ("inactive/dead", "inactive")])
def test_the_units_short_form(unit, shown):
    assert status.short_cells({"unit": unit})["unit"] == shown

"""scripts/faults_table.py: records in, docs/faults.md out (the render step the fault tests
no longer do themselves)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

TABLE = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "faults_table.py"))


def write(folder: Path, name: str, rec: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps(rec))


def rec(case: str, category: str = "Input", **kw) -> dict:
    return {"case": case, "category": category, "fault": "f", "exit_code": 1, "error": ["e"],
            "recorded_at": 1.0, **kw}


@pytest.mark.parametrize(("rerun", "expected"), [
    ({"rerun_converged": True, "join_only": True}, True),
    ({"rerun_converged": False, "join_only": True}, False),
    (None, None),  # the re-run never ran: the column says n/a
])
def test_a_case_takes_converged_from_the_rerun_record_it_names(tmp_path, rerun, expected):
    write(tmp_path, "input-a", rec("a", rerun_converged=None, rerun_record="rerun"))
    if rerun is not None:
        write(tmp_path, "rerun", {"case": "re-run", "category": "Input", **rerun})
    [loaded] = TABLE["load"](tmp_path)
    assert loaded["case"] == "a" and loaded["rerun_converged"] is expected


def test_join_only_records_are_not_rows_and_own_values_win(tmp_path):
    write(tmp_path, "x", rec("x", rerun_converged=False, rerun_record="rerun"))
    write(tmp_path, "rerun", {"case": "re-run", "category": "Input", "rerun_converged": True,
                              "join_only": True})
    records = TABLE["load"](tmp_path)
    assert [r["case"] for r in records] == ["x"] and records[0]["rerun_converged"] is False
    text = TABLE["render"](records)
    assert "| x | f | 1 | e | n/a | n/a | ✗ |" in text and "| re-run |" not in text


def test_no_records_is_an_error_naming_the_tests_to_run(tmp_path, capsys):
    assert TABLE["main"](["--records", str(tmp_path), "--out", str(tmp_path / "f.md")]) == 1
    assert "test_faults.py" in capsys.readouterr().err
    assert not (tmp_path / "f.md").exists()


def test_the_committed_page_ends_with_the_scripts_footer():
    """docs/faults.md's hand-written end (what the deploy does about faults, known gaps) is the
    script's FOOTER, so a re-render keeps it."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "faults.md").read_text()
    assert page.endswith(TABLE["FOOTER"].rstrip() + "\n")
    assert "## What the deploy does about faults" in TABLE["FOOTER"]

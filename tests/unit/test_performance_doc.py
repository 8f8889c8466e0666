"""docs/performance.md is what bench/run_all.py renders from the newest committed results file
of bench/results/ (a current page: the newest run, its conditions, how to reproduce it; the
history of earlier runs is bench/performance-notes.md)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import run_all

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance.md"


def test_the_page_is_rendered_from_the_newest_result():
    newest = run_all.newest_result()
    assert newest.parent == ROOT / "bench" / "results"
    expected = run_all.render(json.loads(newest.read_text()), source=run_all._shown(newest))
    assert PAGE.read_text() == expected, (
        f"docs/performance.md is not the rendering of {newest.name}: "
        "run `.venv/bin/python bench/run_all.py --render latest` and commit the page")


def test_newest_result_is_the_latest_timestamp(tmp_path):
    for name in ("20261203T050435Z.json", "20261204T000000Z.json", "20261130T235959Z.json"):
        (tmp_path / name).write_text("{}")
    assert run_all.newest_result(tmp_path).name == "20261204T000000Z.json"


def test_the_page_is_short_and_names_its_run_and_the_release_check_place():
    text = PAGE.read_text()
    assert len(text.splitlines()) <= 150
    assert f"`bench/results/{run_all.newest_result().name}` (the newest run)" in text
    assert "## Release check (lock --check)" in text
    assert text.index("## Release check") < text.index("## Figures")


def test_a_rerun_superseded_by_later_reruns_of_all_its_suites_is_not_listed():
    ups = [{"suites": ["router"]}, {"suites": ["latency", "router"]}, {"suites": ["versions"]},
           {"suites": ["router"]}, {"suites": ["versions"]}]
    kept, superseded = run_all.current_updates({"updated": ups})
    # latency's figures still come from the second rerun; the first and third are replaced
    assert kept == [ups[1], ups[3], ups[4]] and superseded == 2
    assert run_all.current_updates({"updated": {"suites": ["dr"]}}) == ([{"suites": ["dr"]}], 0)
    assert run_all.current_updates({}) == ([], 0)

"""The HTML report in a REAL headless browser (Debian's chromium + chromedriver, installed by
scripts/setup.sh): the page renders with no script error, loads nothing from the network,
and the figures in its DOM equal the JSON document that `sglang-deploy report --json` prints.
No testbed: the report's data files are written by the test (reportdata.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from reportdata import document
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from sglang_deploy.commands import htmlreport

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are needed (scripts/setup.sh installs them: "
                    "apt-get install -y chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                "--window-size=1400,2400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def load(driver, path: Path) -> list[dict]:
    """Open PATH; return the console messages of level SEVERE (script errors included)."""
    driver.get_log("browser")  # drop anything left by an earlier page
    driver.get(path.resolve().as_uri())
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def test_console_errors_are_collected(browser, tmp_path):
    """The check below would see a script error: a page with one is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    errors = load(browser, page)
    assert any("undefinedFunction" in e["message"] for e in errors), errors


DOM_FIGURES = """
const q = (sel) => Array.from(document.querySelectorAll(sel));
return {
  ready: document.body.getAttribute("data-ready"),
  embedded: JSON.parse(document.getElementById("report-data").textContent),
  raw: document.getElementById("raw").textContent,
  resources: performance.getEntriesByType("resource").map((r) => r.name),
  summary: Object.fromEntries(q("#summary [data-count]").map((e) => [e.dataset.count, e.textContent.trim()])),
  status: q("table.status:not(.configs) tbody tr").map((tr) => Object.fromEntries(
    Array.from(tr.querySelectorAll("[data-field]")).map((td) => [td.dataset.field, td.textContent.trim()]))),
  cells: q("td.cell").map((td) => ({host: td.dataset.host, src: +td.dataset.src, dst: +td.dataset.dst,
    verdict: td.dataset.verdict, gbps: td.dataset.gbps, text: td.firstChild.textContent.trim(),
    label: td.querySelector("small").textContent, colour: getComputedStyle(td).backgroundColor})),
  phases: q("rect.phase").map((r) => ({host: r.dataset.host, phase: r.dataset.phase,
    seconds: +r.dataset.seconds, width: r.getBBox().width})),
  phaseText: q(".timeline[data-host] ul.phases li").map((li) => li.textContent.trim()),
  ready_s: Object.fromEntries(q(".timeline[data-host]").map((p) => [p.dataset.host,
    (p.querySelector("[data-field=time_to_ready_s]") || {}).textContent || null])),
  bars: q("rect.bar").map((r) => ({host: r.dataset.host, run: +r.dataset.run,
    concurrency: r.dataset.concurrency, value: +r.dataset.value, identity: r.dataset.identity,
    height: r.getBBox().height})),
  benchText: q("table.configs tr[data-run] b[data-concurrency]").map((b) => [b.dataset.concurrency, b.textContent]),
};
"""


def test_report_page_renders_and_shows_the_json(browser, tmp_path):
    doc = document(tmp_path)
    page = htmlreport.write(doc, tmp_path / "report.html")
    errors = load(browser, page)
    assert errors == []
    got = browser.execute_script(DOM_FIGURES)
    browser.save_screenshot(str(tmp_path / "report.png"))
    shutil.copy(tmp_path / "report.png", Path(os.environ.get("REPORT_SCREENSHOT", tmp_path / "copy.png")))

    # the script ran, nothing was fetched, and the page holds exactly the --json document
    assert got["ready"] == "3"
    assert got["resources"] == []
    assert got["embedded"] == json.loads(json.dumps(doc))
    assert json.loads(got["raw"]) == got["embedded"]

    # fleet status: one row per host, in inventory order, with the JSON's values
    assert [r["host"] for r in got["status"]] == [h["host"] for h in doc["hosts"]]
    for row, host in zip(got["status"], doc["hosts"]):
        s = host["status"]
        assert row["state"] == s["state"]
        assert row["release"] == (s["release"] or "-")
        assert row["health"] == (str(s["health"]) if s["health"] is not None else "-")
    assert got["summary"] == {"hosts": "3 hosts", "healthy": "1 healthy", "drifted": "1 drifted",
                              "unreachable": "1 unreachable"}

    # P2P heatmaps: every off-diagonal pair, its GB/s and verdict as in the JSON
    want = [(h["host"], c) for h in doc["hosts"] if h["p2p"] for c in h["p2p"]["cells"]
            if c["verdict"] != "self"]
    assert len(got["cells"]) == len(want) == 8 * 7 + 2 * 1
    for cell, (host, c) in zip(got["cells"], want):
        assert (cell["host"], cell["src"], cell["dst"], cell["verdict"]) == (host, c["src"], c["dst"], c["verdict"])
        assert float(cell["text"]) == c["gbps"] and float(cell["gbps"]) == c["gbps"]
        assert cell["label"] == c["verdict"]
    by_verdict = {c["verdict"]: c["colour"] for c in got["cells"]}
    assert {"ok", "low", "BAD"} <= set(by_verdict) and len({by_verdict[v] for v in ("ok", "low", "BAD")}) == 3

    # startup timelines: the last startup's phases in order, widths proportional to seconds
    want_phases = [(h["host"], p) for h in doc["hosts"] if h["startup"] for p in h["startup"]["phases"]]
    assert [(p["host"], p["phase"], p["seconds"]) for p in got["phases"]] == \
        [(host, p["phase"], p["seconds"]) for host, p in want_phases]
    a = [p for p in got["phases"] if p["host"] == "gpu-a"]
    loading, starting = (next(p for p in a if p["phase"] == name) for name in ("loading", "starting"))
    assert loading["width"] / starting["width"] == pytest.approx(40.0 / 1.2, rel=0.01)
    assert got["ready_s"] == {h["host"]: (str(h["startup"]["time_to_ready_s"]) if h["startup"] else None)
                              for h in doc["hosts"]}

    # benchmark history: one bar per run and level, heights proportional to tok/s
    want_bars = [(h["host"], i, level, value) for h in doc["hosts"] for i, run in enumerate(h["bench"])
                 for level, value in run["output_tok_s"].items()]
    assert [(b["host"], b["run"], b["concurrency"], b["value"]) for b in got["bars"]] == want_bars
    top = max(b["value"] for b in got["bars"])
    tallest = max(got["bars"], key=lambda b: b["value"])
    for b in got["bars"]:
        assert b["height"] / tallest["height"] == pytest.approx(b["value"] / top, rel=0.01)
    assert [(c, float(v)) for c, v in got["benchText"]] == [(level, value) for _, _, level, value in want_bars]

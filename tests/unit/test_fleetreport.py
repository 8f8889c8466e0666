"""The fleet report's pure parts and its data files (no browser: test_report_browser.py)."""

from __future__ import annotations

import json

import pytest
from reportdata import ROWS, document, summary

from sglang_deploy.commands import htmlreport
from sglang_deploy.core import fleetreport


def test_startup_phases_in_startup_order_with_offsets():
    s = summary("h", 1.0, "restarted", {"warmup": 1.0, "loading": 4.0, "starting": 0.5, "zzz": 2.0})
    got = fleetreport.startup_of(s)["phases"]
    assert [(p["phase"], p["start_s"], p["seconds"]) for p in got] == [
        ("starting", 0.0, 0.5), ("loading", 0.5, 4.0), ("warmup", 4.5, 1.0), ("zzz", 5.5, 2.0)]


def test_latest_verification_and_latest_startup():
    started = summary("h", 10.0, "restarted", {"loading": 3.0})
    converged = summary("h", 20.0, "converged", None)
    latest, startup = fleetreport.verifications([converged, started])
    assert latest["action"] == "converged"
    assert startup["action"] == "restarted" and startup["phases"][0]["seconds"] == 3.0
    assert fleetreport.verifications([]) == (None, None)
    assert fleetreport.verifications([converged])[1] is None


def test_bench_history_orders_dedupes_and_numbers_configurations(tmp_path):
    doc = document(tmp_path)
    runs = doc["hosts"][0]["bench"]
    assert [(r["identity"], r["config"]) for r in runs] == [
        ("rel1-aaaaaaaaaaaa", 1), ("rel1-aaaaaaaaaaaa", 1), ("rel2-bbbbbbbbbbbb", 2)]
    assert runs[0]["output_tok_s"] == {"256": 5000.5, "512": 7000.0}
    assert doc["hosts"][1]["bench"] == []


@pytest.mark.parametrize("row,state", [
    (None, "unknown"),
    ({"reachable": False}, "unreachable"),
    ({"reachable": True, "healthy": True, "in_sync": True}, "healthy"),
    ({"reachable": True, "healthy": True, "in_sync": False}, "drifted"),
    ({"reachable": True, "healthy": False, "in_sync": True}, "unhealthy"),
])
def test_host_state(row, state):
    assert fleetreport.host_entry("h", row, None, [], [])["status"]["state"] == state


def test_document_from_the_controller_files(tmp_path):
    doc = document(tmp_path)
    a, b, c = doc["hosts"]
    assert doc["summary"] == {"hosts": 3, "healthy": 1, "drifted": 1, "unhealthy": 0,
                              "unreachable": 1, "unknown": 0}
    # gpu-a: the rollout's converged check is the latest verification; the startup is older
    assert a["verification"]["action"] == "converged" and a["startup"]["action"] == "restarted"
    assert a["startup"]["time_to_ready_s"] == 57.5
    assert a["p2p"]["gpus"] == 8 and len(a["p2p"]["cells"]) == 64
    verdicts = {(x["src"], x["dst"]): x["verdict"] for x in a["p2p"]["cells"]}
    assert verdicts[(1, 4)] == "low" and verdicts[(2, 6)] == "BAD" and verdicts[(0, 1)] == "ok"
    assert b["startup"]["phases"][1] == {"phase": "loading", "start_s": 2.0, "seconds": 20.0}
    assert c["p2p"] is None and c["startup"] is None and c["status"]["problem"].startswith("Could not")
    json.dumps(doc)  # what --json prints


def test_without_status_the_hosts_are_unknown(tmp_path):
    state = tmp_path / ".sglang-deploy"
    state.mkdir()
    doc = fleetreport.build("inv.py", ["h1"], None, htmlreport.read_summaries(state), {}, {}, "now")
    assert doc["status_collected"] is False and doc["hosts"][0]["status"]["state"] == "unknown"
    assert "status not collected" in htmlreport.render_html(doc)


def test_chart_geometry():
    bars = fleetreport.timeline_bars({"phases": [{"phase": "a", "start_s": 0, "seconds": 1.0},
                                                 {"phase": "b", "start_s": 1.0, "seconds": 3.0},
                                                 {"phase": "c", "start_s": 4.0, "seconds": 0.0}]}, 400)
    assert [(b["x"], b["w"]) for b in bars] == [(0, 100.0), (100.0, 300.0), (400.0, 1.0)]
    chart = fleetreport.bench_chart([
        {"config": 1, "identity": "x", "time_iso": "", "output_tok_s": {"256": 450.0, "512": 900.0}},
        {"config": 2, "identity": "y", "time_iso": "", "output_tok_s": {"256": 300.0}}], 400, 100)
    assert chart["top"] == 900.0
    assert [(b["run"], b["concurrency"], b["h"]) for b in chart["bars"]] == [
        (0, 256, 50.0), (0, 512, 100.0), (1, 256, 33.33)]
    assert [g["boundary"] for g in chart["groups"]] == [False, True]


def test_page_escapes_what_it_shows(tmp_path):
    rows = [dict(ROWS[2], host="gpu-a", problem="<script>alert(1)</script>")]
    doc = fleetreport.build("inv.py", ["gpu-a"], rows, {}, {}, {}, "now")
    page = htmlreport.render_html(doc)
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "\\u003cscript>alert(1)\\u003c/script>" in page  # inside the embedded JSON too


def test_cli_registers_report():
    from sglang_deploy.commands import cli

    args = cli.build_parser().parse_args(["report", "inv.py", "--out", "x.html", "--json"])
    assert args._module is htmlreport and args.out == "x.html" and args.json


def test_report_counts_one_host_in_the_singular(tmp_path, monkeypatch, capsys):
    from sglang_deploy.commands import cli

    state = tmp_path / ".sglang-deploy"
    state.mkdir()
    doc = fleetreport.build("inv.py", ["h1"], None, htmlreport.read_summaries(state), {}, {}, "now")
    monkeypatch.setattr(htmlreport, "collect", lambda *a, **k: doc)
    out = tmp_path / "r.html"
    assert cli.main(["report", "inventory/testbed.py", "--out", str(out), "--no-status"]) == 0
    assert capsys.readouterr().err == f"report: {out} (1 host)\n"


def test_page_shows_the_gpu_health_verdict_and_each_finding():
    finding = {"code": "ecc-uncorrected-volatile", "severity": "fatal", "gpu": 1,
               "bus_id": "00000000:25:00.0", "message": "2 uncorrectable ECC error(s) <since>",
               "fix": "reset the GPU", "source": "nvidia-smi"}
    rows = [dict(ROWS[0], host="gpu-a", gpu_health={"verdict": "fatal", "findings": [finding]}),
            dict(ROWS[0], host="gpu-b", gpu_health=None)]
    doc = fleetreport.build("inv.py", ["gpu-a", "gpu-b"], rows, {}, {}, {}, "now")
    assert doc["hosts"][0]["status"]["gpu_health"]["verdict"] == "fatal"
    page = htmlreport.render_html(doc)
    assert '<td class="gpu-fatal" data-field="gpu_health">fatal</td>' in page
    assert '<td class="gpu-none" data-field="gpu_health">-</td>' in page
    assert ('<p class="gpu-finding gpu-fatal" data-host="gpu-a" data-code="ecc-uncorrected-volatile">'
            "gpu-a: <b>GPU health fatal</b> (GPU 1): 2 uncorrectable ECC error(s) &lt;since&gt;; "
            "fix: reset the GPU</p>") in page

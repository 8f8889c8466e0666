"""The watchdog as `status`, `status --json` and the HTML report show it: read in the host's
one state read (remote/hoststate.py --watchdog), judged by core.watchdog.status_doc."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from sglang_deploy.core import watchdog as wd
from sglang_deploy.core.hoststate import HostState, WatchdogRead

TOOL = Path(__file__).resolve().parents[2] / "sglang_deploy" / "remote" / "hoststate.py"

def doc_of(read: dict | None) -> dict | None:
    """``status_doc`` of the typed read of a host's wire-form READ."""
    return wd.status_doc(WatchdogRead.from_json(read))


ACTIVE = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}
WEDGE = {"at": 1000.0, "at_iso": "2026-12-05T10:00:00Z", "verdict": "wedged",
         "evidence": ["1-token generation failed 3 time(s) in a row"], "action": "report",
         "reason": "watchdog=report: reported only", "outcome": "reported"}


def test_the_state_read_brings_the_watchdog_state_and_last_events(tmp_path):
    from sglang_deploy.hostops.facts import SglangHostState

    events = [dict(WEDGE, at=float(i)) for i in range(30)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "state.json").write_text(json.dumps({"verdict": "healthy", "at": 29.0}))
    argv = SglangHostState.args(root=str(tmp_path), service="sglang-deploy-test-absent",
                                watchdog=str(tmp_path))
    out = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True,
                         check=True, stdin=subprocess.DEVNULL).stdout
    got = json.loads(out)["watchdog"]
    assert [e["at"] for e in got["events"]] == [float(i) for i in range(10, 30)]  # the last 20
    assert got["state"] == {"verdict": "healthy", "at": 29.0}
    assert isinstance(got["now"], float) and isinstance(got["service"], dict)


def test_without_the_option_or_the_files_the_read_says_nothing_wrong(tmp_path):
    from sglang_deploy.hostops.facts import SglangHostState

    argv = SglangHostState.args(root=str(tmp_path), service="sglang-deploy-test-absent")
    out = json.loads(subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True,
                                    text=True, check=True, stdin=subprocess.DEVNULL).stdout)
    assert out["watchdog"] is None
    argv = SglangHostState.args(root=str(tmp_path), service="x", watchdog=str(tmp_path / "no"))
    out = json.loads(subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True,
                                    text=True, check=True, stdin=subprocess.DEVNULL).stdout)
    assert out["watchdog"]["events"] == [] and out["watchdog"]["state"] is None


def test_status_doc_names_the_last_wedge_and_the_restarts_in_the_last_hour():
    restart = dict(WEDGE, at=2000.0, at_iso="2026-12-05T10:16:40Z", action="restart",
                   outcome="restarted and verified in 12.0s")
    doc = doc_of({"service": ACTIVE, "now": 2010.0, "events": [WEDGE, restart],
                         "state": {"verdict": "healthy", "at": 2005.0}})
    assert doc["unit"] == "active/running" and doc["verdict"] == "healthy"
    assert doc["restarts_last_hour"] == 1 and doc["last_event"]["action"] == "restart"
    assert doc["text"] == ("active/running, healthy 5s ago; last event 2026-12-05T10:16:40Z: "
                           "wedged -> restart (restarted and verified in 12.0s); "
                           "1 restart(s) in the last hour")
    counted = dict(restart, in_flight={"server": 3, "router": 3})
    text = doc_of({"service": ACTIVE, "now": 2010.0, "events": [counted]})["text"]
    assert ("(restarted and verified in 12.0s); 3 request(s) in flight on it when taken out "
            "(the router retries those not yet begun; a stream already begun is lost)") in text
    assert "in flight" in wd.summary_line("h1", [counted], now=2010.0)
    # a report ends nothing: no count, even if one were recorded
    assert wd.in_flight_text(dict(WEDGE, action="report", in_flight={"server": 3})) == ""
    old = doc_of({"service": ACTIVE, "now": 2000.0 + wd.HOUR_S, "events": [restart]})
    assert old["restarts_last_hour"] == 0 and "no observation yet" in old["text"]


def test_no_watchdog_installed_and_no_event_shows_nothing():
    assert doc_of(None) is None
    assert doc_of({"service": {"LoadState": "not-found"}, "events": [], "state": None}) is None
    # removed (watchdog: off) but its record kept: still shown
    gone = doc_of({"service": {"LoadState": "not-found", "ActiveState": "inactive",
                                      "SubState": "dead"}, "events": [WEDGE], "now": 1001.0})
    assert gone["unit"] == "inactive/dead" and "wedged -> report (reported)" in gone["text"]


def test_status_json_and_the_html_report_carry_it():
    from sglang_deploy.commands import htmlreport, status
    from sglang_deploy.core import fleetreport
    from sglang_deploy.integration import plan

    hs = HostState.from_json({"watchdog": {"service": ACTIVE, "now": 1001.0, "events": [WEDGE]}})
    fields = plan.status_fields(hs, None, "r1")
    assert fields["watchdog"]["last_event"]["verdict"] == "wedged"
    row = {"host": "h1", "reachable": True, "in_sync": True, "healthy": True, **fields}
    out = io.StringIO()
    status.render_watchdog([row, {"host": "h2", "watchdog": None}], out)
    assert out.getvalue() == f"h1: watchdog: {fields['watchdog']['text']}\n"
    assert "wedged -> report (reported)" in out.getvalue()
    doc = fleetreport.build("inv.py", ["h1"], [row], {}, {}, {}, "now")
    assert doc["hosts"][0]["status"]["watchdog"]["restarts_last_hour"] == 0
    page = htmlreport.render_html(doc)
    assert '<p class="watchdog" data-host="h1">h1: <b>watchdog</b>: active/running' in page

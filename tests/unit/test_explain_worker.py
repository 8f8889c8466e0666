"""A group's node of rank >= 1 never prints `The server is fired up and ready to roll!`: its
log is explained as ready (a worker) once its dummy health server started, naming its rank
and group. The log is the simulator's node 1 of a 2-node group (tp 16), paths made neutral
(tests/fixtures/logs/sim). And `lines:` shows no journal prefix on a line of its own."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_deploy.commands import cli
from sglang_deploy.controller import hostshell
from sglang_deploy.core.logs.explain import explain, render_text
from sglang_deploy.core.logs.prefix import strip_prefix

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
NODE1 = FIXTURES / "sim" / "group-node1-healthy-0.5.12.post1.log"
JOURNAL_061 = FIXTURES / "journal" / "061-ready-qwq32b-tp4-l4-ecs-04x.short-iso.log"
PREFIX = "2026-12-04T19:29:44+0000 tb2 python3[812]: "


def test_explain_log_calls_a_started_worker_ready_with_its_rank(capsys):
    assert cli.main(["explain-log", str(NODE1)]) == 0
    out = capsys.readouterr().out
    assert "outcome:     ready" in out
    assert ("role:        worker of rank 1 of its group (2 nodes, rank 0 at "
            "10.223.0.11:50000): its schedulers are ready and its dummy health server started "
            "at 10.223.0.12:30000") in out
    assert "hang" not in out


def test_logs_explain_names_the_workers_group(monkeypatch, capsys):
    journal = "".join(PREFIX + line + "\n" for line in NODE1.read_text().splitlines())
    monkeypatch.setattr(hostshell, "last_start",
                        lambda inventory, host: hostshell.LastStart(journal))
    monkeypatch.setattr(hostshell, "target",
                        lambda inventory, host: (None, {"sglang_group": "tbg1"}))
    assert cli.main(["logs", "inventory/testbed.py", "tb2", "--explain", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["outcome"], result["phase"]) == ("ready", "ready")
    assert result["worker"] == {"node_rank": 1, "nnodes": 2, "group": "tbg1",
                                "rank0_addr": "10.223.0.11:50000",
                                "health_at": "10.223.0.12:30000"}
    assert result["summary"].startswith("worker of rank 1 of group tbg1 (2 nodes, ")


def test_a_worker_whose_health_server_did_not_start_is_still_incomplete():
    lines = [x for x in NODE1.read_text().splitlines() if "Dummy health check" not in x]
    result = explain(lines)
    assert result["outcome"] == "incomplete" and result["worker"] is None


def test_lines_put_no_journal_prefix_on_a_line_of_its_own():
    result = explain(JOURNAL_061.read_text().splitlines())
    text = render_text(result)
    shown = text.split("lines:\n", 1)[1].splitlines()
    assert shown and all(strip_prefix(x[2:])[2].strip() for x in shown), shown

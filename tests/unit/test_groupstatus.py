"""Multi-node groups in `status` and the report (core/groupstatus.py, commands/status.py,
core/fleetreport.py): a group judged as one unit from its nodes' status rows, a node of rank
>= 1 judged by its unit and /health only (it serves no /v1/models), the JSON shape, the text
table, the exit status and the report's groups. No pyinfra run: rows and plan files are
written by the tests."""

from __future__ import annotations

import io
import json

import pytest

from sglang_deploy.commands import cli, htmlreport, status
from sglang_deploy.controller import hosts, runner
from sglang_deploy.core import fleetreport, groupstatus
from sglang_deploy.core.group import Group, Node
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.journal import Journal
from sglang_deploy.integration import journal, plan

# rank order differs from name order on purpose: g1's rank 0 is "b"
G1 = Group("g1", (Node("b", 0), Node("a", 1), Node("c", 2)), "10.0.0.2", 50000)
GROUPS = {"g1": G1}


def serving_row(host: str, **over) -> dict:
    """A status row of a host that serves (rank 0, or a single host)."""
    return {"host": host, "reachable": True, "preflight": "pass", "changes": [], "in_sync": True,
            "unit": "active/running", "health": 200, "models": ["glm-5"], "healthy": True, **over}


def worker_row(host: str, **over) -> dict:
    """A status row of a node of rank >= 1 that is alive: no model listed (it has no
    /v1/models), /health 200 from SGLang's dummy health server."""
    return serving_row(host, models=[], **over)


def by_name(rows) -> dict:
    return {r["host"]: r for r in rows}


# ------------------------------------------------------------------ a group's state


def test_a_group_serves_when_rank0_serves_and_every_node_is_alive():
    rows = [serving_row("b"), worker_row("a"), worker_row("c")]
    assert groupstatus.states(rows, GROUPS) == [
        {"name": "g1", "nodes": ["b", "a", "c"], "dist_init_addr": "10.0.0.2:50000",
         "state": "serving", "problem": None}]


def test_a_worker_is_not_judged_by_the_model_list():
    """No models and no "models" key at all on the workers: still serving."""
    rows = [serving_row("b"), worker_row("a"), {k: v for k, v in worker_row("c").items()
                                                 if k != "models"}]
    assert groupstatus.states(rows, GROUPS)[0]["state"] == "serving"


@pytest.mark.parametrize("over,said", [
    ({"unit": "failed/failed", "health": None}, "a (rank 1): unit failed/failed, /health no answer"),
    ({"unit": "activating/auto-restart"}, "a (rank 1): unit activating/auto-restart"),
    ({"health": 503}, "a (rank 1): /health 503"),
    ({"reachable": False, "problem": "Could not connect (timed out)\nmore"},
     "a (rank 1): Could not connect (timed out)"),
    ({"reachable": None, "problem": ""}, "a (rank 1): no result"),
    ({"preflight": "fail", "problem": "pre-flight fails: cuda-probe: cuInit 999"},
     "a (rank 1): pre-flight fails: cuda-probe: cuInit 999"),
])
def test_rank0_serving_with_a_node_not_alive_is_degraded(over, said):
    rows = [serving_row("b"), worker_row("a", **over), worker_row("c")]
    got = groupstatus.states(rows, GROUPS)[0]
    assert got["state"] == "degraded" and got["problem"] == said


def test_degraded_names_every_node_that_is_not_alive():
    rows = [serving_row("b"), worker_row("a", health=None), worker_row("c", unit="inactive/dead")]
    got = groupstatus.states(rows, GROUPS)[0]
    assert got["state"] == "degraded"
    assert got["problem"] == "a (rank 1): /health no answer; c (rank 2): unit inactive/dead"


@pytest.mark.parametrize("rank0,said", [
    (serving_row("b", health=503, healthy=False), "b (rank 0) does not serve: /health 503"),
    (serving_row("b", unit="failed/failed", health=None, healthy=False),
     "b (rank 0) does not serve: unit failed/failed, /health no answer"),
    ({"host": "b", "reachable": False, "problem": "Could not connect", "healthy": False},
     "b (rank 0) does not serve: Could not connect"),
    (None, "b (rank 0) does not serve: not looked at"),
])
def test_rank0_not_serving_is_down_even_with_every_node_alive(rank0, said):
    rows = [r for r in (rank0, worker_row("a"), worker_row("c")) if r]
    got = groupstatus.states(rows, GROUPS)[0]
    assert got["state"] == "down" and got["problem"] == said


def test_down_names_rank0_and_the_nodes_not_alive():
    rows = [serving_row("b", health=None, healthy=False), worker_row("a"),
            worker_row("c", unit="failed/failed")]
    got = groupstatus.states(rows, GROUPS)[0]
    assert got["state"] == "down"
    assert got["problem"] == ("b (rank 0) does not serve: /health no answer; "
                              "c (rank 2): unit failed/failed")


def test_a_worker_that_serves_the_full_api_is_still_only_asked_for_health():
    """A rank-1 row's `healthy` is not what decides: a worker is alive by unit and /health."""
    rows = [serving_row("b"), worker_row("a", healthy=False), worker_row("c")]
    assert groupstatus.states(rows, GROUPS)[0]["state"] == "serving"


def test_groups_without_a_node_among_the_rows_are_left_out():
    other = Group("g2", (Node("x", 0), Node("y", 1)), "10.0.0.9", 50001)
    got = groupstatus.states([serving_row("solo")], {"g1": G1, "g2": other})
    assert got == []


# ------------------------------------------------------------------ rows, order, selection


def test_rows_name_their_group_and_rank():
    rows = groupstatus.annotate([serving_row("solo"), worker_row("a"), serving_row("b")], GROUPS)
    assert [(r["host"], r["group"], r["node_rank"]) for r in rows] == [
        ("solo", None, None), ("a", "g1", 1), ("b", "g1", 0)]


def test_a_groups_nodes_stand_together_rank0_first_where_the_first_of_them_stood():
    assert groupstatus.ordered(["x", "a", "y", "c", "b", "z"], GROUPS) == ["x", "b", "a", "c", "y", "z"]
    assert groupstatus.ordered(["x", "c"], GROUPS) == ["x", "c"]  # only the names given


def test_a_selection_naming_part_of_a_group_takes_the_whole_group():
    assert groupstatus.widen(["a", "x"], GROUPS) == {"a", "b", "c", "x"}
    assert groupstatus.widen(["x"], GROUPS) == {"x"}


def test_a_worker_poll_without_v1_models_makes_a_healthy_row():
    """What the verify stage records for a rank-1 node (``plan.status_fields`` from one
    ``ServingProbe`` poll: the dummy health server answers /health 200 and /v1/models 404)
    is a healthy row with no model."""
    poll = {"service": {"ActiveState": "active", "SubState": "running"},
            "health": {"status": 200}, "models": {"status": 404, "body": '{"detail":"Not Found"}'}}
    hs = HostState.from_json({"current": "r1", "monotonic_now": 1.0, "releases": {}})
    fields = plan.status_fields(hs, poll, "r1")
    assert fields["models"] == [] and fields["health"] == 200
    ran = Journal({"a": {"plan": {"host": "a", "preflight": "pass", "changes": [], **fields}}})
    row = status.rows_from_plans(["a"], ran)[0]
    assert row["healthy"] is True and row["in_sync"] is True
    not_json = {**poll, "models": {"status": 404, "body": "404: Not Found"}}
    assert plan.status_fields(HostState.from_json({}), not_json, "r1")["models"] == []


def test_what_would_restart_a_nodes_group_is_drift():
    """A group's node records what would restart its group as ``group_wants`` (its gated
    operations are not in ``changes``): the row is not in sync, and the table says why."""
    base = {"preflight": "pass", "changes": [], "unit": "active/running", "health": 200,
            "group": "g1", "node_rank": 1, "group_nodes": ["b", "a"]}
    ran = Journal({"a": {"plan": {"host": "a", **base, "group_wants": ["a new release"]}},
                   "b": {"plan": {"host": "b", **base, "group_wants": []}}})
    rows = by_name(status.rows_from_plans(["a", "b"], ran))
    assert rows["a"]["in_sync"] is False and rows["a"]["healthy"] is True
    assert rows["b"]["in_sync"] is True
    buf = io.StringIO()
    status.render([rows["a"]], buf)
    assert buf.getvalue().splitlines()[2].endswith("1 change(s): restarts its group: a new release")


# ------------------------------------------------------------------ the command


@pytest.fixture
def inv(tmp_path) -> str:
    path = tmp_path / "inv.py"
    path.write_text("hosts = ['b', 'a', 'c', 'solo']\n")
    return str(path)


def _run_status(monkeypatch, capsys, inv, rows, *extra) -> tuple[int, str]:
    rows = groupstatus.annotate(rows, GROUPS)
    monkeypatch.setattr(status, "collect_status", lambda *a, **k: (rows, GROUPS))
    monkeypatch.setattr(status, "router_status", lambda *a, **k: None)
    code = cli.main(["status", inv, *extra])
    return code, capsys.readouterr().out


def test_status_json_shape(inv, monkeypatch, capsys):
    rows = [serving_row("b"), worker_row("a"), worker_row("c"), serving_row("solo")]
    code, out = _run_status(monkeypatch, capsys, inv, rows, "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) == {"hosts", "groups", "router"} and doc["router"] is None
    assert [(h["host"], h["group"], h["node_rank"]) for h in doc["hosts"]] == [
        ("b", "g1", 0), ("a", "g1", 1), ("c", "g1", 2), ("solo", None, None)]
    assert doc["groups"] == [{"name": "g1", "nodes": ["b", "a", "c"],
                              "dist_init_addr": "10.0.0.2:50000", "state": "serving",
                              "problem": None}]


@pytest.mark.parametrize("worker,code,state", [
    (worker_row("a"), 0, "serving"),
    (worker_row("a", health=None), 1, "degraded"),
])
def test_a_group_not_serving_fails_status_though_every_host_row_looks_fine(inv, monkeypatch,
                                                                          capsys, worker, code, state):
    """The degraded worker's row is healthy=True here on purpose: only the group fails."""
    rows = [serving_row("b"), {**worker, "healthy": True}, worker_row("c"), serving_row("solo")]
    got, out = _run_status(monkeypatch, capsys, inv, rows, "--json")
    assert got == code and json.loads(out)["groups"][0]["state"] == state


def test_status_text_shows_group_rank_and_one_line_per_group(inv, monkeypatch, capsys):
    rows = [serving_row("b", health=503, healthy=False), worker_row("a"), worker_row("c"),
            serving_row("solo")]
    code, out = _run_status(monkeypatch, capsys, inv, rows)
    lines = out.splitlines()
    assert code == 1
    assert lines[1].split()[:3] == ["host", "group", "reachable"]
    assert [ln.split()[:2] for ln in lines[2:6]] == [["b", "g1/0"], ["a", "g1/1"], ["c", "g1/2"],
                                                     ["solo", "-"]]
    assert lines[6] == ("group g1 (b, a, c; dist-init 10.0.0.2:50000): down: "
                        "b (rank 0) does not serve: /health 503")


def test_status_ok_needs_every_group_serving():
    rows = [serving_row("b")]
    assert status.ok(rows, [{"state": "serving"}], None)
    assert not status.ok(rows, [{"state": "degraded"}], None)
    assert not status.ok(rows, [{"state": "down"}], None)
    assert not status.ok(rows + [serving_row("x", in_sync=False)], [], None)


GROUP_INVENTORY = '''
_node = {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt",
         "sglang_group": "g1", "gpu_expected_count": 8, "sglang_flags": {"tp-size": 16}}
hosts = [("solo", {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt"}),
         ("n1", {**_node, "ssh_hostname": "10.0.0.5", "sglang_node_rank": 1}),
         ("n0", {**_node, "ssh_hostname": "10.0.0.4", "sglang_node_rank": 0}),
         ("other", {"sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt"})]
'''


def test_collect_status_polls_the_whole_group_of_a_limited_node_in_rank_order(tmp_path, monkeypatch):
    """`--limit n1` names one node: the dry run is asked for both nodes, rank 0 (n0, later in
    the inventory) first, and the rows carry group and rank. The data checks and pyinfra
    are stood in for (no connection)."""
    path = tmp_path / "inv.py"
    path.write_text(GROUP_INVENTORY)
    inv = hosts.load(str(path), tmp_path)

    def select(inventory, limit, data, cwd="."):
        return hosts.Selection(hosts=[h.name for h in hosts.match(inv, list(limit))],
                               all_hosts=[h.name for h in inv], inventory=inv)

    asked = {}

    def run_pyinfra(inventory, deploy_file, limit=(), spec=None, **kw):
        asked["limit"] = list(limit)
        assert spec.planning  # a plan run: each host's plan in the journal
        put = journal.Writer(spec.journal).put
        for name in limit:
            put(name, "plan", serving_row(name, models=[]))
        return runner.Run(argv=["pyinfra"], rc=0, output="", seconds=0.0)

    monkeypatch.setattr(hosts, "select", select)
    monkeypatch.setattr(runner, "run_pyinfra", run_pyinfra)
    rows, groups = status.collect_status(str(path), cwd=str(tmp_path), limit=["n1"])
    assert asked["limit"] == ["n0", "n1"]
    assert [(r["host"], r["group"], r["node_rank"]) for r in rows] == [("n0", "g1", 0), ("n1", "g1", 1)]
    assert groupstatus.states(rows, groups) == [
        {"name": "g1", "nodes": ["n0", "n1"], "dist_init_addr": "10.0.0.4:50000",
         "state": "serving", "problem": None}]


# ------------------------------------------------------------------ the report


def test_report_shows_a_group_as_a_unit():
    order = groupstatus.ordered(["solo", "a", "b", "c"], GROUPS)
    rows = groupstatus.annotate([serving_row("solo"), worker_row("a", unit="failed/failed"),
                                 serving_row("b"), worker_row("c")], GROUPS)
    doc = fleetreport.build("inv.py", order, rows, {}, {}, {}, "now", GROUPS)
    assert [(h["host"], h["group"], h["node_rank"]) for h in doc["hosts"]] == [
        ("solo", None, None), ("b", "g1", 0), ("a", "g1", 1), ("c", "g1", 2)]
    assert doc["groups"] == [{"name": "g1", "nodes": ["b", "a", "c"],
                              "dist_init_addr": "10.0.0.2:50000", "state": "degraded",
                              "problem": "a (rank 1): unit failed/failed"}]
    page = htmlreport.render_html(doc)
    assert '<tr data-group="g1">' in page and 'class="state-degraded">degraded<' in page
    assert '<td data-field="group">g1/1</td>' in page and '<td data-field="group">-</td>' in page
    assert page.index('id="host-b"') < page.index('id="host-a"') < page.index('id="host-c"')
    json.dumps(doc)


def test_report_without_status_knows_its_groups_but_not_their_state():
    doc = fleetreport.build("inv.py", ["b", "a", "c"], None, {}, {}, {}, "now", GROUPS)
    assert doc["groups"][0]["state"] == "unknown" and doc["groups"][0]["nodes"] == ["b", "a", "c"]
    assert doc["hosts"][0]["group"] == "g1" and doc["hosts"][0]["node_rank"] == 0


def test_report_without_groups_has_none():
    doc = fleetreport.build("inv.py", ["solo"], [serving_row("solo")], {}, {}, {}, "now")
    assert doc["groups"] == [] and doc["hosts"][0]["group"] is None
    assert 'id="groups"' not in htmlreport.render_html(doc)

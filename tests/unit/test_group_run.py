"""A multi-node group in one pyinfra run, whatever the pool size and the order of its nodes:
every node prepares the same operations, the group's decision is the same on every node,
the pre-flight and the verification as one never wait for another host's operation and
judge the same whatever order the nodes run in, the run's shared results live in its run object
(released at the end), and the modes that split a group are refused before connecting."""

from __future__ import annotations

import itertools
import subprocess
from types import SimpleNamespace

import pytest
import runobj
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state
from test_pyinfra_guards import NOWHERE, pyinfra

from sglang_deploy.core import group
from sglang_deploy.core import restart as restart_mod
from sglang_deploy.core.errors import GroupPreflightError, UsageError, VerifyError
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.integration import hooks, integration
from sglang_deploy.stages.group import groupops, groupstage

G = group.Group("g1", (group.Node("n0", 0), group.Node("n1", 1)), "10.0.0.10", 50000)
RUNNING = HostState.from_json({"service": {"ActiveState": "active", "SubState": "running"},
                               "last_verified": {"invocation": "x"}})


def _card(node: str) -> dict:
    return group.card(node, G.rank_of(node), "rel1", {"tp-size": 16}, "580.65.06")


def _prepare(order: list[str], restart: bool) -> tuple[State, dict]:
    """Each node of G prepared in ORDER with the group's decision (RESTART), as deploy.py's
    stages add a group node's operations; returns the state and each node's operation names
    in order."""
    inventory = Inventory(([("n0", {}), ("n1", {})], {}))
    state = State(inventory, Config())
    runobj.start(state)
    unit = (restart_mod.Reason("unit", "unit changed"),) if restart else ()
    decision = restart_mod.GroupDecision(
        ("n0", "n1"), {"n0": restart_mod.Decision(), "n1": restart_mod.Decision(reasons=unit)},
        {"n0": True, "n1": True})
    cards = {n: _card(n) for n in G.members()}
    with ctx_state.use(state):
        for name in order:
            node = inventory.get_host(name)
            with ctx_host.use(node):
                run = groupops.run_of(state, G)
                if decision.restart:
                    groupstage.add_preflight(run, decision, cards, "/srv/tools/rendezvous.py",
                                             "/usr/bin/python3")
                    groupstage.add_restart(run, "sglang", "restarts as one", "Start sglang")
                    groupstage.add_verify_as_one(run, "sglang", lambda w: {}, lambda s: None,
                                                 "")
    names = {}
    for name in ("n0", "n1"):
        node = inventory.get_host(name)
        names[name] = [sorted(state.get_op_meta(h).names)[0] for h in state.get_op_order()
                       if h in state.ops[node]]
    return state, names


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_every_node_adds_the_same_operations_whatever_order_the_nodes_are_prepared_in(order):
    state, names = _prepare(order, restart=True)
    assert names["n0"] == names["n1"] and len(names["n0"]) == 8, names
    for node in ("n0", "n1"):   # static conditions: the group's decision, made while preparing
        conds = [state.ops[state.inventory.get_host(node)][h].global_arguments["_if"]
                 for h in state.get_op_order()]
        assert all(isinstance(c, groupops.Decided) and c.group_gate for c in conds)
        assert [c() for c in conds[:5]] == [True] * 5   # rendezvous, stop and start: all
    _, quiet = _prepare(order, restart=False)
    assert quiet == {"n0": [], "n1": []}


def test_the_same_state_is_one_run_and_a_new_state_a_new_one():
    a, _ = _prepare(["n0", "n1"], restart=True)
    b, _ = _prepare(["n0", "n1"], restart=True)
    assert groupops.run_of(a, G) is groupops.run_of(a, G)
    assert groupops.run_of(a, G) is not groupops.run_of(b, G)
    assert integration.run_of(a).groups.of(G) is groupops.run_of(a, G)  # the run object's
    integration.release_run(a)
    with pytest.raises(UsageError):  # the run ended: its groups' runs with it
        groupops.run_of(a, G)


class FakeHost:
    """A node's host: its commands recorded, each answered by ANSWER(command)."""

    def __init__(self, name: str, answer=lambda cmd: ""):
        self.name, self.print_prefix, self.answer, self.commands = name, f"[{name}] ", answer, []

    def run_shell_command(self, command, print_output=False):
        self.commands.append(command)
        return True, SimpleNamespace(stdout=self.answer(command), stderr="")


def _as(monkeypatch, fake: FakeHost) -> FakeHost:
    monkeypatch.setattr(groupops, "host", fake)
    return fake


def _results() -> dict:
    return {"n0": {"ok": True, "ports": {"50000": {"error": None, "peers": [{}]},
                                         "40000": {"error": None, "peers": [{}]}}},
            "n1": {"ok": True, "ports": {
                "50000": {"error": None, "offset_s": 0.1, "attempts": 1},
                "40000": {"error": None, "offset_s": 0.1, "attempts": 1}}}}


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_the_rendezvous_collects_on_its_own_host_and_judges_once_every_node_collected(
        monkeypatch, order):
    import json

    run = groupops.GroupRun(G, 40000)
    cards = {n: _card(n) for n in ("n0", "n1")}
    for n in order:  # one operation: each node waits for its own result file only
        fake = _as(monkeypatch, FakeHost(n, lambda cmd, n=n: json.dumps(_results()[n])))
        groupops.rendezvous_collect(run)
        assert fake.commands and run.result_file(n) in fake.commands[0]
        assert all(other not in run.result_file(n) for other in ("n0", "n1"))
    for n in order:  # the next operation: each node judges, the same verdict on every node
        _as(monkeypatch, FakeHost(n))
        groupops.rendezvous_judge(run, cards, True)
    # each node appended its own result, once; the judges kept nothing beside them
    assert sorted((o.node, o.kind) for o in run.results.log()) == [
        ("n0", group.RENDEZVOUS), ("n1", group.RENDEZVOUS)]


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_a_node_without_a_result_fails_the_preflight_on_every_node(monkeypatch, order):
    run = groupops.GroupRun(G, 40000)
    cards = {n: _card(n) for n in ("n0", "n1")}
    _as(monkeypatch, FakeHost("n0", lambda cmd: '{"ok": true, "ports": {}}'))
    groupops.rendezvous_collect(run)
    _as(monkeypatch, FakeHost("n1", lambda cmd: ""))   # gave nothing by its deadline
    groupops.rendezvous_collect(run)
    texts = []
    for n in order:
        _as(monkeypatch, FakeHost(n))
        with pytest.raises(GroupPreflightError, match="n1 <-> n0: the node gave no rendezvous"
                           ) as exc:
            groupops.rendezvous_judge(run, cards, True)
        texts.append(str(exc.value))
    assert texts[0] == texts[1]   # judged by each node for itself, the same
    assert [(o.node, o.value) for o in run.results.log()][1] == ("n1", None)


def test_the_rendezvous_start_only_starts_the_tool_in_the_background():
    cmd = groupops.collect_command("/run/sglang-deploy/rendezvous-x-1.json", 45)
    assert "test -s /run/sglang-deploy/rendezvous-x-1.json" in cmd and "45" in cmd


def _verify(ok: dict[str, bool], seen: list[str]):
    def verify(watch):
        stop = watch.abort()
        if stop is not None:
            raise stop
        seen.append(watch.node)
        if not ok[watch.node]:
            raise VerifyError(what="x", found="the server exited in phase `capture`", fix="f")
        return {"host": watch.node}
    return verify


@pytest.mark.parametrize("order", list(itertools.permutations(["n0", "n1"])))
@pytest.mark.parametrize("failing", [None, "n0", "n1"])
def test_verified_as_one_in_any_order_every_node_or_none(monkeypatch, order, failing):
    """The nodes' verifications in any order (a pool of one runs them one by one): a failure
    stops the failing node, any node verified after it stops without polling, and the
    group's verdict on every node is the same: all recorded, or all stopped and failed."""
    run = groupops.GroupRun(G, 40000)
    seen: list[str] = []
    verify = _verify({"n0": failing != "n0", "n1": failing != "n1"}, seen)
    hosts = {n: FakeHost(n) for n in G.members()}
    for n in order:
        _as(monkeypatch, hosts[n])
        groupops.verify_node(run, "sglang", verify)   # never raises: judged as one next
    recorded = []
    errors = {}
    for n in order:
        _as(monkeypatch, hosts[n])
        try:
            groupops.group_ready(run, "sglang", recorded.append)
        except VerifyError as exc:
            errors[n] = exc
    if failing is None:
        assert recorded == [{"host": n} for n in order] and not errors
        assert not any("stop" in c for h in hosts.values() for c in h.commands)
        return
    assert recorded == [] and set(errors) == {"n0", "n1"}
    assert all(any("systemctl stop sglang.service" in c for c in h.commands)
               for h in hosts.values())
    other = next(n for n in G.members() if n != failing)
    assert "phase `capture`" in errors[failing].found
    assert f"node {failing} failed" in errors[other].found
    assert f"{other} was stopped with the group" in errors[other].found
    if order[0] == failing:  # known before the other node's turn: it never polls
        assert seen == [failing]


def _group_inventory(tmp_path, extra: str = "") -> str:
    path = tmp_path / "inv.py"
    path.write_text(f'''
_data = {{**{NOWHERE!r}, "sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt",
         "sglang_group": "g1", "sglang_flags": {{"tp-size": 16}}{extra}}}
gpu_hosts = ([("gpu-node-1", _data), ("gpu-node-2", _data)], {{}})
''')
    return str(path)


@pytest.mark.parametrize("flag", ["--serial", "--no-wait"])
def test_modes_that_split_a_group_are_refused_before_connecting(tmp_path, flag):
    r = pyinfra(tmp_path, _group_inventory(tmp_path), "deploy.py", flag)
    assert r.returncode != 0
    assert f"no {flag} for a selection with a multi-node group (group g1" in r.both, r.both[-2000:]
    assert f"drop {flag}" in r.both
    assert "Connecting to hosts" not in r.both


def test_any_pool_size_works_for_a_group_its_all_reduce_check_included():
    inventory = [SimpleNamespace(name=h) for h in "abc"]
    for check in (True, False):
        resolved = {h: SimpleNamespace(sglang_group="g1", gpu_allreduce_check=check)
                    for h in "ab"}
        hooks.check_group_modes(inventory, resolved, None, {"parallel": 1})   # no wait
    with pytest.raises(Exception, match="no --serial"):
        hooks.check_group_modes(inventory, resolved, None, {"serial": True})


def test_the_rendezvous_tool_writes_its_result_whole_to_a_file(tmp_path):
    import json
    import sys

    from sglang_deploy.remote import rendezvous

    out = tmp_path / "r.json"
    rc = subprocess.run([sys.executable, rendezvous.__file__, "listen", "--bind", "127.0.0.1",
                         "--port", "0", "--peers", "0", "--card", "{}", "--timeout", "1",
                         "--out", str(out)], capture_output=True, text=True, timeout=30)
    assert rc.stdout == "" and json.loads(out.read_text())["ok"] is True
    assert not (tmp_path / "r.json.tmp").exists()

"""A multi-node group's decision, made once per run while its nodes are prepared
(``core.restart``, ``stages.group.groupprep``) from every node's facts (each fact read once per run,
whichever node asks first): the same decision whatever order pyinfra prepares the nodes in,
and the same operations with static conditions on every node; a node restarted only because
its peer changed gets the JIT check, the release smoke and the P2P retest (after the group's
stop) all the same."""

from __future__ import annotations

import collections
import copy

import pytest
import runobj
from pyinfra.api import Config, Inventory, State
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from sglang_deploy.controller import routing
from sglang_deploy.core import gpuhealth, hostplan, preflight, restart, watchdogunit
from sglang_deploy.core.errors import GroupPreflightError
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.restart import Facts as NodeFacts
from sglang_deploy.core.restart import Wanted
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.core.service import Layout
from sglang_deploy.hostops.facts import Snapshot
from sglang_deploy.integration import integration, plan
from sglang_deploy.stages import stages, staging
from sglang_deploy.stages.group import groupops, groupprep

RELEASE = ("rel1", "0.5.12.post1", "sglang==0.5.12.post1\n")
DATA = {"ssh_hostname": "10.0.0.10", "sglang_model_path": "/srv/models/m",
        "sglang_lock": "locks/testbed.txt", "sglang_group": "g1",
        "sglang_flags": {"tp-size": 16}, "verify_converged": True}


# ------------------------------------------------------------------ pure
U, S = restart.sha256_text("u1"), restart.sha256_text("s1")


def test_a_nodes_reasons_come_from_its_own_state_and_what_this_run_renders():
    want = Wanted("u1", "s1", "rel1")
    serving = NodeFacts(unit_sha256=U, secrets_sha256=S, active=True, up=True)
    assert restart.decide(serving, want, group=True).names == []
    assert restart.decide(serving, Wanted("u2", "s1", "rel1"), group=True).names == ["unit"]
    stopped = NodeFacts(unit_sha256=U, secrets_sha256="s0")
    assert restart.decide(stopped, Wanted("u1", "s1", "rel1", changing=("release", "model")),
                          group=True).names == ["secrets", "release", "model", "not running"]
    unverified = NodeFacts(unit_sha256=U, secrets_sha256=S, active=True, up=True,
                           unverified=True)
    assert restart.decide(unverified, want, group=True).names == ["running, never verified"]


def test_the_group_restarts_when_any_node_has_a_reason():
    ok = NodeFacts(unit_sha256=U, secrets_sha256=S, active=True, up=True)
    want = {"n0": Wanted("u1", "s1", "rel1", p2p_skipped=True), "n1": Wanted("u1", "s1", "rel1")}
    quiet = restart.decide_group(["n0", "n1"], {"n0": ok, "n1": ok}, want)
    assert not quiet.restart and quiet.texts() == [] and not quiet.retest("n0")
    changed = restart.decide_group(["n0", "n1"], {"n0": ok, "n1": ok},
                                   {**want, "n1": Wanted("u2", "s1", "rel1")})
    assert changed.restart and changed.texts() == ["n1: unit"] and changed.own("n0") == ()
    # n0 restarts because its peer changed, and says so; its copies were skipped: retested
    assert [r.name for r in changed.of("n0")] == [restart.PEER]
    assert changed.of("n0")[0].text == "peer changed: n1 (unit changed)"
    assert changed.retest("n0") and not changed.retest("n1")
    rb = restart.rollback_group(["n0", "n1"], {"n0": False, "n1": True},
                                {"n0": True, "n1": True})
    assert rb.restart and rb.texts() == ["n1: known-good restored"]


# ------------------------------------------------------------------ prepared in pyinfra
def _hoststate(s, secrets_sha256: str | None) -> dict:
    lay = Layout.of(s)
    return {"service": {"ActiveState": "active", "SubState": "running", "InvocationID": "inv",
                        "UnitFileState": "enabled"},
            "last_verified": {"invocation": "inv"},
            "p2p_verified": {"gpus": 8, "policy": "require", "nccl_env": {}},
            "paths": {lay.unit_file: {"kind": "file", "mode": "644", "owner": "root",
                                      "group": "root", "sha256": None},
                      lay.current: {"kind": "link", "target": lay.release_dir(RELEASE[0])},
                      # the watchdog's files, reported absent by the same read
                      **dict.fromkeys(watchdogunit.managed_paths(s.sglang_root))},
            "releases": {
                RELEASE[0]: {"complete": True, "patch": None}},
            "python": "3.11", "secrets_sha256": secrets_sha256, "route_dev": "eth0",
            "model": None, "users": ["sglang"]}


class Facts:
    """Each node's facts, every read counted (host, fact)."""

    def __init__(self, states: dict[str, dict]):
        self.states, self.reads = states, collections.Counter()

    def get_fact(self, h, cls, *args, **kwargs):
        self.reads[(h.name, cls.__name__)] += 1
        if cls.__name__ == "HostSnapshot":
            return Snapshot(state=HostState.from_json(copy.deepcopy(self.states[h.name])),
                            gpu={}, output="")
        if cls.__name__ == "PatchStatus":
            return {"state": "already-applied", "file": "x.py"}
        raise AssertionError(f"unexpected fact {cls.__name__} on {h.name}")


def _state(monkeypatch, changed: str | None) -> tuple[State, Facts]:
    """A run of two nodes n0, n1 of group g1, both serving their converged configuration
    except CHANGED (new secrets)."""
    inventory = Inventory(([("n0", dict(DATA)), ("n1", {**DATA, "ssh_hostname": "10.0.0.11"})],
                           {}))
    state = State(inventory, Config())
    fleet = routing.fleet_of(inventory)
    runobj.start(state, RunSpec(), fleet=fleet)  # a deploy
    for h in inventory:
        state.activate_host(h)
        h.connected = True
    states = {h.name: _hoststate(fleet.settings(h.name), "s-old") for h in inventory}
    facts = Facts(states)
    monkeypatch.setattr(Host, "get_fact", lambda self, cls, *a, **k: facts.get_fact(
        self, cls, *a, **k))
    state.current_stage = StateStage.Prepare
    with ctx_state.use(state):
        for h in inventory:  # the units and secrets each node runs: converged
            s = fleet.settings(h.name)
            with ctx_host.use(h):
                wanted = groupprep.node_view(h, s, fleet.group("g1"), RELEASE).wanted()
            states[h.name]["paths"][Layout.of(s).unit_file]["sha256"] = \
                restart.sha256_text(wanted.unit_text)
            states[h.name]["secrets_sha256"] = restart.sha256_text(wanted.secrets_text)
    if changed is not None:
        states[changed]["secrets_sha256"] = "s-old"
    integration.release_run(state)  # a new run: its own groups' runs and reads
    runobj.start(state, RunSpec(), fleet=fleet)
    facts.reads.clear()
    return state, facts


def _plan(state, name: str) -> hostplan.HostPlan:
    """NAME's plan as its pre-flight and runtime stages hand it to the service stage
    (``hostplan.plan`` from its facts: it serves the invocation it was verified with, so no
    probe was read; the patch already applied)."""
    fleet = integration.run_of(state).fleet
    s = fleet.settings(name)
    snap = groupprep.snapshot(state.inventory.get_host(name), s, RELEASE[0])
    return hostplan.plan(s, RELEASE, snap.state, snap.gpu, None, group=fleet.group_of(name),
                         read_only=plan.read_only()).with_patch(
        {"state": "already-applied", "file": "x.py"})


def _prepare(monkeypatch, order: list[str], changed: str | None, read_only: bool = False,
             views: collections.Counter | None = None):
    """Each node's service and verify stages prepared in ORDER, from its plan; returns the
    state, each node's (operation name, condition) in order, what ran while preparing, and the
    reads. VIEWS counts, while the stages are prepared, each node's view
    (``groupprep.node_view``) and each GPU health judged (``gpuhealth.evaluate``)."""
    state, facts = _state(monkeypatch, changed)
    monkeypatch.setattr(plan, "read_only", lambda: read_only)
    with ctx_state.use(state):
        plans = {name: _plan(state, name) for name in order}
    seen: dict[str, list[str]] = collections.defaultdict(list)
    if views is not None:
        real_view, real_evaluate = groupprep.node_view, gpuhealth.evaluate

        def node_view(h, *a, **k):
            views["view", h.name] += 1
            return real_view(h, *a, **k)

        def evaluate(*a, **k):
            views["gpu health"] += 1
            return real_evaluate(*a, **k)

        monkeypatch.setattr(groupprep, "node_view", node_view)
        monkeypatch.setattr(gpuhealth, "evaluate", evaluate)

    def checks(hp, unit_text, reasons, gate=None):
        seen[_host_name()].append(f"checks {gate['_if']!r}")
        return real_checks(hp, unit_text, reasons, gate)

    real_checks = staging.checks_before_start
    monkeypatch.setattr(staging, "checks_before_start", checks)
    monkeypatch.setattr(stages, "launch_flags_checked", lambda hp: None)
    with ctx_state.use(state):
        for name in order:
            with ctx_host.use(state.inventory.get_host(name)):
                hp = stages.service_stage.__wrapped__.__wrapped__(plans[name])
                assert hp is not plans[name] and hp.restart is not None  # a new plan
                stages.verify_stage.__wrapped__.__wrapped__(hp)
    ops = {}
    for name in ("n0", "n1"):
        h = state.inventory.get_host(name)
        ops[name] = [(min(state.get_op_meta(o).names),
                      repr(state.ops[h][o].global_arguments.get("_if")))
                     for o in state.get_op_order() if o in state.ops[h]]
    return state, ops, seen, facts


def _before_watchdog(node_ops: list) -> list:
    """A node's operations before the watchdog's (the verify stage's last)."""
    return node_ops[:next(i for i, (name, _) in enumerate(node_ops) if name.startswith("Watchdog "))]


def _host_name() -> str:
    from pyinfra import host
    return host.name


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_every_node_makes_the_same_decision_and_adds_the_same_operations_in_any_order(
        monkeypatch, order):
    _, ops, seen, facts = _prepare(monkeypatch, order, changed="n1")
    _, other, _, _ = _prepare(monkeypatch, list(reversed(order)), changed="n1")
    names = {n: [name for name, _ in ops[n]] for n in ops}
    head = {n: _before_watchdog(ops[n]) for n in ops}
    # the same operations, in the same order, on both nodes and in both orders, up to the
    # watchdog's: the verify stage's last, which wait on nothing on any host (rank 0 installs
    # the group's watchdog, node 1 removes any; stages/watchdogstage.py)
    assert [x for x, _ in head["n0"]] == [x for x, _ in head["n1"]] == \
        [x for x, _ in _before_watchdog(other["n0"])]
    assert [c for x, c in head["n0"] if "Verify group" not in x] == \
        [c for x, c in head["n1"] if "Verify group" not in x]
    assert names["n1"][len(head["n1"]):] == [
        "Watchdog removed (node 1 of group g1: rank 0's watchdog judges the group)"]
    tail0 = names["n0"][len(head["n0"]):]  # (its first op is node 1's removal too: same place)
    assert {"Unit /etc/systemd/system/sglang-watchdog.service", "Enable sglang-watchdog"} <= \
        set(tail0), tail0
    assert ops == other
    joined = "\n".join(names["n0"])
    for step in ("rendezvous of group g1 started", "rendezvous result", "judged",
                 "Stop sglang: group g1 restarts as one", "Start sglang with group g1",
                 "rank 0 serves", "ready as one", "JIT toolchain", "Release smoke"):
        assert step in joined, joined
    # static conditions: the group's decision, made while preparing (no shared registration)
    group_ops = [c for n in ops for name, c in head[n]
                 if "group g1" in name or "JIT" in name or "smoke" in name]
    assert group_ops and set(group_ops) <= {"Decided(True)", "Decided(False)"}, group_ops
    verify = {n: [c for name, c in ops[n] if "Verify group" in name] for n in ops}
    assert verify["n0"] == ["Decided(False)", "Decided(True)", "Decided(True)"]  # rank 0
    assert verify["n1"] == ["Decided(True)", "Decided(False)", "Decided(True)"]  # a worker
    # n0 changed nothing itself: restarted only because n1 did, it is checked, and retested
    # once the group has stopped (an operation: nothing runs while the nodes are prepared)
    assert "checks Decided(True)" in seen["n0"]
    for node in ("n0", "n1"):
        order = [name for name, _ in ops[node]]
        retest = next(i for i, n in enumerate(order) if preflight.RETEST_NOTE in n)
        assert order.index("Stop sglang: group g1 restarts as one") < retest \
            < order.index("Start sglang with group g1")
        assert ops[node][retest][1] == "Decided(True)"
    # each node's facts read once in the whole preparation, whichever node asked first
    assert facts.reads == {(n, f): 1 for n in ("n0", "n1") for f in ("HostSnapshot",
                                                                     "PatchStatus")}


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_each_nodes_view_is_computed_once_in_the_whole_preparation(monkeypatch, order):
    """No node computes its peers' views again (N views for N nodes, not N x N): the
    first node prepared makes the group's decision from each node's view and judges each
    node's GPU health once; the other node gets that very decision."""
    views: collections.Counter = collections.Counter()
    state, ops, _, _ = _prepare(monkeypatch, order, changed="n1", views=views)
    # each node's GPU health judged once, with its view (its plan: ``hostplan.plan``); n1's
    # once more by its own gate (``gpugate.before_start``: a reason of its own), as a single
    # host's
    assert views == {("view", "n0"): 1, ("view", "n1"): 1, "gpu health": 2 + 1}
    assert any("Stop sglang: group g1 restarts as one" in name for name, _ in ops["n0"])
    g = integration.run_of(state).fleet.group("g1")
    prepared = groupops.run_of(state, g).decision.get(lambda: pytest.fail("made again"))
    assert prepared.decision.texts() == ["n1: secrets"] and prepared.fatal == ()


def test_a_read_only_run_plans_the_real_runs_operations_on_every_node(monkeypatch):
    _, ops, _, _ = _prepare(monkeypatch, ["n0", "n1"], changed="n1", read_only=True)
    _, real, _, _ = _prepare(monkeypatch, ["n0", "n1"], changed="n1")
    assert ops == real
    retest = [(name, c) for name, c in ops["n0"] if preflight.RETEST_NOTE in name]
    assert retest and retest[0][1] == "Decided(True)"   # static: the group restarts


@pytest.mark.parametrize("order", [["n0", "n1"], ["n1", "n0"]])
def test_a_converged_group_adds_no_restart_on_any_node(monkeypatch, order):
    _, ops, seen, _ = _prepare(monkeypatch, order, changed=None)
    for node in ("n0", "n1"):
        names = [name for name, _ in ops[node]]
        assert not any("Stop sglang" in n or "rendezvous" in n or "smoke" in n for n in names)
        assert any("Verify the running node (group g1, not restarted)" in n for n in names)
    assert not seen


def test_a_peer_that_is_not_connected_fails_the_node_with_the_fix(monkeypatch):
    state, _ = _state(monkeypatch, changed=None)
    state.inventory.get_host("n1").connected = False
    with ctx_state.use(state), ctx_host.use(state.inventory.get_host("n0")), \
            pytest.raises(GroupPreflightError, match="n1 is not connected") as exc:
        groupprep.decide(state, integration.run_of(state).fleet.group("g1"), RELEASE)
    assert "--exclude" in exc.value.fix


def test_the_groups_decision_is_made_once_per_run(monkeypatch):
    """The first node prepared decides for the group; the second gets that very decision,
    no node's facts read again."""
    state, facts = _state(monkeypatch, changed="n1")
    g = integration.run_of(state).fleet.group("g1")
    made = []
    for name in ("n1", "n0"):
        with ctx_state.use(state), ctx_host.use(state.inventory.get_host(name)):
            made.append(groupprep.decide(state, g, RELEASE))
    assert made[0] is made[1] and made[0].decision.texts() == ["n1: secrets"]
    assert set(made[0].cards) == {"n0", "n1"} and made[0].fatal == ()
    assert facts.reads == {(n, f): 1 for n in ("n0", "n1") for f in ("HostSnapshot",
                                                                     "PatchStatus")}


def test_a_rollback_decides_the_same_on_every_node_from_every_nodes_state(monkeypatch):
    """n1 runs another unit than its known-good one: the group goes back as one, decided
    the same on n0 (nothing of its own to restore), each node's state read once."""
    state, _ = _state(monkeypatch, changed=None)
    kg = {"record": {"release": "rel0"}, "unit_sha256": "u0", "secrets_sha256": None}
    hs = {n: {"known_good": kg, "releases": {"rel0": {"complete": True}}, "current": "rel0",
              "unit_sha256": "u0" if n == "n0" else "u-new", "secrets_sha256": None,
              "service": {"ActiveState": "active", "SubState": "running"}}
          for n in ("n0", "n1")}
    reads = collections.Counter()

    def get_fact(self, cls, *a, **k):
        reads[self.name, cls.__name__] += 1
        return HostState.from_json(copy.deepcopy(hs[self.name]))

    monkeypatch.setattr(Host, "get_fact", get_fact)
    g = integration.run_of(state).fleet.group("g1")
    decisions = []
    for name in ("n1", "n0"):
        with ctx_state.use(state), ctx_host.use(state.inventory.get_host(name)):
            decisions.append(groupprep.decide_rollback(state, g))
    assert decisions[0] is decisions[1]  # made once, by the first node prepared
    decision, cards = decisions[0].decision, decisions[0].cards
    assert decision.restart and decision.texts() == ["n1: known-good restored"]
    assert {c["release"] for c in cards.values()} == {"rel0"}
    assert reads == {("n0", "SglangHostState"): 1, ("n1", "SglangHostState"): 1}

"""A multi-node group in one run (pure and controller-side parts): the rendezvous verdict, the
rendezvous command, the worker's readiness, the group's start decision, fail-fast between the
nodes' verifications, the plan's drift, and the rollout's units."""

from __future__ import annotations

import pytest

from sglang_deploy.core import group
from sglang_deploy.core.errors import VerifyError
from sglang_deploy.core.verify import Verifier, check_serving
from sglang_deploy.stages.group import groupops


def _group(n: int = 2) -> group.Group:
    return group.Group("g1", tuple(group.Node(f"n{i}", i) for i in range(n)), "10.0.0.10", 50000)


def _cards(**over) -> dict:
    base = {f"n{i}": group.card(f"n{i}", i, "rel1", {"tp-size": 16, "node-rank": i,
                                                      "host": f"10.0.0.{10 + i}"}, "580.65.06")
            for i in range(2)}
    for node, changes in over.items():
        base[node] = {**base[node], **changes}
    return base


def _ok_results(probe: int = 40000, offset: float = 0.1) -> dict:
    return {"n0": {"ok": True, "ports": {"50000": {"error": None, "peers": [{}]},
                                         str(probe): {"error": None, "peers": [{}]}}},
            "n1": {"ok": True, "ports": {
                "50000": {"error": None, "card": {}, "offset_s": offset, "attempts": 1},
                str(probe): {"error": None, "card": {}, "offset_s": offset, "attempts": 1}}}}


def test_cards_of_a_groups_nodes_agree_whatever_their_rank_and_bind_address():
    cards = _cards()
    assert cards["n0"]["flags"] == cards["n1"]["flags"]
    other = group.card("n1", 1, "rel1", {"tp-size": 8, "node-rank": 1}, "580.65.06")
    assert other["flags"] != cards["n1"]["flags"]


def test_a_rendezvous_that_passed_has_no_problem():
    assert group.judge_rendezvous(_group(), _ok_results(), _cards()) == []


def test_a_blocked_dist_init_port_names_the_node_pair_the_port_and_the_firewall_fix():
    results = _ok_results()
    results["n1"]["ports"]["50000"] = {"error": "timeout", "card": None, "attempts": 12}
    [p] = group.judge_rendezvous(_group(), results, _cards())
    assert p.nodes == ("n1", "n0")
    assert "10.0.0.10:50000" in p.message and "--dist-init-addr" in p.message
    assert "open TCP 50000 on n0" in p.fix


def test_nccls_port_range_and_clock_skew_and_different_releases_are_each_named():
    results = _ok_results(offset=9.0)
    results["n1"]["ports"]["40000"] = {"error": "refused", "card": None, "attempts": 3}
    problems = group.judge_rendezvous(_group(), results, _cards(n1={"release": "rel2",
                                                                    "driver": "575.1"}))
    text = "\n".join(p.text() for p in problems)
    assert "releases differ: n1 has 'rel2', n0 has 'rel1'" in text
    assert "NVIDIA driver versions differ" in text
    assert "40000 (NCCL's bootstrap port range" in text and "refused" in text
    assert "clocks differ by 9.0s" in text


def test_a_node_without_result_and_rank0_that_cannot_listen_are_named():
    results = {"n0": {"ok": False, "ports": {"50000": {"error": "in use", "peers": []}}},
               "n1": None}
    text = "\n".join(p.text() for p in group.judge_rendezvous(_group(), results, _cards()))
    assert "rank 0 cannot listen on 10.0.0.10:50000: in use" in text
    assert "n1 <-> n0: the node gave no rendezvous result" in text


def test_the_rendezvous_command_only_reaches_the_dist_init_port_and_swaps_cards_on_the_probe():
    g = _group()
    r0 = group.rendezvous_argv(g, "n0", "/t/rendezvous.py", {"node": "n0"}, 40000)
    assert r0[2:7] == ["listen", "--bind", "10.0.0.10", "--peers", "1"]
    n1 = group.rendezvous_argv(g, "n1", "/t/rendezvous.py", {"node": "n1"}, 40000)
    assert n1[2:5] == ["connect", "--addr", "10.0.0.10"]
    for argv in (r0, n1):
        assert argv[argv.index("--reach") + 1] == "50000"
        assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == "40000"


def test_rank_0s_dist_init_port_in_use_is_its_own_server_only_while_its_unit_runs():
    results = _ok_results()
    results["n0"]["ports"]["50000"] = {"error": "in use", "peers": []}
    assert group.judge_rendezvous(_group(), results, _cards(), rank0_running=True) == []
    [p] = group.judge_rendezvous(_group(), results, _cards(), rank0_running=False)
    assert "rank 0 cannot listen on 10.0.0.10:50000: in use" in p.text()


def test_the_probe_port_is_in_the_ephemeral_range_and_never_the_dist_init_port():
    g = _group()
    lo, hi = group.EPHEMERAL
    assert all(lo <= group.probe_port(g, seed) <= hi for seed in range(0, 10**6, 997))
    assert group.probe_port(g, g.port - lo) != g.port


def _verifier(**kw) -> Verifier:
    return Verifier(sglang_version="0.5.12.post1", expect_autotune=False, cuda_graph=False,
                    served_model_name="glm-5", overall_timeout_s=600,
                    phase_timeouts={"starting": 60}, **kw)


def _poll(now: float, health: int | None, state: str = "active") -> dict:
    return {"now": now, "service": {"ActiveState": state, "SubState": "running",
                                    "InvocationID": "inv1"},
            "journal": [], "health": {"status": health} if health else None}


def test_a_worker_is_up_on_health_200_without_the_ready_line_or_the_api():
    v = _verifier(worker=True)
    assert v.wants_http()
    assert v.observe(_poll(0.0, None)).kind == "wait"
    d = v.observe(_poll(3.0, 200))
    assert d.kind == "ready" and "/health 200" in d.message and d.details["invocation"] == "inv1"
    # the same poll does not make a single server ready: it waits for the log's ready line
    assert _verifier().observe(_poll(3.0, 200)).kind == "wait"


def test_a_worker_that_exits_fails_like_a_server():
    v = _verifier(worker=True)
    v.observe(_poll(0.0, None))
    assert v.observe(_poll(1.0, None, state="failed")).kind == "fail"


def test_a_running_worker_is_judged_by_its_unit_and_health_not_by_v1_models():
    poll = {"service": {"ActiveState": "active", "SubState": "running"},
            "health": {"status": 200}, "models": {"status": 404, "body": ""}}
    assert check_serving(poll, "glm-5", True, worker=True).kind == "ready"
    assert check_serving(poll, "glm-5", True).kind == "fail"


def _run(n: int = 2) -> groupops.GroupRun:
    return groupops.GroupRun(_group(n), 40000)


def test_a_groups_operations_carry_the_decision_made_while_preparing():
    go, other_rank = groupops.Decided(), groupops.Decided(False)
    assert go() and not other_rank()
    assert go.group_gate and other_rank.group_gate   # plan.changes: not this host's drift
    assert repr(other_rank) == "Decided(False)"
    fields = groupops.group_fields(_group(), "n1", ("unit",))
    assert fields == {"group": "g1", "node_rank": 1, "group_nodes": ["n0", "n1"],
                      "group_wants": ["unit"]}


class OnePoll:
    """A host whose every poll answers POLL (the verifier's poll JSON)."""

    def __init__(self, poll: dict):
        self.poll, self.polls = poll, 0

    def run_shell_command(self, *a, **k):
        import json
        from types import SimpleNamespace

        self.polls += 1
        return True, SimpleNamespace(stdout=json.dumps(self.poll), stderr="")


def test_a_nodes_own_ready_decision_stands_no_node_waits_for_another():
    """A worker up on its own /health is ready at once, while no other node of its group has
    been verified yet: nothing holds it for the others (the group is judged as one later)."""
    from sglang_deploy.stages.verifyloop import wait_until_ready

    run = _run(3)
    host = OnePoll(_poll(3.0, 200))
    got = wait_until_ready(host, _verifier(worker=True), tool="t", service="sglang",
                           port=30000, host_addr="127.0.0.1", secrets="/s", poll_s=0.01,
                           watch=groupops.Watch(run, "n1"), clock=lambda: 3.0,
                           sleep=lambda s: None)
    assert got.kind == "ready" and host.polls == 1
    assert run.results.log() == ()   # the loop observes nothing for the group: verify_node does


def _failed(run: groupops.GroupRun, node: str, found: str) -> None:
    run.results.append(node, group.FAILED, VerifyError(what="x", found=found, fix="f"))


def test_a_failed_node_stops_the_others_with_its_name_and_cause():
    run = _run()
    assert groupops.Watch(run, "n0").abort() is None
    _failed(run, "n1", "the server exited in phase `capture`: cuda-oom\n  log lines")
    err = groupops.Watch(run, "n0").abort()
    assert isinstance(err, VerifyError)
    assert "node n1 failed: the server exited in phase `capture`: cuda-oom;" in err.found
    assert "n0 was stopped with the group" in err.found
    assert groupops.Watch(run, "n1").abort() is None   # the failed node reports its own error


def test_the_verify_loop_stops_on_a_peers_failure_before_polling():
    from sglang_deploy.stages.verifyloop import wait_until_ready

    run = _run()
    _failed(run, "n1", "boom")

    class NoHost:
        def run_shell_command(self, *a, **k):  # pragma: no cover - must not be reached
            raise AssertionError("polled after the group failed")

    with pytest.raises(VerifyError, match="every node of group g1 starts"):
        wait_until_ready(NoHost(), _verifier(), tool="t", service="sglang", port=30000,
                         host_addr="127.0.0.1", secrets="/s", poll_s=0.01,
                         watch=groupops.Watch(run, "n0"), sleep=lambda s: None)


def test_a_groups_decision_is_made_once_and_never_replaced():
    once, calls = groupops.Once(), []
    assert once.get(lambda: calls.append(1) or "first") == "first"
    assert once.get(lambda: calls.append(2) or "second") == "first"
    assert calls == [1]


def test_a_decision_that_failed_is_made_by_the_next_node_that_asks():
    once = groupops.Once()

    def boom():
        raise RuntimeError("peer not connected")

    with pytest.raises(RuntimeError):
        once.get(boom)
    assert once.get(lambda: "made") == "made"


def test_a_groups_run_keeps_its_results_and_decision_it_never_rebinds_them():
    import dataclasses

    run = _run()
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.results = group.Results()   # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.decision = groupops.Once()   # type: ignore[misc]


def test_a_rollout_batch_holds_a_whole_group_and_counts_it_once():
    from sglang_deploy.commands.rollout import batches

    units = {"a": ["a", "b"], "b": ["a", "b"]}
    assert batches(["a", "b", "c", "d"], 1, units=units) == [["a", "b"], ["c"], ["d"]]
    assert batches(["c", "a", "b", "d"], 2, units=units) == [["c", "a", "b"], ["d"]]
    assert batches(["b", "a", "c"], 1, canary="b", units=units) == [["a", "b"], ["c"]]
    assert batches(["a", "c"], 1) == [["a"], ["c"]]


def test_router_workers_are_rank_0_of_a_group_and_single_hosts():
    from pyinfra.api import Inventory

    from sglang_deploy.controller.routing import Fleet, router_workers

    node = {"sglang_model_path": "/m", "sglang_lock": "l.txt", "sglang_group": "g",
            "sglang_flags": {"tp-size": 16}}
    inv = Inventory(([("a", {**node, "ssh_hostname": "10.0.0.1"}), ("b", node),
                      ("c", {"sglang_model_path": "/m", "sglang_lock": "l.txt"})], {}))
    assert [n for n, _ in router_workers(Fleet(inv))] == ["a", "c"]


def test_rebuilding_a_groups_node_deploys_its_whole_group():
    from sglang_deploy.commands.rebuild import with_groups

    nodes = {"a": ["a", "b"], "b": ["a", "b"]}
    assert with_groups(["b"], nodes) == ["a", "b"]
    assert with_groups(["c", "b", "a"], nodes) == ["c", "a", "b"]
    assert with_groups(["c"], nodes) == ["c"]


def test_each_node_maps_to_its_groups_nodes_in_rank_order():
    g = _group(3)
    assert group.units({"g1": g}) == {n: ["n0", "n1", "n2"] for n in ("n0", "n1", "n2")}
    assert group.units({}) == {}

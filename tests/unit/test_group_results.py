"""A group's results while one run executes (``core.group.Results``), append-only, and the
pure judges each node applies to them for itself (``rendezvous_verdict``, ``first_failure``,
``peer_failed``, ``verdict``): no verdict is kept, so every node gives the same one from the
same results, whichever node judges first and however often."""

from __future__ import annotations

import itertools

import pytest

from sglang_deploy.core import group
from sglang_deploy.core.errors import VerifyError

G = group.Group("g1", tuple(group.Node(f"n{i}", i) for i in range(3)), "10.0.0.10", 50000)
PROBE = 40000


def _card(node: str, release: str = "rel1") -> dict:
    return group.card(node, G.rank_of(node), release, {"tp-size": 24}, "580.65.06")


CARDS = {n: _card(n) for n in G.members()}


def _rendezvous(node: str) -> dict:
    if node == "n0":
        return {"ok": True, "ports": {"50000": {"error": None, "peers": [{}, {}]},
                                      str(PROBE): {"error": None, "peers": [{}, {}]}}}
    ok = {"error": None, "offset_s": 0.2, "attempts": 1}
    return {"ok": True, "ports": {"50000": dict(ok), str(PROBE): dict(ok)}}


def _error(found: str, fix: str = "read the journal") -> VerifyError:
    return VerifyError(what="the server serves", found=found, fix=fix)


# ------------------------------------------------------------------ the results
def test_each_node_appends_its_own_observations_in_order():
    results = group.Results()
    results.append("n1", group.RENDEZVOUS, {"ok": True})
    results.append("n0", group.RENDEZVOUS, None)
    results.append("n0", group.VERIFIED, {"host": "n0"})
    assert [(o.node, o.kind) for o in results.log()] == [
        ("n1", group.RENDEZVOUS), ("n0", group.RENDEZVOUS), ("n0", group.VERIFIED)]
    assert results.log()[1].value is None   # a node that gave no result says so


@pytest.mark.parametrize("first,second", [(group.RENDEZVOUS, group.RENDEZVOUS),
                                          (group.VERIFIED, group.VERIFIED),
                                          (group.VERIFIED, group.FAILED),
                                          (group.FAILED, group.VERIFIED)])
def test_nothing_replaces_a_nodes_observation(first, second):
    results = group.Results()
    results.append("n1", first, "one")
    with pytest.raises(ValueError, match="n1 already observed its .*append-only"):
        results.append("n1", second, "two")
    assert [o.value for o in results.log()] == ["one"]
    results.append("n2", second, "two")   # another node's own slot is its own
    assert len(results.log()) == 2


def test_an_unknown_kind_of_observation_is_refused():
    with pytest.raises(ValueError, match="not 'judged'"):
        group.Results().append("n0", "judged", [])


def test_a_log_is_a_snapshot_later_observations_do_not_change_it():
    results = group.Results()
    results.append("n0", group.RENDEZVOUS, {})
    before = results.log()
    results.append("n1", group.RENDEZVOUS, {})
    assert len(before) == 1 and len(results.log()) == 2
    with pytest.raises(AttributeError):
        before[0].value = "changed"   # type: ignore[misc]


# ------------------------------------------------------------------ the rendezvous verdict
@pytest.mark.parametrize("order", list(itertools.permutations(G.members())))
def test_every_node_judges_the_rendezvous_the_same_whatever_order_the_results_came_in(order):
    results = group.Results()
    for n in order:
        results.append(n, group.RENDEZVOUS, _rendezvous(n))
    verdicts = [group.rendezvous_verdict(G, results.log(), CARDS, rank0_running=True)
                for _ in G.members()]
    assert verdicts == [[], [], []]


def test_a_node_that_gave_no_result_or_none_at_all_fails_the_rendezvous_on_every_node():
    results = group.Results()
    results.append("n0", group.RENDEZVOUS, _rendezvous("n0"))
    results.append("n1", group.RENDEZVOUS, None)   # nothing by its deadline; n2 never came
    verdicts = [group.rendezvous_verdict(G, results.log(), CARDS) for _ in G.members()]
    assert verdicts[0] == verdicts[1] == verdicts[2]
    assert [p.text() for p in verdicts[0]] == ["n1 <-> n0: the node gave no rendezvous result",
                                               "n2 <-> n0: the node gave no rendezvous result"]


def test_the_rendezvous_verdict_is_recomputed_from_the_results_not_kept():
    """A verdict judged before a result came in is not the answer once it has: nothing is
    cached between two judgements."""
    results = group.Results()
    for n in ("n0", "n1"):
        results.append(n, group.RENDEZVOUS, _rendezvous(n))
    assert [p.nodes for p in group.rendezvous_verdict(G, results.log(), CARDS)] == [("n2", "n0")]
    results.append("n2", group.RENDEZVOUS, _rendezvous("n2"))
    assert group.rendezvous_verdict(G, results.log(), CARDS) == []


def test_the_cards_are_judged_with_the_results():
    results = group.Results()
    for n in G.members():
        results.append(n, group.RENDEZVOUS, _rendezvous(n))
    cards = {**CARDS, "n2": _card("n2", release="rel2")}
    [p] = group.rendezvous_verdict(G, results.log(), cards)
    assert p.text() == "n2 <-> n0: releases differ: n2 has 'rel2', n0 has 'rel1'"


# ------------------------------------------------------------------ verified as one
def test_the_groups_cause_is_the_first_failure_appended():
    results = group.Results()
    assert group.first_failure(results.log()) is None
    results.append("n0", group.VERIFIED, {"host": "n0"})
    results.append("n2", group.FAILED, _error("exited in phase `capture`: cuda-oom\n  log"))
    results.append("n1", group.FAILED, _error("stopped with the group"))
    assert group.first_failure(results.log()) == ("n2", "exited in phase `capture`: cuda-oom")


def test_an_error_with_nothing_found_is_named_by_what_was_expected():
    results = group.Results()
    results.append("n1", group.FAILED, VerifyError(what="the poll answers"))
    assert group.first_failure(results.log()) == ("n1", "the poll answers")


def test_a_peers_failure_stops_every_other_node_and_not_the_failed_one():
    results = group.Results()
    assert all(group.peer_failed(G, results.log(), n) is None for n in G.members())
    results.append("n1", group.FAILED, _error("exited in phase `load`"))
    assert group.peer_failed(G, results.log(), "n1") is None   # it reports its own error
    err = group.peer_failed(G, results.log(), "n2")
    assert isinstance(err, VerifyError)
    assert err.what == "every node of group g1 starts (n0, n1, n2)"
    assert err.found == ("node n1 failed: exited in phase `load`; n2 was stopped with the "
                         "group, not left waiting for the distributed timeout")
    assert "sglang-deploy logs INVENTORY n1" in err.fix


def test_every_node_verified_is_ready_each_with_its_own_summary():
    results = group.Results()
    for n in ("n2", "n0", "n1"):
        results.append(n, group.VERIFIED, {"host": n})
    for n in G.members():
        got = group.verdict(G, results.log(), n)
        assert got.ready and got.summary == {"host": n} and got.error is None


@pytest.mark.parametrize("failing", G.members())
def test_one_failure_fails_every_node_the_failed_one_with_its_own_error(failing):
    results = group.Results()
    own = _error("exited in phase `capture`", fix="lower --mem-fraction-static")
    for n in G.members():
        if n == failing:
            results.append(n, group.FAILED, own)
        else:
            results.append(n, group.VERIFIED, {"host": n})
    others = [n for n in G.members() if n != failing]
    for n in G.members():
        got = group.verdict(G, results.log(), n)
        assert not got.ready and got.summary is None
        if n == failing:
            assert type(got.error) is VerifyError and got.error.found == own.found
            assert got.error.fix == ("lower --mem-fraction-static\n"
                                     f"{n} was stopped, and with it the group's other node(s) "
                                     f"{', '.join(others)}")
        else:
            assert f"node {failing} failed: exited in phase `capture`" in got.error.found
            assert f"{n} was stopped with the group" in got.error.found
    assert own.fix == "lower --mem-fraction-static"   # the observation is left as it was


def test_a_node_judged_twice_gets_the_same_verdict():
    results = group.Results()
    results.append("n0", group.FAILED, _error("boom", fix="f"))
    first, second = (group.verdict(G, results.log(), "n0") for _ in range(2))
    assert first.error is not second.error
    assert str(first.error) == str(second.error) and first.error.fix.count("was stopped") == 1


def test_a_node_stopped_by_a_peer_names_the_first_failure_not_its_own_stop():
    """n0 failed; n1 then stopped before polling (its own error: n0's failure) and n2 was
    verified: every node, n1 included, names n0 and its cause."""
    results = group.Results()
    results.append("n0", group.FAILED, _error("exited in phase `load`"))
    results.append("n1", group.FAILED, group.peer_failed(G, results.log(), "n1"))
    results.append("n2", group.VERIFIED, {"host": "n2"})
    for n in ("n1", "n2"):
        err = group.verdict(G, results.log(), n).error
        assert err.found.startswith("node n0 failed: exited in phase `load`;")
        assert f"{n} was stopped with the group" in err.found


def test_a_node_that_gave_no_verdict_fails_every_node_naming_it():
    results = group.Results()
    results.append("n0", group.VERIFIED, {"host": "n0"})
    results.append("n2", group.VERIFIED, {"host": "n2"})
    for n in ("n0", "n2"):
        got = group.verdict(G, results.log(), n)
        assert not got.ready
        assert got.error.what == "every node of group g1 verified in this run (n0, n1, n2)"
        assert got.error.found == (f"node(s) n1 gave no verdict (dropped from the run earlier); "
                                   f"{n} was stopped with the group")

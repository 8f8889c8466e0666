"""Multi-node groups before any connection: ranks, rank 0's address, what every node must
share, tp-size against nodes x GPUs, reserved flags, a --limit naming part of a group, and
the flags and environment a node's unit gets (core.group, controller.routing)."""

from __future__ import annotations

import re
import shlex
from types import SimpleNamespace

import pytest

from sglang_deploy.controller import routing
from sglang_deploy.controller.inventory import load
from sglang_deploy.core import group
from sglang_deploy.core.errors import DataError, UsageError
from sglang_deploy.core.flags import render_flags

FLAGS = {"tp-size": 16, "quantization": "modelopt_fp4", "trust-remote-code": True}


def _node(addr: str, **extra) -> dict:
    return {"sglang_group": "g1", "ssh_hostname": addr, "sglang_flags": dict(FLAGS),
            "sglang_model_path": "/srv/models/m", "gpu_expected_count": 8, **extra}


def test_ranks_follow_inventory_order_and_rank0_address_is_its_ssh_hostname():
    groups = group.plan([("a", _node("10.0.0.5")), ("solo", {"sglang_flags": {}}),
                         ("b", _node("10.0.0.6"))])
    g = groups["g1"]
    assert g.members() == ["a", "b"] and g.rank0 == "a" and g.nnodes == 2
    assert g.dist_init_addr == "10.0.0.5:50000"
    assert group.group_flags(g, "b") == {"nnodes": 2, "node-rank": 1,
                                         "dist-init-addr": "10.0.0.5:50000"}
    argv = render_flags({**FLAGS, **group.group_flags(g, "b")})
    for flag, value in (("--nnodes", "2"), ("--node-rank", "1"),
                        ("--dist-init-addr", "10.0.0.5:50000")):
        assert argv[argv.index(flag) + 1] == value


def test_the_dist_init_port_must_be_the_same_on_every_node():
    with pytest.raises(DataError) as exc:
        group.plan([("a", _node("10.0.0.5")), ("b", _node("10.0.0.6", sglang_dist_init_port=6000))])
    assert exc.value.key == "sglang_dist_init_port"


def test_port_and_address_of_rank0():
    g = group.plan([("a", _node("a.example", sglang_node_rank=1, sglang_dist_init_port=6000)),
                    ("b", _node("b.example", sglang_node_rank=0, sglang_dist_init_addr="192.0.2.7",
                                sglang_dist_init_port=6000))])["g1"]
    assert (g.rank0, g.dist_init_addr) == ("b", "192.0.2.7:6000")


@pytest.mark.parametrize("ranks, found", [((0, 0), "a=0, b=0"), ((0, 2), "a=0, b=2")])
def test_ranks_must_be_0_to_n_minus_1(ranks, found):
    a, b = ranks
    with pytest.raises(DataError) as exc:
        group.plan([("a", _node("10.0.0.5", sglang_node_rank=a)),
                    ("b", _node("10.0.0.6", **({} if b is None else {"sglang_node_rank": b})))])
    assert exc.value.key == "sglang_node_rank"
    assert set(found.split(", ")) <= set(exc.value.found.split(", "))


@pytest.mark.parametrize("a", [0, 1])
def test_a_rank_set_on_some_nodes_only_is_refused_and_no_implicit_rank_is_shown(a):
    with pytest.raises(DataError) as exc:
        group.plan([("a", _node("10.0.0.5", sglang_node_rank=a)), ("b", _node("10.0.0.6"))])
    assert exc.value.key == "sglang_node_rank"
    assert exc.value.what == "`sglang_node_rank` on every node of group `g1` or on none"
    assert exc.value.found == f"set on a={a}; not on b"
    assert "b=" not in exc.value.found


def test_a_group_of_one_host_is_refused():
    with pytest.raises(DataError, match="at least two hosts"):
        group.plan([("a", _node("10.0.0.5"))])


@pytest.mark.parametrize("addr", ["gpu-1.example", "fd00::1", "10.0.0"])
def test_rank0_needs_an_ipv4_address(addr):
    with pytest.raises(DataError) as exc:
        group.plan([("a", _node(addr)), ("b", _node("10.0.0.6"))])
    assert exc.value.key == "sglang_dist_init_addr" and "IPv4" in exc.value.what
    assert "sglang_dist_init_addr" in exc.value.fix


@pytest.mark.parametrize("key, value", [("sglang_lock", "locks/other.txt"),
                                        ("sglang_model_path", "/srv/models/other"),
                                        ("gpu_expected_count", 4),
                                        ("sglang_flags", {**FLAGS, "quantization": "fp8"})])
def test_nodes_must_share_lock_flags_model_and_gpu_count(key, value):
    with pytest.raises(DataError) as exc:
        group.plan([("a", _node("10.0.0.5")), ("b", _node("10.0.0.6", **{key: value}))])
    assert exc.value.key == key
    assert exc.value.found.startswith("a: ") and "; b: " in exc.value.found


@pytest.mark.parametrize("flags, ok", [({"tp-size": 16}, True), ({"tp-size": 8}, False),
                                       ({"tp-size": 8, "pp-size": 2}, True),
                                       ({"tp-size": 16, "pp-size": 2}, False)])
def test_tp_times_pp_equals_nodes_times_gpus(flags, ok):
    hosts = [("a", _node("10.0.0.5", sglang_flags=flags)),
             ("b", _node("10.0.0.6", sglang_flags=flags))]
    if ok:
        assert group.plan(hosts)["g1"].nnodes == 2
    else:
        with pytest.raises(DataError, match=r"nodes x GPUs per node \(2 x 8 = 16\)"):
            group.plan(hosts)


@pytest.mark.parametrize("flag", ["nnodes", "node-rank", "--dist-init-addr", "node_rank"])
def test_reserved_flags_in_sglang_flags_are_a_clear_error(flag):
    with pytest.raises(DataError) as exc:
        group.check_no_reserved("a", {"sglang_flags": {flag: 1}})
    assert exc.value.key == "sglang_flags" and "sglang_group" in exc.value.fix


def test_a_limit_naming_part_of_a_group_is_refused_unless_allowed():
    groups = group.plan([("a", _node("10.0.0.5")), ("b", _node("10.0.0.6"))])
    group.check_limit(groups, ["a", "b", "solo"])
    group.check_limit(groups, ["solo"])
    with pytest.raises(UsageError) as exc:
        group.check_limit(groups, ["a"])
    assert "--limit b" in exc.value.fix
    group.check_limit(groups, ["a"], allow_partial=True)


def test_group_environment_names_one_interface_for_nccl_and_gloo():
    assert group.group_environment("eth1") == {"NCCL_SOCKET_IFNAME": "eth1",
                                               "GLOO_SOCKET_IFNAME": "eth1"}
    assert group.group_environment(None) == {}


def _group_and_solo(tmp_path):
    """An inventory of two nodes of group `g` (n0, n1: tp-size 16) and one single host."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        "sglang_model_path = '/srv/models/m'\n"
        "sglang_flags = {'tp-size': 16, 'trust-remote-code': True}\n")
    (tmp_path / "inv.py").write_text(
        "hosts = [('n0', {'ssh_hostname': '10.9.0.10', 'sglang_group': 'g'}),\n"
        "         ('n1', {'ssh_hostname': '10.9.0.11', 'sglang_group': 'g'}),\n"
        "         ('solo', {'ssh_hostname': '10.9.0.12', 'sglang_flags': {'tp-size': 8}})]\n")
    return load("inv.py", tmp_path)


def test_routing_gives_each_node_its_group_flags(tmp_path):
    inv = _group_and_solo(tmp_path)
    by = {h.name: routing.settings(h, inv) for h in inv}
    assert by["n1"].sglang_flags == {"tp-size": 16, "trust-remote-code": True, "nnodes": 2,
                                     "node-rank": 1, "dist-init-addr": "10.9.0.10:50000"}
    assert by["n0"].sglang_flags["node-rank"] == 0
    assert by["n1"].sglang_dist_init_addr == "10.9.0.10"
    assert "nnodes" not in by["solo"].sglang_flags
    assert set(routing.groups(inv)) == {"g"}


def test_a_limit_naming_part_of_a_group_is_refused_unless_said_on_purpose(tmp_path, monkeypatch):
    from sglang_deploy.integration import hooks

    inv = _group_and_solo(tmp_path)
    resolved = {h.name: routing.settings(h, inv) for h in inv}
    by = {h.name: h for h in inv}
    monkeypatch.setenv("SGLANG_DEPLOY_PARTIAL_GROUP", "1")  # the old channel: no effect
    hooks.check_group_selection(inv, resolved, None)  # no --limit: every node
    hooks.check_group_selection(inv, resolved, [by["n0"], by["n1"]])
    hooks.check_group_selection(inv, resolved, [by["solo"]])
    with pytest.raises(UsageError) as exc:
        hooks.check_group_selection(inv, resolved, [by["n1"], by["solo"]])
    assert "n1" in exc.value.found and "n0" in exc.value.found
    # the fix names the run spec's key, given by hand on pyinfra's command line: it is one
    from pyinfra_cli.util import parse_cli_arg

    from sglang_deploy.core import runspec
    from sglang_deploy.integration.integration import read_spec

    given = shlex.split(re.search(r"`--data ('[^']+')`", exc.value.fix).group(1))[0]
    key, value = given.split("=", 1)
    override = {key: parse_cli_arg(value)}
    spec = read_spec(SimpleNamespace(get_override_data=lambda: override))
    assert key == runspec.DATA_KEY and spec.partial_group and override == {}
    hooks.check_group_selection(inv, resolved, [by["n1"]], allow_partial=spec.partial_group)

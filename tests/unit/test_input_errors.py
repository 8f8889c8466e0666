"""Bad data reads as an input error, not a crash: `[host] invalid data: KEY: expected ...`,
found, fix, no source path, exit status 2, from plain `pyinfra INVENTORY deploy.py` (config.py's
hooks: ``integration/inputerror.py``) as from every `sglang-deploy` command. And a multi-node group's
name (`sglang_group`) is accepted by `--limit` wherever hosts are.

pyinfra really runs, as a subprocess (``test_pyinfra_guards.pyinfra``); the hosts point at
127.0.0.1 port 9, where nothing listens."""

from __future__ import annotations

import pytest
from test_pyinfra_guards import NOWHERE, REPO, pyinfra

from sglang_deploy.commands import cli
from sglang_deploy.controller import hosts
from sglang_deploy.core.errors import UsageError

BASE = {**NOWHERE, "sglang_model_path": "/srv/models/m", "sglang_lock": "locks/testbed.txt"}
NODE = {**BASE, "sglang_group": "g1", "sglang_flags": {"tp-size": 16}}
TP8 = {**NODE, "sglang_flags": {"tp-size": 8}}


def _inventory(tmp_path, first: dict, second: dict) -> str:
    path = tmp_path / "inv.py"
    path.write_text(f"gpu_hosts = ([('gpu-node-1', {first!r}), ('gpu-node-2', {second!r}), "
                    f"('solo', {BASE!r})], {{}})\n")
    return str(path)


CASES = {
    "group tp-size": (TP8, TP8,
                      "[gpu-node-1] invalid data: sglang_flags: expected tp-size of group `g1`"),
    "rank on one node": ({**NODE, "sglang_node_rank": 0}, NODE,
                         ("[gpu-node-1] invalid data: sglang_node_rank: expected "
                          "`sglang_node_rank` on every node of group `g1` or on none")),
    "IPv6 rank 0": ({**NODE, "sglang_dist_init_addr": "fd00::1"}, NODE,
                    "[gpu-node-1] invalid data: sglang_dist_init_addr: expected an IPv4 address"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_group_data_ends_a_pyinfra_run_as_an_input_error(tmp_path, case):
    first, second, headline = CASES[case]
    r = pyinfra(tmp_path, _inventory(tmp_path, first, second), "deploy.py")
    assert r.returncode == 2, r.both
    assert any(line.startswith(headline) for line in r.stderr.splitlines()), r.stderr
    assert "pyinfra error" not in r.both and ".py line" not in r.both
    assert "  found:    " in r.stderr and "  fix:      " in r.stderr
    assert "Connecting to hosts" not in r.both


def test_an_unknown_data_key_ends_a_pyinfra_run_as_an_input_error(tmp_path):
    inv = _inventory(tmp_path, NODE, NODE)
    r = pyinfra(tmp_path, inv, "deploy.py", "--data", "sglang_prot=1")
    assert r.returncode == 2, r.both
    assert "[gpu-node-1] invalid data: sglang_prot: expected" in r.stderr
    assert "pyinfra error" not in r.both


@pytest.mark.parametrize("case", list(CASES))
def test_sglang_deploy_commands_print_the_same_error_on_one_line(tmp_path, monkeypatch, capsys,
                                                                  case):
    first, second, headline = CASES[case]
    monkeypatch.chdir(REPO)
    assert cli.main(["status", _inventory(tmp_path, first, second)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sglang-deploy status: {headline}")
    assert err.strip().count("\n") == 0 and "; found: " in err and "; fix: " in err


def test_limit_takes_a_multi_node_groups_name_in_a_pyinfra_run(tmp_path):
    r = pyinfra(tmp_path, _inventory(tmp_path, NODE, NODE), "deploy.py", "--limit", "g1")
    assert "Connecting to hosts" in r.both, r.both
    assert "[gpu-node-1] Could not connect" in r.both and "[gpu-node-2] Could not connect" in r.both
    assert "[solo]" not in r.both
    assert "No host matches found" not in r.both


def test_part_of_a_group_is_refused_naming_the_group_for_limit(tmp_path):
    r = pyinfra(tmp_path, _inventory(tmp_path, NODE, NODE), "deploy.py", "--limit", "gpu-node-1")
    assert r.returncode == 2, r.both
    assert "or name the whole group: `--limit g1`" in r.stderr
    assert "inventory group" not in r.stderr


def test_limit_takes_a_multi_node_groups_name_in_sglang_deploy_commands(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(REPO)
    inv = _inventory(tmp_path, NODE, NODE)
    assert hosts.select(inv, ["g1"]).hosts == ["gpu-node-1", "gpu-node-2"]
    with pytest.raises(UsageError) as exc:
        hosts.select(inv, ["g2"])
    assert "or multi-node groups (sglang_group): g1" in exc.value.fix


def test_logs_of_a_groups_name_names_its_nodes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert cli.main(["logs", _inventory(tmp_path, NODE, NODE), "g1"]) == 2
    err = capsys.readouterr().err
    assert "'g1' is a multi-node group (sglang_group) of 2 nodes" in err
    assert "name one of its nodes: gpu-node-1, gpu-node-2" in err

"""What the operator's fourth pass (issue 40, item 3) found confusing, fixed: an Ansible user's
INI inventory and Ansible's `-e @FILE` / `-e '{...}'` forms get a fix that names the way in."""

from __future__ import annotations

import pytest

from sglang_deploy.controller import inventory
from sglang_deploy.core.errors import UsageError


def test_an_ansible_ini_inventory_is_named_with_its_conversion(tmp_path):
    ini = tmp_path / "hosts"
    ini.write_text("# our GPU boxes\n\n[gpu_servers]\ngpu-node-1 ansible_host=10.0.0.11\n"
                   "\n[gpu_servers:vars]\nansible_user=root\n")
    with pytest.raises(UsageError) as err:
        inventory.load(str(ini), tmp_path)
    text = str(err.value)
    assert "an Ansible INI inventory" in text
    assert f"ansible-inventory -i {ini} --list --yaml --export > {ini}.yml" in text
    assert "inventory/yaml/prod.py" in text


@pytest.mark.parametrize("first", ["[gpu]", "[gpu:children]  # nested", "  [all:vars]"])
def test_ini_headers_are_seen(tmp_path, first):
    path = tmp_path / "hosts.ini"
    path.write_text(f"; comment\n{first}\nhost1\n")
    assert inventory.ansible_ini(path)


@pytest.mark.parametrize("text", ["hosts = ['a']\n", "[\n  'a',\n]\n", "x = [1]  # [a]\n", ""])
def test_python_and_empty_files_are_not_taken_for_ini(tmp_path, text):
    path = tmp_path / "inv"
    path.write_text(text)
    assert not inventory.ansible_ini(path)
    assert not inventory.ansible_ini(tmp_path / "inv.py")


def test_a_python_list_literal_inventory_still_loads_as_python(tmp_path):
    (tmp_path / "inv.py").write_text("hosts = [\n    'gpu-node-1',\n]\n")
    inv = inventory.load("inv.py", tmp_path)
    assert [h.name for h in inv] == ["gpu-node-1"]


@pytest.mark.parametrize(("item", "needle"), [
    ("@vars.yml", "host_vars/HOST.yml or group_vars/GROUP.yml"),
    ('{"sglang_port": 1}', "-e 'sglang_flags={\"tp-size\": 4}'"),
    ("sglang_port", "write it as KEY=VALUE"),
])
def test_ansible_extra_vars_forms_get_their_own_fix(item, needle):
    with pytest.raises(UsageError) as err:
        inventory.parse_data([item])
    assert needle in str(err.value)
    assert repr(item) in str(err.value)


def test_key_value_with_a_json_value_is_read():
    assert inventory.parse_data(['sglang_flags={"tp-size": 4}', "sglang_port=30001"]) == {
        "sglang_flags": {"tp-size": 4}, "sglang_port": 30001}


def test_a_routed_workers_missing_key_names_the_key_the_operator_set():
    """`pyinfra inventory/prod.py deploy.py` with the router keys of operations.md in
    group_data/all.py and ROUTER_API_KEY not exported named `sglang_api_key_env`, a key the
    operator never set (a worker takes the router's key as its own)."""
    from sglang_deploy.core import data, router
    from sglang_deploy.core.errors import DataError

    raw = router.routed_data({"sglang_model_path": "/srv/models/m", "ssh_hostname": "10.0.0.11",
                              "router_host": "0.0.0.0", "router_api_key_env": "ROUTER_API_KEY"},
                             "gpu-node-1", True)
    with pytest.raises(DataError) as err:
        data.resolve(raw, environ={})
    assert err.value.key == "router_api_key_env"
    head = err.value.headline()
    assert "`ROUTER_API_KEY` (named by `router_api_key_env`, `sglang_api_key_env`)" in head
    assert "must be set" not in head


@pytest.mark.parametrize(("known_hosts", "error", "names"), [
    # operations.md's `routers` example before the fix: no known-hosts data on the router
    (None, "[Errno 2] No such file or directory: '/root/.ssh/known_hosts'",
     "~/.ssh/known_hosts does not exist (its data sets no `ssh_known_hosts_file`)"),
    ("/inv/prod_known_hosts", "[Errno 2] No such file or directory: '/inv/prod_known_hosts'",
     "/inv/prod_known_hosts does not exist\n"),
])
def test_a_missing_known_hosts_file_is_named_with_its_fix(caplog, known_hosts, error, names):
    """`pyinfra inventory/prod.py deploy.py` with a router host whose data had no known-hosts
    settings printed only pyinfra's `Could not connect ([Errno 2] No such file or directory:
    '/root/.ssh/known_hosts')`."""
    import logging
    from types import SimpleNamespace as NS

    from sglang_deploy.integration import hooks

    host = NS(name="router-1", print_prefix="[router-1] ",
              data={"ssh_hostname": "10.0.0.10", "ssh_known_hosts_file": known_hosts})
    with caplog.at_level(logging.ERROR):
        hooks.ExplainConnectErrors().host_connect_error(None, host, OSError(error))
    text = caplog.text
    assert names in text
    assert "`ssh_known_hosts_file`" in text and "ssh-keyscan -t ed25519 10.0.0.10" in text
    assert "is not the one recorded" not in text


def test_a_rollout_drains_a_new_groups_rank_1_out_of_the_router_and_leaves_it_out():
    """`sglang-deploy rollout` that made two routed hosts a group (quickstart, "Multi-node
    groups") left the router routing to the rank-1 node, which serves no API (404/501 to a
    third of the clients), and said OK."""
    import io

    from sglang_deploy.commands import rollout
    from sglang_deploy.commands.progress import HostProgress
    from sglang_deploy.commands.rollout import HostResult
    from tests.unit.test_rollout import FakeRouter

    r = rollout.Rollout(inventory="inv.py", out=io.StringIO(),
                        progress=HostProgress(out=io.StringIO()))
    front = FakeRouter(["g0"], strays=["g1"])
    results = {h: HostResult(h) for h in ("g0", "g1")}
    assert r.take_out([front], ["g0", "g1"], results)
    assert front.calls == [("drain", "g0"), ("drain", "g1")]
    assert results["g1"].router == "removed"
    assert "g1: listed by the router router-1 but node 1 of group g" in r.out.getvalue()
    assert r.put_back([front], ["g0", "g1"], results)
    assert front.calls[2:] == [("put_back", "g0")]  # the rank-1 node is not put back
    assert results["g1"].router == "removed"


def test_worker_states_name_an_inventory_host_that_is_no_worker():
    from sglang_deploy.core import router

    listed = router.parse_workers({"workers": [
        {"id": "a", "url": "http://10.0.0.11:30000", "status": "ready"},
        {"id": "b", "url": "http://10.0.0.12:30000", "status": "ready"},
        {"id": "c", "url": "http://10.0.0.99:30000", "status": "ready"}]})
    rows = router.worker_states([("g0", "http://10.0.0.11:30000")], listed,
                                {"http://10.0.0.12:30000": ("g1", "node 1 of group g")})
    assert rows[1] == {"host": "g1", "url": "http://10.0.0.12:30000", "state": "ready",
                       "not_worker": "node 1 of group g"}
    assert rows[2] == {"host": None, "url": "http://10.0.0.99:30000", "state": "ready"}


@pytest.mark.parametrize(("state", "ok"), [("ready", False), ("draining", True)])
def test_status_fails_while_the_router_routes_to_a_host_that_is_no_worker(capsys, state, ok):
    """`sglang-deploy status` exited 0 with the router routing to a group's rank-1 node, and
    named that inventory host `(not in the inventory)`."""
    from sglang_deploy.commands import status

    router = {"host": "router-1", "url": "http://10.0.0.10:30000", "error": None, "workers": [
        {"host": "g0", "url": "http://10.0.0.11:30000", "state": "ready"},
        {"host": "g1", "url": "http://10.0.0.12:30000", "state": state,
         "not_worker": "node 1 of group g, not a router worker"}]}
    assert status.ok([], [], router) is ok
    status.render_router(router)
    out = capsys.readouterr().out
    assert "g1" in out and "(not in the inventory)" not in out
    assert ("--limit router-1` writes the router's worker list" in out) is not ok


@pytest.mark.parametrize(("groups", "workers", "warned"), [
    ([["a", "g0", "g1"]], {"a", "g0"}, [1]),            # --batch 2: the group counts once
    ([["a"], ["g0", "g1"]], {"a", "g0"}, []),
    ([["a", "b"], ["c"]], {"a", "b", "c"}, []),
    ([["a"]], {"a"}, []),                                # one worker: no other way
])
def test_a_batch_that_empties_the_router_is_named(groups, workers, warned):
    """`sglang-deploy rollout inventory/site/hosts.py --batch 2` on a single host and a
    2-node group drained both of the router's workers at once, without a word."""
    from sglang_deploy.commands.rolloutplan import batches_emptying_the_router

    assert batches_emptying_the_router(groups, workers) == warned


@pytest.mark.parametrize("read_only", [True, False])
def test_a_groups_unreachable_node_leaves_a_read_only_run_going(monkeypatch, read_only):
    """`sglang-deploy status` with a group's rank-1 node unreachable (wiped: a new host key)
    showed no host at all: rank 0 failed its group preparation, which stopped the read of
    every host (the single host too: `no result: the run stopped when ... failed`), and the
    group line said rank 0 did not serve while it did."""
    from types import SimpleNamespace as NS

    from sglang_deploy.core.errors import GroupPreflightError
    from sglang_deploy.core.group import Group, Node
    from sglang_deploy.integration import plan
    from sglang_deploy.stages.group import groupprep

    hosts = {"g0": NS(name="g0", connected=True, data={}),
             "g1": NS(name="g1", connected=False, data={"ssh_hostname": "10.0.0.12"})}
    state = NS(inventory=NS(get_host=hosts.__getitem__), is_host_in_limit=lambda h: True)
    g = Group(name="g", nodes=(Node("g0", 0), Node("g1", 1)), addr="10.0.0.11", port=50000)
    monkeypatch.setattr(plan, "read_only", lambda: read_only)
    if read_only:
        assert [h.name for h in groupprep.peers(state, g)] == ["g0"]
    else:  # a deploy still refuses to decide a group's restart without every node
        with pytest.raises(GroupPreflightError, match="g1 is not connected") as err:
            groupprep.peers(state, g)
        assert "`ssh 10.0.0.12`" in str(err.value)  # its address, not the inventory alias


def test_ansibles_limit_all_is_answered(tmp_path):
    """`sglang-deploy status inventory/site/hosts.py --limit all` (Ansible's group of every
    host) listed the groups there are, none of which is `all`."""
    (tmp_path / "inv.py").write_text("gpu = ['gpu-node-1', 'gpu-node-2']\n")
    inv = inventory.load("inv.py", tmp_path)
    with pytest.raises(UsageError) as err:
        inventory.match(inv, ["all"])
    assert "for every host (Ansible's `all`), leave out --limit" in str(err.value)
    with pytest.raises(UsageError) as err:
        inventory.match(inv, ["gpu-node-9"])
    assert "Ansible's `all`" not in str(err.value)


def test_data_of_a_host_says_when_another_host_fails_the_check(tmp_path, monkeypatch, capsys):
    """`sglang-deploy data inventory/site/hosts.py gpu-node-1` showed gpu-node-1's data,
    then `data check failed:` and gpu-node-3's error, as if it were gpu-node-1's."""
    from sglang_deploy.commands import cli
    from sglang_deploy.core.errors import DataError
    from sglang_deploy.integration import hooks

    (tmp_path / "inv.py").write_text("gpu = ['gpu-node-1', 'gpu-node-3']\n")
    monkeypatch.chdir(tmp_path)

    def check(inv, cwd, say):  # the deploy's check of every host: gpu-node-3 fails it
        raise DataError(key="sglang_port", what="[gpu-node-3] an integer", found="'x'")

    monkeypatch.setattr(hooks, "validate_inventory", check)
    assert cli.main(["data", "inv.py", "gpu-node-1"]) == 2
    captured = capsys.readouterr()
    assert "data check failed (on another host of the inventory):" in captured.out
    assert captured.err.startswith("[gpu-node-3]")
    assert cli.main(["data", "inv.py", "gpu-node-3"]) == 2
    assert "data check failed:\n" in capsys.readouterr().out

"""What the operator's fourth pass (issue 40, item 3) found confusing, fixed: an Ansible user's
INI inventory and Ansible's `-e @FILE` / `-e '{...}'` forms get a fix that names the way in."""

from __future__ import annotations

import pytest

from sglang_deploy.core.errors import UsageError
from sglang_deploy.shell import inventory


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

    from sglang_deploy.shell import hooks

    host = NS(name="router-1", print_prefix="[router-1] ",
              data={"ssh_hostname": "10.0.0.10", "ssh_known_hosts_file": known_hosts})
    with caplog.at_level(logging.ERROR):
        hooks.ExplainConnectErrors().host_connect_error(None, host, OSError(error))
    text = caplog.text
    assert names in text
    assert "`ssh_known_hosts_file`" in text and "ssh-keyscan -t ed25519 10.0.0.10" in text
    assert "is not the one recorded" not in text

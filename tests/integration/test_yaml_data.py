"""A deploy from Ansible-style YAML data: the testbed's host in a YAML inventory (ansible_host,
ansible_user, ansible_ssh_private_key_file), the testbed's data in group_vars/all.yml, read
through the two-line loader (inventory/yaml/prod.py's form), deployed by the real pyinfra
CLI; then the Python inventory of the same data (inventory/testbed.py) finds nothing to
change: the same unit, flags and secrets, so the server keeps its invocation.

Reads only the testbed's state file (addresses, key, known_hosts): the same whether its
containers are systemd-nspawn or LXC.
"""

from __future__ import annotations

import runpy

import yaml

from .helpers import INVENTORY, TB1, both, changed, pyinfra_deploy

LOADER = "from sglang_deploy.controller.yamldata import groups as _groups\n\nglobals().update(_groups(__file__))\n"


def yaml_inventory(testbed, folder) -> str:
    """The testbed's first host as a YAML inventory in FOLDER, with inventory/testbed.py's
    TESTBED_DATA as group_vars/all.yml: the loader file's path."""
    state, host = testbed.state, testbed.host(TB1)
    data = runpy.run_path(str(INVENTORY))["TESTBED_DATA"]
    (folder / "group_vars").mkdir(parents=True)
    (folder / "tb.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": {
        TB1: {"ansible_host": host["address"], "ansible_user": "root",
              "ansible_ssh_private_key_file": state["key"]}}}}}}))
    (folder / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        **data, "ssh_known_hosts_file": state["known_hosts"],
        "ssh_strict_host_key_checking": "yes", "ssh_connect_retries": 3}))
    (folder / "tb.py").write_text(LOADER)
    return str(folder / "tb.py")


def invocation(testbed) -> str:
    return testbed.ssh(TB1, "systemctl show -p InvocationID --value sglang.service",
                       check=True).stdout.strip()


def test_a_deploy_from_yaml_data_is_the_python_inventorys(testbed, tmp_path):
    inventory = yaml_inventory(testbed, tmp_path / "yinv")
    # whatever an earlier test left on TB1 (a host already converged by the same data
    # verifies nothing), the YAML deploy starts the server and verifies it
    testbed.ssh(TB1, "! systemctl is-active -q sglang.service || systemctl stop sglang.service",
                check=True)
    r = pyinfra_deploy([TB1], inventory=inventory)
    testbed.log.append(r)
    assert r.returncode == 0, both(r)[-4000:]
    assert f"READY {TB1}" in both(r), both(r)[-4000:]
    serving = invocation(testbed)
    assert serving
    # the same data from the Python inventory: nothing to restart
    r = pyinfra_deploy([TB1], inventory=INVENTORY)
    testbed.log.append(r)
    assert r.returncode == 0, both(r)[-4000:]
    assert changed(both(r)) == [], both(r)[-4000:]
    assert invocation(testbed) == serving, both(r)[-4000:]
    health = testbed.ssh(TB1, "curl -s -o /dev/null -w '%{http_code}' "
                              "http://127.0.0.1:30000/health")
    assert health.stdout.strip() == "200"

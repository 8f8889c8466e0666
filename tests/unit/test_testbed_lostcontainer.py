"""testbed/lostcontainer.py's container data: what lxc_host.py gets to re-create a lost
testbed host (tests/integration/test_lxc_rebuild.py runs it for real)."""

from __future__ import annotations

from sglang_deploy.core.lxchost.containers import create_plan, parse_container
from testbed import lostcontainer, lxc

STATE = {"state_dir": "/tb", "bridge": "lrbr0", "gateway": "10.247.0.1",
         "hosts": [], "wheelhouse": "/root/.cache/sglang-deploy/wheelhouse"}


def host(privileged: bool = False) -> dict:
    return {"name": "lr1", "address": "10.247.0.11", "veth": "vlr1", "netns": "lr1",
            "merged": "/tb/lr1/merged", "console": "/tb/lr1/console.log",
            "privileged": privileged}


def test_the_data_is_the_testbed_configs_own_lines_less_what_the_tool_writes():
    h = host()
    data = lostcontainer.container_data(STATE, h, "/img", "/tb/dr-share/wheelhouse")
    assert data["name"] == "lr1" and data["base_image"] == "/img" and data["unprivileged"]
    keys = [line.partition("=")[0].strip() for line in data["config"]]
    for written_by_the_tool in lostcontainer._PLAN_KEYS:
        assert written_by_the_tool not in keys
    testbed_lines = [ln for ln in lxc.config_text(STATE, h).splitlines()
                     if ln.startswith(("lxc.net.", "lxc.cgroup.", "lxc.signal", "lxc.init"))]
    assert all(ln in data["config"] for ln in testbed_lines)
    # the console log outlives the overlay's folder, which goes with the lost storage
    assert "lxc.console.logfile = /tb/lxc/lr1/console.log" in data["config"]
    assert not any("/tb/lr1/" in ln for ln in data["config"])
    assert data["config"][-1] == ("lxc.mount.entry = /tb/dr-share/wheelhouse srv/wheelhouse "
                                  "none bind,ro,create=dir 0 0")


def test_the_product_accepts_it_and_plans_the_creation_in_the_testbeds_lxcpath():
    data = lostcontainer.container_data(STATE, host(), "/img", "/share")
    spec = parse_container(data)
    plan = create_plan(spec, lxc_path="/tb/lxc")
    assert plan.argv[0] == ("lxc-create", "-P", "/tb/lxc", "-n", "lr1", "-t", "none")
    assert "lxc.idmap = u 0 100000 65536" in plan.config_lines
    assert "lxc.net.0.ipv4.address = 10.247.0.11/24" in plan.config_lines
    privileged = parse_container(lostcontainer.container_data(STATE, host(True), "/img", "/s"))
    assert not privileged.unprivileged
    assert not any("idmap" in ln for ln in create_plan(privileged, lxc_path="/tb/lxc").config_lines)

"""core.lxchost.hostplan (lxc_host.py's plan, pure) and the shell's fact sections: real
/proc/devices, node listings, config files and driver libraries in, the plan out."""

from __future__ import annotations

import base64
import json

import pytest

from sglang_deploy.core.errors import DataError, LxcHostError
from sglang_deploy.core.lxchost import confmerge, hostplan, restart
from sglang_deploy.integration.hooks import lxc_host_run
from sglang_deploy.lxchost import facts as shellfacts
from tests.unit.lxchost_fixtures import fixture, on_full_listing

LXC_PATH = "/srv/lxc"
BASE = "lxc.uts.name = gpu1\nlxc.rootfs.path = dir:/srv/lxc/gpu1/rootfs\n"


def raw(**over) -> dict[str, str]:
    out = {"proc-devices": on_full_listing("proc-devices/grep-rtx-proxmox-511.txt"),
           "nodes": fixture("nodes/rtx-proxmox-511.txt"),
           "version": fixture("version/open-570.txt"), "cgroup": "cgroup2fs\n", "gpus": "",
           "managers": "lxc-start\n", "pveversion": ""}
    out.update(over)
    return out


def info(containers=None, **raw_over) -> hostplan.HostInfo:
    data = {"lxc_containers": containers or [{"name": "gpu1"}], "lxc_path": LXC_PATH,
            "lxc_record_dir": "/var/lib/rec"}
    return hostplan.read_host(data, raw(**raw_over))


def state(**over) -> dict:
    out = {"exists": True, "config": BASE, "record": None, "running": False, "init": None,
           "serving": False, "libraries": None, "os_release": None}
    out.update(over)
    return out


def test_a_new_passthrough_is_written_with_its_record_and_the_stopped_container_started():
    host = info()
    plan = hostplan.plan_container(host.specs[0], host, state())
    assert plan.config_path == "/srv/lxc/gpu1/config"
    assert plan.new_config.startswith(BASE)
    assert "lxc.cgroup2.devices.allow = c 511:* rwm\n" in plan.new_config
    assert plan.record_path == "/var/lib/rec/gpu1.json"
    assert json.loads(plan.new_record)["lines"][0] == confmerge.BEGIN
    assert plan.restart.action == restart.START
    assert plan.restart.argv == (("lxc-start", "-P", LXC_PATH, "-n", "gpu1"),)


def test_the_plan_of_its_own_result_changes_nothing():
    host = info()
    first = hostplan.plan_container(host.specs[0], host, state())
    again = hostplan.plan_container(host.specs[0], host, state(
        config=first.new_config, record=first.new_record, running=True, init="42"))
    assert (again.new_config, again.new_record, again.changed) == (None, None, False)
    assert again.restart.action == restart.NOTHING


def test_a_serving_container_gets_restart_needed_and_it_stays_pending_until_done():
    host = info()
    first = hostplan.plan_container(host.specs[0], host, state())
    old = first.new_config.replace("c 511:* rwm", "c 509:* rwm")  # before a driver update
    was = json.dumps({"version": 1, "lines": [x.replace("511", "509") for x in
                                              json.loads(first.new_record)["lines"]]})
    serving = {"running": True, "init": "42", "serving": True}
    plan = hostplan.plan_container(host.specs[0], host, state(config=old, record=was, **serving))
    assert plan.restart.action == restart.NEEDED
    assert "lxc-stop -P /srv/lxc -n gpu1 && lxc-start -P /srv/lxc -n gpu1" == plan.restart.command
    assert json.loads(plan.new_record)[hostplan.PENDING] == "42"
    # the next run: the config is right, the restart still due (same init), told again
    again = hostplan.plan_container(host.specs[0], host, state(
        config=plan.new_config, record=plan.new_record, **serving))
    assert (again.new_config, again.new_record) == (None, None)
    assert again.restart.action == restart.NEEDED
    # restarted by hand since (another init PID): nothing is due any more
    done = hostplan.plan_container(host.specs[0], host, state(
        config=plan.new_config, record=plan.new_record, **{**serving, "init": "77"}))
    assert done.restart.action == restart.NOTHING
    assert hostplan.PENDING not in json.loads(done.new_record)
    # restart: now does it, and the record forgets it
    now = info([{"name": "gpu1", "restart": "now"}])
    forced = hostplan.plan_container(now.specs[0], now, state(
        config=plan.new_config, record=plan.new_record, **serving))
    assert forced.restart.action == restart.RESTART
    assert hostplan.PENDING not in json.loads(forced.new_record)


def test_a_named_server_behind_a_router_is_drained_and_its_record_done_only_after():
    """restart: now with `serves` behind a router: DRAIN. The record written before the
    restart keeps it pending (a run stopped before the restart does it next time, on any
    dialect); the one written once it booted (record_done) forgets it, so that the run
    after changes nothing."""
    serves = {"inventory": "inventory/prod.py", "host": "gpu1"}
    host = info([{"name": "gpu1", "restart": "now", "serves": serves}])
    first = hostplan.plan_container(host.specs[0], host, state())
    old = first.new_config.replace("c 511:* rwm", "c 509:* rwm")
    serving = {"running": True, "init": "42", "serving": True}
    plan = hostplan.plan_container(host.specs[0], host, state(config=old, **serving),
                                   behind_router=True)
    assert plan.restart.action == restart.DRAIN
    assert plan.restart.steps == ("drain", "restart", "boot", "verify", "put-back")
    assert json.loads(plan.new_record)[hostplan.PENDING] == "42"
    assert hostplan.PENDING not in json.loads(plan.record_done)
    after = hostplan.plan_container(host.specs[0], host, state(
        config=plan.new_config, record=plan.record_done, **{**serving, "init": "77"}),
        behind_router=True)
    assert (after.new_config, after.new_record, after.restart.action) == (None, None,
                                                                          restart.NOTHING)
    # no router in front: restarted, then verified; nothing pending to forget
    alone = hostplan.plan_container(host.specs[0], host, state(config=old, **serving))
    assert (alone.restart.action, alone.restart.steps, alone.record_done) == (
        restart.RESTART, ("restart", "boot", "verify"), None)


def test_a_missing_container_without_a_base_image_is_an_error_naming_the_fix():
    host = info()
    with pytest.raises(LxcHostError) as e:
        hostplan.plan_container(host.specs[0], host, state(exists=False, config=None))
    assert "no such container" in str(e.value) and "base_image" in str(e.value)


def test_a_missing_plain_lxc_container_is_created_from_its_base_image():
    host = info([{"name": "gpu1", "base_image": "/srv/images/debian12",
                  "config": ["lxc.net.0.type = veth", "lxc.net.0.link = br0"]}])
    plan = hostplan.plan_container(host.specs[0], host, state(exists=False, config=None))
    assert plan.create.argv[0] == ("lxc-create", "-P", LXC_PATH, "-n", "gpu1", "-t", "none")
    lines = plan.new_config.splitlines()
    assert lines[:2] == ["lxc.rootfs.path = dir:/srv/lxc/gpu1/rootfs", "lxc.uts.name = gpu1"]
    assert "lxc.net.0.link = br0" in lines and "lxc.idmap = u 0 100000 65536" in lines
    assert lines[-1] == confmerge.END
    assert plan.restart.action == restart.START


def test_the_shells_userspace_finding_is_reported_for_a_running_container():
    host = info()
    plan = hostplan.plan_container(host.specs[0], host, state(
        running=True, libraries=fixture("container/libs-580.95.05.txt"),
        os_release=fixture("container/os-release-debian12.txt")))
    assert plan.userspace is not None and not plan.userspace.ok
    assert "570.195.03" in plan.userspace.fix


@pytest.mark.parametrize("data, key", [
    ({}, "lxc_containers"),
    ({"lxc_containers": []}, "lxc_containers"),
    ({"lxc_containers": [{"name": "a"}], "lxc_path": "relative"}, "lxc_path"),
    ({"lxc_containers": [{"name": "a", "config": ["net = x"]}]}, "lxc_containers[0].config"),
    ({"lxc_containers": [{"name": "a", "dialect": "incus", "config": ["lxc.a = b"]}]},
     "lxc_containers[0].config"),
])
def test_bad_lxc_host_data_names_its_key(data, key):
    with pytest.raises(DataError) as e:
        hostplan.check_data(data)
    assert e.value.key == key


def test_a_host_without_the_nvidia_module_is_refused_before_any_container():
    with pytest.raises(LxcHostError) as e:
        info(**{"proc-devices": fixture("proc-devices/no-nvidia-debian12.txt"), "version": ""})
    assert "NVIDIA kernel module" in str(e.value)


def test_fact_sections_and_the_container_state_read_exact_bytes():
    text = "lxc.a = 1  \n# trailing spaces kept\n"
    out = ["@@lxc-host:exists", "yes", "@@lxc-host:config-b64",
           base64.b64encode(text.encode()).decode(), "@@lxc-host:record", "",
           "@@lxc-host:running", "yes", "@@lxc-host:init", "1234",
           "@@lxc-host:serving", "active", "@@lxc-host:libraries", "@@lxc-host:os-release",
           "ID=debian"]
    st = shellfacts.LxcContainerState().process(out)
    assert st["config"] == text and st["record"] is None
    assert (st["running"], st["init"], st["serving"]) == (True, "1234", True)
    cmd = shellfacts.LxcContainerState().command("lxc", "gpu1", lxc_path="/srv/lxc",
                                                 record_path="/r/gpu1.json")
    assert "lxc-info -P /srv/lxc -n gpu1 -sH" in cmd and "base64 -w0 /srv/lxc/gpu1/config" in cmd
    host_cmd = shellfacts.LxcHostState().command()
    assert all(c in host_cmd for _, c in shellfacts.HOST_SECTIONS)


def test_a_run_of_lxc_host_py_is_told_apart_from_a_deploy():
    assert lxc_host_run({"operations": ("lxc_host.py",)})
    assert lxc_host_run({"operations": ("/x/lxc_host.py",)})
    assert not lxc_host_run({"operations": ("deploy.py",)})
    assert not lxc_host_run({})

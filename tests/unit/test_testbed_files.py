"""The testbed's file handling without containers: the env files `scenario`/`sim-env` edit, the
known_hosts entries `up`/`wipe`/`down` keep, the state records, and the base rootfs recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from testbed import fleet, net, procs, rootfs

STATE_KEYS = {"version", "prefix", "state_dir", "bridge", "gateway", "subnet", "key", "known_hosts",
              "wheelhouse", "base", "sglang_version", "hosts", "lockcheck", "lxc_path"}
HOST_KEYS = {"name", "role", "index", "address", "netns", "veth", "pid", "dir", "upper", "work",
             "merged", "console", "privileged", "lxc_config"}


def test_set_env_key_replaces_adds_and_leaves_no_temporary_file(tmp_path):
    env = tmp_path / "sim.env"
    env.write_text(fleet.SIM_ENV_DEFAULT)
    fleet._set_env_key(env, "SCENARIO", "oom")
    fleet._set_env_key(env, "SCENARIO_WHEN", "--tp 8")
    fleet._set_env_key(env, "MAX_TOKENS_PER_S", "500")
    lines = env.read_text().splitlines()
    assert sorted(lines) == ["MAX_TOKENS_PER_S=500", "SCENARIO=oom", "SCENARIO_WHEN=--tp 8",
                             "TIME_SCALE=0.02", "TOKENS_PER_S=400"]
    assert fleet.read_env_file(env)["SCENARIO_WHEN"] == "--tp 8"
    assert os.listdir(tmp_path) == ["sim.env"]


def test_known_hosts_entry_replaced_then_dropped(tmp_path):
    state = {"known_hosts": str(tmp_path / "known_hosts")}
    fleet._known_hosts_replace(state, "10.9.0.11", "ssh-ed25519 AAAAold root@a\n")
    fleet._known_hosts_replace(state, "10.9.0.12", "ssh-ed25519 AAAAother root@b\n")
    fleet._known_hosts_replace(state, "10.9.0.11", "ssh-ed25519 AAAAnew root@a\n")
    text = (tmp_path / "known_hosts").read_text()
    assert sorted(text.splitlines()) == ["10.9.0.11 ssh-ed25519 AAAAnew",
                                         "10.9.0.12 ssh-ed25519 AAAAother"]
    fleet._known_hosts_replace(state, "10.9.0.11", None)
    assert (tmp_path / "known_hosts").read_text() == "10.9.0.12 ssh-ed25519 AAAAother\n"


def test_state_and_host_records_have_the_documented_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_DIR", str(tmp_path))
    state = fleet.new_state("zz")
    assert set(state) == STATE_KEYS and state["bridge"] == "zzbr0"
    router, server = fleet.host_record(state, 0), fleet.host_record(state, 3)
    assert set(router) == set(server) == HOST_KEYS
    assert (router["name"], router["role"]) == ("zzrouter", "router")
    assert (server["name"], server["role"], server["veth"]) == ("zz3", "server", "vzz3")
    assert server["address"].endswith(".13") and server["dir"] == str(tmp_path / "zz3")
    state["hosts"] = [server, router]
    fleet.save_state(state)
    assert [h["index"] for h in fleet.load_state()["hosts"]] == [0, 3]
    assert fleet.find_host(state, server["address"]) is server


def test_no_state_is_an_actionable_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_DIR", str(tmp_path))
    with pytest.raises(fleet.TestbedError, match=r"run `python -m testbed up --hosts 1`"):
        fleet.current_state()


def test_baked_files_keep_the_recipe_and_their_modes():
    files = rootfs.baked_files()
    assert files["etc/ssh/sshd_config.d/10-testbed.conf"][1] == 0o644
    # no GPU node maker in the base: the nodes come from the LXC host by the config's lines
    assert not any("nvidia" in rel or "gpu-nodes" in rel for rel in files)
    assert set(rootfs.recipe()["files"]) == set(files)


def test_customise_bakes_masks_and_strips_the_host_identity(tmp_path):
    root = tmp_path / "root"
    for d in ("etc/ssh", "root", "var/lib/dbus", "var/cache/apt/archives"):
        (root / d).mkdir(parents=True)
    for f in ("etc/ssh/ssh_host_rsa_key", "etc/hostname", "var/lib/dbus/machine-id",
              "var/cache/apt/archives/x.deb"):
        (root / f).write_text("x")
    rootfs._customise(root)
    for rel, (content, mode) in rootfs.baked_files().items():
        assert (root / rel).read_text() == content
        assert (root / rel).stat().st_mode & 0o777 == mode
    for unit in rootfs.MASKED_UNITS:
        assert os.readlink(root / "etc/systemd/system" / unit) == "/dev/null"
    assert (root / "etc/machine-id").read_text() == ""
    for gone in ("etc/ssh/ssh_host_rsa_key", "etc/hostname", "var/lib/dbus/machine-id",
                 "var/cache/apt/archives/x.deb"):
        assert not (root / gone).exists()
    assert json.loads((root / ".testbed-recipe.json").read_text()) == rootfs.recipe()


def test_process_tree_and_liveness():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procs.pid_running(child.pid)
        assert child.pid in procs._descendants(os.getpid())
        # a host record whose pid is not the init of that LXC container is not alive
        assert not fleet.host_alive({"name": "x1", "pid": child.pid})
        assert not fleet.host_alive({"name": "x1", "pid": None})
    finally:
        child.kill()
        child.wait()
    assert not procs.pid_running(child.pid)


def test_host_mac_is_fixed_per_address():
    assert net.host_mac("10.213.0.11") == "02:74:0a:d5:00:0b"
    assert net.veth_name("tb1") == "vtb1"

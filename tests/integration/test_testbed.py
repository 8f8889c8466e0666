"""The testbed itself: real LXC containers with their own addresses, the GPU nodes of the LXC
host (this machine) passed in by their config, and the GPU stand-ins."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

from .helpers import run_testbed

GPU_NODES = [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]


def test_hosts_reachable_with_strict_host_key_checking(testbed, tmp_path):
    assert len(testbed.hosts) >= 1
    for host in testbed.hosts:
        r = testbed.ssh(host, "hostname", check=True)
        assert r.stdout.strip() == host
    # Strict checking is really on: an empty known_hosts file is refused.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = testbed.ssh(testbed.hosts[0], "true", known_hosts=str(empty))
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_each_host_has_its_own_address(testbed):
    addresses = [testbed.address(h) for h in testbed.hosts]
    assert len(set(addresses)) == len(addresses)
    for host in testbed.hosts:
        r = testbed.ssh(host, "ip -4 -o addr show dev eth0", check=True)
        assert f"inet {testbed.address(host)}/24" in r.stdout
    if len(testbed.hosts) > 1:  # hosts see each other (same subnet)
        a, b = testbed.hosts[:2]
        testbed.ssh(a, f"timeout 5 bash -c 'echo > /dev/tcp/{testbed.address(b)}/22'", check=True)


def test_systemd_is_pid1_in_an_lxc_container(testbed):
    for host in testbed.hosts:
        r = testbed.ssh(
            host, "cat /proc/1/comm; systemd-detect-virt; systemctl is-system-running || true",
            check=True)
        comm, virt, running = r.stdout.split()
        assert comm == "systemd"
        assert virt == "lxc"
        assert running in ("running", "degraded")


def test_gpu_device_nodes_are_char_devices(testbed):
    host = testbed.hosts[0]
    r = testbed.ssh(host, "stat -c '%n %F %t:%T' " + " ".join(GPU_NODES), check=True)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for i in range(8):
        assert lines[f"/dev/nvidia{i}"] == f"character special file c3:{i:x}"
    assert lines["/dev/nvidiactl"] == "character special file c3:ff"
    assert lines["/dev/nvidia-uvm"].startswith("character special file ")


def test_nvidia_smi_table_and_query(testbed):
    host = testbed.hosts[0]
    r = testbed.ssh(host, "nvidia-smi", check=True)
    assert "NVIDIA RTX PRO 6000 Blac" in r.stdout  # the table truncates names, like the real one
    assert "580.95.05" in r.stdout
    r = testbed.ssh(host, "nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader",
                    check=True)
    rows = [row for row in r.stdout.splitlines() if row.strip()]
    assert len(rows) == 8
    assert rows[0].startswith("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB")


def test_host_layout_matches_the_contract(testbed):
    host = testbed.hosts[0]
    r = testbed.ssh(host, "cat /etc/testbed/gpu.env; echo ---; cat /etc/testbed/sim.env", check=True)
    gpu, sim = r.stdout.split("---")
    assert "GPU_COUNT=8" in gpu and "SCENARIO=healthy" in gpu
    assert "SCENARIO=healthy" in sim and "TIME_SCALE=0.02" in sim
    r = testbed.ssh(
        host,
        "test -x /usr/bin/nvidia-smi && test -f /usr/lib/x86_64-linux-gnu/libcuda.so.1 && "
        "test -L /usr/lib/x86_64-linux-gnu/libcuda.so && test -f /opt/sglang-sim/launch_server.py "
        "&& test -f /srv/models/GLM-5-NVFP4/config.json && echo ok",
    )
    assert r.stdout.strip() == "ok", r.stderr
    # The libcuda stand-in is a real shared object the system python can load and initialise.
    r = testbed.ssh(host, "python3 -c 'import ctypes; print(ctypes.CDLL(\"libcuda.so.1\").cuInit(0))'",
                    check=True)
    assert r.stdout.strip() == "0"


def test_scenario_uvm_missing_then_healthy(testbed):
    host = testbed.hosts[-1]
    try:
        testbed.scenario(host, "uvm-missing")
        r = testbed.ssh(host, "test -e /dev/nvidia-uvm; echo $?; grep ^SCENARIO= /etc/testbed/gpu.env")
        assert r.stdout.split() == ["1", "SCENARIO=uvm-missing"]
        assert testbed.ssh(host, "test -c /dev/nvidia0").returncode == 0
    finally:
        testbed.scenario(host, "healthy")
    r = testbed.ssh(host, "test -c /dev/nvidia-uvm; echo $?; grep ^SCENARIO= /etc/testbed/gpu.env")
    assert r.stdout.split() == ["0", "SCENARIO=healthy"]


def test_scenario_gpu_missing_removes_the_last_gpu(testbed):
    host = testbed.hosts[-1]
    try:
        testbed.scenario(host, "gpu-missing")
        r = testbed.ssh(host, "ls /dev/nvidia7 /dev/nvidia6")
        assert "/dev/nvidia6" in r.stdout and "/dev/nvidia7" not in r.stdout
    finally:
        testbed.scenario(host, "healthy")
    assert testbed.ssh(host, "test -c /dev/nvidia7").returncode == 0


def test_scenario_driver_mismatch(testbed):
    host = testbed.hosts[-1]
    try:
        testbed.scenario(host, "driver-mismatch")
        r = testbed.ssh(host, "nvidia-smi")
        assert r.returncode not in (0, 255)
        assert "Failed to initialize NVML: Driver/library version mismatch" in r.stdout + r.stderr
    finally:
        testbed.scenario(host, "healthy")
    testbed.ssh(host, "nvidia-smi", check=True)


OPEN_NODES = ("python3 -c 'import os\nfor p in (\"/dev/nvidia0\", \"/dev/nvidiactl\", "
              "\"/dev/nvidia-uvm\"):\n try: os.open(p, os.O_RDWR | os.O_NONBLOCK)\n"
              " except OSError as e: print(p, e.errno)'")


def test_scenario_cgroup_denied_really_denies_opening_the_nodes(testbed):
    host = testbed.hosts[-1]
    # healthy: the cgroup permits the stand-in nodes; no driver behind them answers ENXIO (6)
    assert testbed.ssh(host, OPEN_NODES, check=True).stdout.split() == [
        "/dev/nvidia0", "6", "/dev/nvidiactl", "6", "/dev/nvidia-uvm", "6"]
    try:
        testbed.scenario(host, "cgroup-denied")
        # the nodes are there, and opening them fails with EPERM (1) from the device cgroup
        assert testbed.ssh(host, "test -c /dev/nvidia0 && test -c /dev/nvidiactl").returncode == 0
        assert testbed.ssh(host, OPEN_NODES, check=True).stdout.split() == [
            "/dev/nvidia0", "1", "/dev/nvidiactl", "1", "/dev/nvidia-uvm", "1"]
        # the stand-ins fail as the real driver does when /dev/nvidiactl cannot be opened
        smi = testbed.ssh(host, "nvidia-smi")
        assert smi.returncode == 255 and "Failed to initialize NVML: Unknown Error" in smi.stdout
        cu = testbed.ssh(host, "python3 -c 'import ctypes; print(ctypes.CDLL(\"libcuda.so.1\").cuInit(0))'")
        assert cu.stdout.strip() == "999"
    finally:
        testbed.scenario(host, "healthy")
    assert testbed.ssh(host, OPEN_NODES, check=True).stdout.split()[1::2] == ["6", "6", "6"]
    testbed.ssh(host, "nvidia-smi", check=True)


def test_server_scenario_and_healthy_resets_both(testbed):
    host = testbed.hosts[-1]
    try:
        testbed.scenario(host, "p2p-slow")
        testbed.scenario(host, "oom")
        r = testbed.ssh(host, "grep -h ^SCENARIO= /etc/testbed/gpu.env /etc/testbed/sim.env")
        assert r.stdout.split() == ["SCENARIO=p2p-slow", "SCENARIO=oom"]
    finally:
        testbed.scenario(host, "healthy")
    r = testbed.ssh(host, "grep -h ^SCENARIO= /etc/testbed/gpu.env /etc/testbed/sim.env")
    assert r.stdout.split() == ["SCENARIO=healthy", "SCENARIO=healthy"]


def test_wheelhouse_is_mounted_read_only(testbed):
    host = testbed.hosts[0]
    r = testbed.ssh(host, "ls /srv/wheelhouse; grep ' /srv/wheelhouse ' /proc/self/mounts", check=True)
    assert "sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl" in r.stdout
    assert any(line.startswith("uv-") and "manylinux" in line for line in r.stdout.splitlines())
    mount_line = r.stdout.splitlines()[-1]
    assert "ro" in mount_line.split()[3].split(",")
    r = testbed.ssh(host, "touch /srv/wheelhouse/x")
    assert r.returncode != 0 and "Read-only file system" in r.stderr


def test_wipe_gives_a_blank_reachable_host_with_a_new_key(testbed):
    host = testbed.hosts[-1]
    addr = testbed.address(host)

    def host_key():
        lines = Path(testbed.state["known_hosts"]).read_text().splitlines()
        return [ln for ln in lines if ln.split()[0] == addr]

    testbed.ssh(host, "echo precious > /root/marker && mkdir -p /opt/venv-x", check=True)
    before = host_key()
    assert len(before) == 1
    testbed.wipe(host)
    after = host_key()
    assert len(after) == 1 and after != before  # a replaced machine has a new host key
    r = testbed.ssh(host, "test -e /root/marker; echo $?; test -e /opt/venv-x; echo $?", check=True)
    assert r.stdout.split() == ["1", "1"]
    r = testbed.ssh(host, "hostname; test -c /dev/nvidia0 && grep ^SCENARIO= /etc/testbed/gpu.env",
                    check=True)
    assert r.stdout.split() == [host, "SCENARIO=healthy"]


def test_status_json_shape(testbed):
    st = testbed.status()
    assert st["up"] is True
    assert {"state_dir", "key", "known_hosts", "wheelhouse", "hosts"} <= set(st)
    assert [h["name"] for h in st["hosts"]] == testbed.hosts
    for h in st["hosts"]:
        assert set(h) == {"name", "address", "pid", "alive", "ssh", "gpu_scenario", "sim_scenario",
                          "kind", "blocked_ports"}
        assert h["blocked_ports"] == []  # `python -m testbed block` was not used
        assert h["kind"] == "unprivileged"  # `python -m testbed kind` left every host as booted
        assert h["alive"] is True and h["ssh"] is True
        assert h["address"] == testbed.address(h["name"])
        assert isinstance(h["pid"], int)


def test_up_is_idempotent(testbed):
    pids = {h["name"]: h["pid"] for h in testbed.reload()["hosts"]}
    run_testbed("up", "--hosts", str(len(testbed.hosts)), timeout=300)
    assert {h["name"]: h["pid"] for h in testbed.reload()["hosts"]} == pids


def test_pyinfra_inventory_connects_strictly(testbed, tmp_path):
    pyinfra = Path(sys.executable).with_name("pyinfra")
    # From an empty folder: this checks the inventory alone, not the deploy's config.py.
    r = subprocess.run(
        [str(pyinfra), "-y", str(testbed.inventory), "exec", "--", "hostname"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for host in testbed.hosts:
        assert f"[{host}] {host}" in r.stdout + r.stderr


def test_inventory_data(testbed):
    ns = runpy.run_path(str(testbed.inventory))
    hosts = dict(ns["testbed"])
    assert list(hosts) == testbed.hosts
    data = hosts[testbed.hosts[0]]
    assert data["ssh_hostname"] == testbed.address(testbed.hosts[0])
    assert data["ssh_strict_host_key_checking"] == "yes"
    assert data["ssh_known_hosts_file"] == testbed.state["known_hosts"]
    assert data["sglang_wheelhouse"] == "/srv/wheelhouse"
    json.dumps(data)  # plain data only


def test_hosts_are_unprivileged_lxc_containers_with_the_passthrough_lines(testbed):
    """Each host is an LXC container of the testbed's lxcpath, its root mapped to 100000 as
    Proxmox maps it, its config holding the passthrough block with one device rule per
    major and one bind mount per node of this machine."""
    host = testbed.hosts[0]
    lxcpath = Path(testbed.state["state_dir"]) / "lxc"
    r = subprocess.run(["lxc-info", "-P", str(lxcpath), "-n", host, "-sH"], capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == "RUNNING"
    assert testbed.ssh(host, "cat /proc/self/uid_map", check=True).stdout.split() == [
        "0", "100000", "65536"]
    config = (lxcpath / host / "config").read_text()
    block = config[config.index("# BEGIN sglang-deploy"):config.index("# END sglang-deploy")]
    rules = [ln for ln in block.splitlines() if ln.startswith("lxc.cgroup.devices.allow")]
    assert rules[0] == "lxc.cgroup.devices.allow = c 195:* rwm" and len(rules) == 2
    mounts = [ln.split()[2] for ln in block.splitlines() if ln.startswith("lxc.mount.entry")]
    assert mounts == [*GPU_NODES, "/dev/nvidia-uvm-tools"]
    # the nodes inside are this machine's (same major and minor), not made in the container
    inside = testbed.ssh(host, "stat -c '%n %t:%T' /dev/nvidia0 /dev/nvidia-uvm", check=True)
    for line in inside.stdout.splitlines():
        path, numbers = line.split()
        st = Path(path).stat()
        assert numbers == f"{os.major(st.st_rdev):x}:{os.minor(st.st_rdev):x}"
    # no mknod inside an unprivileged container: the LXC host passes the nodes
    r = testbed.ssh(host, "mknod /dev/testbed-null c 1 3 && cat /dev/testbed-null; "
                          "echo rc=$?; rm -f /dev/testbed-null")
    assert "rc=0" not in r.stdout, r.stdout + r.stderr
    # the device cgroup is in force (common.conf's rules set again after userns.conf cleared
    # them): no blanket `a *:* rwm`, the passthrough's GPU major listed, so a wrong rule of
    # lxc_host.py would keep the GPUs shut
    listed = subprocess.run(["lxc-cgroup", "-P", str(lxcpath), "-n", host, "devices.list"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert "a *:* rwm" not in listed and "c 195:* rwm" in listed, listed

"""The simulator's multi-node group across two testbed hosts (`python -m testbed up --group 2`),
run by hand (no deploy renders groups here): the container's /usr/bin/python3 runs
/opt/sglang-sim/launch_server.py beside the real sglang wheel unpacked from the read-only
wheelhouse, with the argv a group's nodes get (same flags + --nnodes/--node-rank/--dist-init-addr).

- the rendezvous crosses the testbed network: rank 0 (TB1) serves /health, node 1 (TB2) only
  the dummy health server;
- with rank 0's dist-init port blocked (`python -m testbed block TB1 PORT`, a DROP) node 1
  logs c10d's failed connect and dies at the (scaled) distributed timeout, rank 0 never loads;
- with rank 0's ephemeral ports blocked (NCCL's bootstrap root) node 1 fails with NCCL's lines.
"""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request

import pytest

from .helpers import run_testbed

SITE = "/tmp/sglang-site"
MODEL = "/srv/models/GLM-5-NVFP4"
DPORT = 50000
HTTP_PORT = 30000


@pytest.fixture
def group2(testbed):
    """TB1 and TB2 recorded as one group (the inventory's view), the wheel unpacked on both;
    afterwards the group is removed again and no simulator is left running."""
    servers = [h["name"] for h in testbed.state["hosts"] if h.get("role") != "router"]
    run_testbed("up", "--hosts", str(len(servers)), "--group", "2", timeout=300)
    group = json.loads(run_testbed("status", "--json").stdout)["groups"][0]
    a, b = group["hosts"]
    unpack = (f"test -f {SITE}/sglang/srt/server_args.py || python3 -c 'import glob, zipfile; "
              "zipfile.ZipFile(glob.glob(\"/srv/wheelhouse/sglang-*.whl\")[0])"
              f".extractall(\"{SITE}\")'")
    for h in (a, b):
        # the simulator nodes take the GPUs and port 30000 that a deployed server would hold
        # (an earlier module's group leaves its units running); stopped, left to later deploys
        testbed.ssh(h, "systemctl stop sglang-watchdog.service sglang.service 2>/dev/null; "
                       "! systemctl is-active -q sglang.service", check=True)
        testbed.ssh(h, unpack, check=True, timeout=300)
    pids: dict[str, list[int]] = {a: [], b: []}
    try:
        yield a, b, pids
    finally:
        for h, started in pids.items():
            for pid in started:
                testbed.ssh(h, f"kill -9 {pid} 2>/dev/null; true")
        run_testbed("unblock", a, str(DPORT), check=False)
        run_testbed("up", "--hosts", str(len(servers)), "--group", "0", timeout=300)


def start_node(tb, pids: dict, host: str, rank: int, rank0_addr: str, time_scale: str) -> int:
    """The simulator as node RANK on HOST, in the background; its pid."""
    env = f"/tmp/sim-node{rank}.env"
    argv = ["--model-path", MODEL, "--tp-size", "16", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", f"{rank0_addr}:{DPORT}", "--host", tb.address(host),
            "--port", str(HTTP_PORT), "--disable-cuda-graph"]
    cmd = (f"printf 'SCENARIO=healthy\\nTIME_SCALE={time_scale}\\nREADY_FILE=/tmp/sim-ready{rank}.json\\n' > {env}; "
           f"rm -f /tmp/sim-node{rank}.log; TESTBED_SIM_ENV={env} PYTHONPATH={SITE} "
           f"SGLANG_CACHE_DIR=/tmp/sim-cache setsid python3 /opt/sglang-sim/launch_server.py "
           f"{shlex.join(argv)} > /tmp/sim-node{rank}.log 2>&1 < /dev/null & echo $!")
    pid = int(tb.ssh(host, cmd, check=True).stdout.split()[-1])
    pids[host].append(pid)
    return pid


def log_of(tb, host: str, rank: int) -> str:
    return tb.ssh(host, f"cat /tmp/sim-node{rank}.log").stdout


def running(tb, host: str, pid: int) -> bool:
    return tb.ssh(host, f"kill -0 {pid}").returncode == 0


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_group_rendezvous_across_hosts(testbed, group2):
    a, b, pids = group2
    rank0 = testbed.address(a)
    start_node(testbed, pids, b, 1, rank0, "0.01")   # the worker first: it retries until rank 0 listens
    start_node(testbed, pids, a, 0, rank0, "0.01")
    testbed.wait_for("rank 0 ready", lambda: "fired up and ready to roll" in log_of(testbed, a, 0),
                     timeout=120)
    assert get(f"http://{rank0}:{HTTP_PORT}/health")[0] == 200
    node1 = f"http://{testbed.address(b)}:{HTTP_PORT}"
    testbed.wait_for("node 1's health server",
                     lambda: "Dummy health check server started" in log_of(testbed, b, 1),
                     timeout=60, describe=lambda: log_of(testbed, b, 1)[-2000:])
    assert get(node1 + "/health") == (200, b"")
    assert get(node1 + "/generate")[0] == 404
    text = log_of(testbed, b, 1)
    assert " TP8] Load weight end." in text and " TP15] Load weight end." in text
    assert " TP0]" not in text and "fired up" not in text


def test_blocked_dist_init_port_fails_node1_at_the_timeout(testbed, group2):
    a, b, pids = group2
    rank0 = testbed.address(a)
    assert f"blocked ports {DPORT}" in run_testbed("block", a, str(DPORT)).stdout
    start_node(testbed, pids, a, 0, rank0, "0.005")   # listens, waits for node 1 (9 s scaled timeout)
    node1 = start_node(testbed, pids, b, 1, rank0, "0.005")
    testbed.wait_for("node 1 to exit", lambda: not running(testbed, b, node1), timeout=120)
    text = log_of(testbed, b, 1)
    assert f"[c10d] The client socket has failed to connect to [{rank0}]:{DPORT}" in text
    assert ("torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms "
            f"while trying to connect to ({rank0}, {DPORT}).") in text
    assert "Received sigquit from a child process" in text
    assert "Load weight begin" not in log_of(testbed, a, 0)


def test_blocked_nccl_ports_fail_node1_with_nccls_lines(testbed, group2):
    """The store rendezvous passes (50000 open) but NCCL's bootstrap root, on an ephemeral port
    of rank 0, is dropped: node 1 prints NCCL's socketPollConnect lines and the NCCL error."""
    a, b, pids = group2
    rank0 = testbed.address(a)
    for ports in ("32768-49999", "50001-60999"):   # the ephemeral range except the store's port
        run_testbed("block", a, ports)
    try:
        start_node(testbed, pids, a, 0, rank0, "0.005")
        node1 = start_node(testbed, pids, b, 1, rank0, "0.005")
        testbed.wait_for("node 1 to exit", lambda: not running(testbed, b, node1), timeout=180)
    finally:
        for ports in ("32768-49999", "50001-60999"):
            run_testbed("unblock", a, ports, check=False)
    text = log_of(testbed, b, 1)
    assert f"NCCL WARN socketPollConnect: Connect to {rank0}<" in text
    assert "returned 110(Connection timed out)" in text
    assert "torch.distributed.DistBackendError: NCCL error in:" in text
    assert "Received sigquit from a child process" in text

"""A multi-node group on the testbed (`python -m testbed up --hosts 3 --group 2 --router`): tb1
(rank 0) and tb2 (rank 1) serve one model, tb3 alone, all three behind the router.

- the deploy verifies the group as one (rank 0 serves, node 1 up), the router lists rank 0
  and tb3 only, `status --json` shows the group serving, and a second run changes nothing;
- a rollout under a steady load through the router restarts the group as one step with no
  failed request;
- rank 0's dist-init port blocked: the group pre-flight fails naming the node pair and the
  port, and no node of the group is stopped;
- a node crashing in CUDA graph capture: the group fails fast, naming the node and the cause,
  and every node is stopped (nothing waits for NCCL's timeouts);
- a node on another lock: refused before any connection.

Each test sets up what it needs (the `group` fixture redeploys when the group does not serve).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from bench import router_load

from .helpers import REPO, both, changed, run_testbed

BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
PYINFRA = str(BIN / "pyinfra")
FAULT_INVENTORY = Path(__file__).with_name("fault_inventory.py")
DATA = ["gpu_p2p_min_gbps=0.05"]
SEED_FLAGS = {"tp-size": 16, "quantization": "modelopt_fp4",
              "moe-runner-backend": "flashinfer_cutlass",
              "enable-flashinfer-allreduce-fusion": True, "disable-cuda-graph": True,
              "trust-remote-code": True}


def deploy(testbed, *args: str, inventory=None, env=None, timeout: float = 900):
    argv = [PYINFRA, "-y", str(inventory or testbed.inventory), "deploy.py", *args]
    for d in DATA:
        argv += ["--data", d]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    testbed.log.append(r)
    return r


def tool(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def status(testbed) -> tuple[int, dict]:
    r = tool("status", str(testbed.inventory), "--json", *[a for d in DATA for a in ("--data", d)])
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {})


def invocation(testbed, host: str) -> str:
    return testbed.ssh(host, "systemctl show -p InvocationID --value sglang.service",
                       check=True).stdout.strip()


def active(testbed, host: str) -> str:
    return testbed.ssh(host, "systemctl is-active sglang.service").stdout.strip()


@pytest.fixture(scope="module")
def grouped(testbed):
    """3 hosts (tb1, tb2 one group) and the router; removed again when the module ends."""
    try:
        run_testbed("up", "--hosts", "3", "--group", "2", "--router", timeout=900)
        testbed.reload()
        yield testbed
    finally:
        run_testbed("down", "--router", timeout=300)
        run_testbed("up", "--hosts", "3", "--group", "0", timeout=300)
        testbed.reload()


@pytest.fixture
def group(grouped):
    """The fleet converged and serving: (rank 0, rank 1, the single host)."""
    tb = grouped
    g = json.loads(run_testbed("status", "--json").stdout)["groups"][0]["hosts"]
    single = next(h["name"] for h in tb.state["hosts"]
                  if h.get("role") != "router" and h["name"] not in g)
    rc, doc = status(tb)
    if rc != 0:
        r = deploy(tb)
        assert r.returncode == 0, both(r)[-5000:]
    return g[0], g[1], single


def test_a_group_and_a_single_host_behind_the_router_deploy_verify_and_converge(group, grouped):
    rank0, rank1, single = group
    r = deploy(grouped)
    assert r.returncode == 0, both(r)[-4000:]
    assert changed(r.stdout + r.stderr) == [], both(r)[-3000:]   # converged: nothing changes
    rc, doc = status(grouped)
    assert rc == 0, doc
    [g] = doc["groups"]
    assert g["nodes"] == [rank0, rank1] and g["state"] == "serving"
    rows = {h["host"]: h for h in doc["hosts"]}
    assert (rows[rank0]["group"], rows[rank0]["node_rank"]) == (g["name"], 0)
    assert (rows[rank1]["group"], rows[rank1]["node_rank"]) == (g["name"], 1)
    assert rows[single]["group"] is None
    listed = {w["host"] for w in doc["router"]["workers"]}
    assert listed == {rank0, single}   # only rank 0 of the group serves HTTP


def test_a_rollout_under_load_restarts_the_group_as_one_step_without_a_failed_request(group, grouped):
    rank0, rank1, single = group
    st = grouped.state
    router = next(h for h in st["hosts"] if h.get("role") == "router")
    key = (Path(st["state_dir"]) / "router-key").read_text().strip()
    before = {h: invocation(grouped, h) for h in (rank0, rank1)}
    report = REPO / ".sglang-deploy" / f"group-rollout-{uuid.uuid4().hex[:8]}.json"
    report.parent.mkdir(exist_ok=True)
    data = [*DATA, f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}']

    def roll():
        return tool("rollout", str(grouped.inventory), "--report", str(report),
                    *[a for d in data for a in ("--data", d)])

    result, r = router_load.run_through(f"http://{router['address']}:30000", key, "glm-5", roll)
    s = result.summary()
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "1. " + ", ".join([rank0, rank1]) in r.stdout   # the group is one step
    doc = json.loads(report.read_text())
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert {hosts[h]["status"] for h in (rank0, rank1, single)} == {"done"}
    assert hosts[rank0]["router"] == "back" and hosts[rank1]["router"] is None
    assert all(invocation(grouped, h) != before[h] for h in (rank0, rank1))
    assert s["during"]["requests"] > 0 and s["during"]["failed"] == 0, s
    assert s["before"]["failed"] == 0, s


def test_rank_0_unreachable_fails_the_group_preflight_and_stops_no_node(group, grouped):
    rank0, rank1, _ = group
    before = {h: invocation(grouped, h) for h in (rank0, rank1)}
    run_testbed("block", rank0, "50000")
    try:
        r = deploy(grouped, "--limit", rank0, "--limit", rank1, "--data",
                   f'sglang_env={{"BLOCKED": "{uuid.uuid4().hex[:6]}"}}')
    finally:
        run_testbed("unblock", rank0, "50000", check=False)
    out = both(r)
    assert r.returncode != 0
    assert "group pre-flight failed" in out
    assert f"{rank1} <-> {rank0}: {rank1} cannot reach" in out and ":50000 (torch's rendezvous" in out
    assert f"open TCP 50000 on {rank0}" in out
    assert {h: invocation(grouped, h) for h in (rank0, rank1)} == before   # nothing stopped


def test_a_node_crashing_in_capture_fails_the_group_fast_and_stops_every_node(group, grouped):
    rank0, rank1, _ = group
    flags = {k: v for k, v in SEED_FLAGS.items() if k != "disable-cuda-graph"}
    grouped.scenario(rank1, "node-capture-crash")
    try:
        r = deploy(grouped, "--limit", rank0, "--limit", rank1, inventory=FAULT_INVENTORY,
                   env={"FAULT_HOST_DATA": json.dumps({h: {"sglang_flags": flags}
                                                       for h in (rank0, rank1)})})
        out = both(r)
        assert r.returncode != 0
        assert "Capture cuda graph failed" in out and "phase `capture`" in out
        # the verifier reports what it saw first, which depends on timing: the process gone
        # (`the server exited`), the fatal lines while it was still dying (`fatal error`), or
        # the unit already restarted by systemd (`it crashed`)
        assert re.search(rf"node {rank1} failed: [^\n]*(server exited|fatal error|crashed) "
                         r"in phase `capture`", out), out[-5000:]
        assert f"{rank0} was stopped with the group" in out
        assert active(grouped, rank0) != "active" and active(grouped, rank1) != "active"
        # the node's own journal, read and explained per node
        lg = tool("logs", str(grouped.inventory), rank1, "--explain", "--json")
        assert lg.returncode == 1, (lg.stdout + lg.stderr)[-3000:]
        got = json.loads(lg.stdout)
        assert (got["outcome"], got["phase"], got["cause"]) == ("failed", "capture", "cuda-oom"), got
    finally:
        grouped.scenario(rank1, "healthy")


def test_a_node_on_another_lock_is_refused_before_any_connection(group, grouped):
    rank0, rank1, _ = group
    r = deploy(grouped, "--limit", rank0, "--limit", rank1, inventory=FAULT_INVENTORY,
               env={"FAULT_HOST_DATA": json.dumps({rank1: {"sglang_lock": "locks/glm5-blackwell.txt"}})})
    out = both(r)
    assert r.returncode != 0
    assert "the same `sglang_lock` on every node of group" in out
    assert "locks/glm5-blackwell.txt" in out
    assert "Connecting to hosts" not in out


def test_the_allreduce_check_runs_across_the_groups_nodes_while_they_are_stopped(group, grouped):
    """`gpu_allreduce_check` on a group that restarts: one operation on both nodes at once,
    between the group's stop and start, 16 ranks over the testbed network (the torch
    stand-in of `gpu_allreduce_env`: a real TCP sum, no NCCL), then the group serves."""
    rank0, rank1, single = group
    before = invocation(grouped, single)
    r = deploy(grouped, "--limit", rank0, "--limit", rank1, "--data", "gpu_allreduce_check=true",
               "--data", f'sglang_env={{"ALLREDUCE": "{uuid.uuid4().hex[:6]}"}}')
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    assert "All-reduce (NCCL) over 16 GPUs of group" in out
    for h in (rank0, rank1):
        assert any(f"[{h}]" in line and "all-reduce over 16 GPUs" in line
                   for line in out.splitlines()), out[-4000:]
    order = [line for line in out.splitlines() if "--> Starting operation" in line]
    stop = next(i for i, line in enumerate(order) if "restarts as one" in line)
    check = next(i for i, line in enumerate(order) if "All-reduce (NCCL)" in line)
    start = next(i for i, line in enumerate(order) if "with group" in line and "Start" in line)
    # each node's P2P retest (its copies were skipped while it served) on the stopped group
    retest = next(i for i, line in enumerate(order) if "P2P will be retested" in line)
    assert stop < retest < check < start
    rc, doc = status(grouped)
    assert doc["groups"][0]["state"] == "serving", doc
    assert invocation(grouped, single) == before   # outside the run: untouched


def test_the_groups_allreduce_check_works_with_a_pool_of_one(group, grouped):
    """`gpu_allreduce_check` with `--parallel 1`: started in the background on every node by
    one operation, each node's output collected on its own host by the next, so no node
    waits for a peer the pool has not started; the group then serves."""
    rank0, rank1, _ = group
    r = deploy(grouped, "--parallel", "1", "--limit", rank0, "--limit", rank1,
               "--data", "gpu_allreduce_check=true",
               "--data", f'sglang_env={{"ALLREDUCE1": "{uuid.uuid4().hex[:6]}"}}')
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    order = [line for line in out.splitlines() if "--> Starting operation" in line]
    started = next(i for i, line in enumerate(order) if "started on every node" in line
                   and "All-reduce (NCCL)" in line)
    collected = next(i for i, line in enumerate(order) if "each node's result" in line)
    assert started + 1 == collected, order
    for h in (rank0, rank1):
        assert any(f"[{h}]" in line and "all-reduce over 16 GPUs" in line
                   for line in out.splitlines()), out[-4000:]
    rc, doc = status(grouped)
    assert doc["groups"][0]["state"] == "serving", doc


def test_a_failing_allreduce_names_the_rank_and_leaves_the_group_stopped(group, grouped):
    """Rank 0's all-reduce rendezvous port (dist-init port + 1) dropped: node 1's ranks
    cannot connect; the check fails within its deadline naming the failure, on the nodes
    that were stopped for it (documented: the group stays down until the next deploy)."""
    rank0, rank1, _ = group
    run_testbed("block", rank0, "50001")
    try:
        r = deploy(grouped, "--limit", rank0, "--limit", rank1, "--data", "gpu_allreduce_check=true",
                   "--data", "gpu_allreduce_timeout_s=15",
                   "--data", f'sglang_env={{"ALLREDUCE": "{uuid.uuid4().hex[:6]}"}}')
    finally:
        run_testbed("unblock", rank0, "50001", check=False)
    out = both(r)
    assert r.returncode != 0
    assert "the NCCL all-reduce over" in out and "failed" in out
    assert "NCCL_DEBUG=INFO" in out        # the fix repeats the command by hand
    assert active(grouped, rank0) != "active" and active(grouped, rank1) != "active"


def test_rebuild_of_a_groups_node_brings_the_group_back_as_one(group, grouped):
    rank0, rank1, _ = group
    before = invocation(grouped, rank0)
    grouped.wipe(rank1)
    r = tool("rebuild", str(grouped.inventory), rank1, "--json",
             *[a for d in DATA for a in ("--data", d)])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    doc = json.loads(r.stdout)
    assert [(h["host"], h["ok"]) for h in doc["hosts"]] == [(rank0, True), (rank1, True)]
    assert invocation(grouped, rank0) != before   # the group restarted as one
    rc, st = status(grouped)
    assert st["groups"][0]["state"] == "serving", st


def test_a_group_that_fails_in_a_rollout_is_rolled_back_whole(group, grouped):
    """Rank 0 fails with the new flags (the `rank-fail` scenario only for launches with
    `--mem-fraction-static 0.71`): the group fails fast, the rollout halts and rolls both
    nodes back to their known-good configuration; the single host is not touched."""
    rank0, rank1, single = group
    before = invocation(grouped, single)
    grouped.scenario(rank0, "rank-fail", when="--mem-fraction-static 0.71")
    report = REPO / ".sglang-deploy" / f"group-rollback-{uuid.uuid4().hex[:8]}.json"
    report.parent.mkdir(exist_ok=True)
    flags = json.dumps({**SEED_FLAGS, "mem-fraction-static": 0.71})
    try:
        r = tool("rollout", str(grouped.inventory), "--report", str(report),
                 *[a for d in [*DATA, f"sglang_flags={flags}"] for a in ("--data", d)])
    finally:
        grouped.scenario(rank0, "healthy")
    assert r.returncode != 0
    doc = json.loads(report.read_text())
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts[rank0]["status"] == "rolled-back" and hosts[rank1]["status"] == "rolled-back", doc
    assert hosts[single]["status"] == "untouched"
    assert invocation(grouped, single) == before
    rc, st = status(grouped)
    assert st["groups"][0]["state"] == "serving", st


def test_a_node_lost_while_serving_shows_in_status_and_the_next_deploy_restarts_its_group(group, grouped):
    """Node 1's server gone (its unit stopped: rank 0 then loses its peer, as when a node
    dies): `status` says the group does not serve and names the node; the next deploy
    restarts the group as one (rank 0 too, whatever state its unit is in) and it serves."""
    rank0, rank1, _ = group
    before = invocation(grouped, rank0)
    grouped.ssh(rank1, "systemctl stop sglang.service", check=True)
    rc, doc = status(grouped)
    assert rc == 1 and doc["groups"][0]["state"] != "serving", doc
    assert rank1 in (doc["groups"][0]["problem"] or ""), doc
    r = deploy(grouped, "--limit", rank0, "--limit", rank1)
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    assert "rendezvous passed" in out
    assert invocation(grouped, rank0) != before
    # the run (--limit: the router host outside it) does not wait for the router's own
    # health check to take rank 0's new server back; status says ready once it has
    seen: list = []

    def serving() -> bool:
        seen[:] = status(grouped)
        return seen[0] == 0 and seen[1]["groups"][0]["state"] == "serving"
    grouped.wait_for("status: the group serving, every worker ready in the router", serving,
                     timeout=120, describe=lambda: f"the last status (rc, --json): {seen}")


def test_a_group_deploys_new_flags_with_a_pool_of_one(group, grouped):
    """`--parallel 1` (the pool a 41st host meets on a 2-CPU laptop): no operation waits for
    another host's, so the group restarts and is verified as one, one host at a time."""
    rank0, rank1, single = group
    before = {h: invocation(grouped, h) for h in (rank0, rank1, single)}
    r = deploy(grouped, "--parallel", "1",
               "--data", f'sglang_env={{"POOL1": "{uuid.uuid4().hex[:6]}"}}')
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    assert out.count("rendezvous passed") == 2, out[-4000:]
    assert f"UP {rank1}: node 1 of group" in out and f"READY {rank0}:" in out
    after = {h: invocation(grouped, h) for h in (rank0, rank1, single)}
    assert all(after[h] != before[h] for h in (rank0, rank1, single))
    rc, doc = status(grouped)
    assert doc["groups"][0]["state"] == "serving", doc   # (rc 1: drift from the inventory)


def test_serial_is_refused_before_connecting_for_a_group(group, grouped):
    rank0, rank1, _ = group
    before = {h: invocation(grouped, h) for h in (rank0, rank1)}
    r = deploy(grouped, "--serial", "--data", f'sglang_env={{"SERIAL": "{uuid.uuid4().hex[:6]}"}}')
    out = both(r)
    assert r.returncode != 0
    assert "no --serial for a selection with a multi-node group" in out and "drop --serial" in out
    assert "Connecting to hosts" not in out
    assert {h: invocation(grouped, h) for h in (rank0, rank1)} == before


def test_a_rollout_rolls_a_group_back_as_one_after_a_rank_1_failure(group, grouped):
    """Node 1 crashes in CUDA graph capture with the new flags: the group fails fast, the
    rollout rolls both nodes back (the group's rendezvous, then stopped and started as one on
    the known-good configuration) and the group serves again; the single host is untouched."""
    rank0, rank1, single = group
    before = invocation(grouped, single)
    grouped.scenario(rank1, "node-capture-crash", when="--mem-fraction-static 0.72")
    report = REPO / ".sglang-deploy" / f"group-rank1-{uuid.uuid4().hex[:8]}.json"
    report.parent.mkdir(exist_ok=True)
    flags = {k: v for k, v in SEED_FLAGS.items() if k != "disable-cuda-graph"}
    flags = json.dumps({**flags, "mem-fraction-static": 0.72})
    try:
        r = tool("rollout", str(grouped.inventory), "--report", str(report),
                 *[a for d in [*DATA, f"sglang_flags={flags}"] for a in ("--data", d)])
    finally:
        grouped.scenario(rank1, "healthy")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    doc = json.loads(report.read_text())
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts[rank0]["status"] == "rolled-back" and hosts[rank1]["status"] == "rolled-back", doc
    assert hosts[single]["status"] == "untouched"
    assert "Capture cuda graph failed" in out or "capture" in json.dumps(doc), out[-3000:]
    assert invocation(grouped, single) == before
    rc, st = status(grouped)
    assert st["groups"][0]["state"] == "serving", st


def test_a_group_rolled_back_with_a_node_stopped_goes_back_as_one_with_its_rendezvous(group, grouped):
    """rollback.py on a group whose node 1 is stopped, with a pool of one: the same
    rendezvous as a deploy's, then both nodes stopped and started as one on the known-good
    configuration, verified as one; the group serves."""
    rank0, rank1, _ = group
    before = invocation(grouped, rank0)
    grouped.ssh(rank1, "systemctl stop sglang.service", check=True)
    argv = [PYINFRA, "-y", str(grouped.inventory), "rollback.py", "--parallel", "1",
            "--limit", rank0, "--limit", rank1, *[a for d in DATA for a in ("--data", d)]]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    assert out.count("rendezvous passed") == 2, out[-4000:]
    order = [line for line in out.splitlines() if "--> Starting operation" in line]
    judged = next(i for i, line in enumerate(order) if "rendezvous of group" in line
                  and "judged" in line)
    stop = next(i for i, line in enumerate(order) if "goes back as one" in line)
    assert judged < stop
    assert f"UP {rank1}: node 1 of group" in out and f"READY {rank0}:" in out
    assert invocation(grouped, rank0) != before   # rank 0 restarted with its group
    rc, doc = status(grouped)
    assert rc == 0 and doc["groups"][0]["state"] == "serving", doc


def test_a_node_restarted_only_because_its_peer_changed_runs_the_jit_check_and_smoke(group, grouped):
    """New data on node 1 only, with a pool of one: rank 0 has nothing of its own to change,
    yet restarts with its group, so it runs the JIT check and the release smoke first."""
    rank0, rank1, _ = group
    before = invocation(grouped, rank0)
    r = deploy(grouped, "--parallel", "1", "--limit", rank0, "--limit", rank1,
               inventory=FAULT_INVENTORY, env={"FAULT_HOST_DATA": json.dumps(
                   {rank1: {"sglang_env": {"PEER": uuid.uuid4().hex[:6]}}})})
    out = both(r)
    assert r.returncode == 0, out[-5000:]
    lines = out.splitlines()
    for h in (rank0, rank1):
        assert any(f"[{h}]" in line and "JIT toolchain: nvcc" in line for line in lines), out[-4000:]
        assert any(f"[{h}]" in line and "release smoke:" in line for line in lines), out[-4000:]
        # P2P retested once the group stopped, never while the nodes were prepared
        assert any(f"[{h}]" in line and "P2P before restarting sglang:" in line
                   for line in lines), out[-4000:]
    assert invocation(grouped, rank0) != before
    # why rank 0 restarted, kept on it: its peer changed
    last = json.loads(grouped.ssh(rank0, "cat /opt/sglang/last-verified.json",
                                  check=True).stdout)["last_restart"]
    assert last["why"].startswith(f"peer changed: {rank1} ("), last

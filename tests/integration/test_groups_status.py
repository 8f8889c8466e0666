"""`sglang-deploy status` on a deployed multi-node group (`python -m testbed up --group 2`):
the group is one unit.

- a --limit naming the rank-1 node alone shows both nodes, rank 0 first, each with its
  group and rank, and the group `serving` (the rank-1 node has no /v1/models and is not
  judged by it); the group's name is a --limit too; the rank-1 node's journal is explained
  as a ready worker of rank 1 of that group;
- with the rank-1 node's unit stopped, the group is not serving, its problem names that
  node, and status exits 1 (the text output says so on the group's line).

(Written for the testbed; it needs the group deploy, stages/group/groupops.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .helpers import both, pyinfra_deploy, run_testbed

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"


def status(testbed, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), "status", str(testbed.inventory), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def deployed_group(testbed):
    """Two testbed hosts deployed as one group; afterwards the group is gone again (its
    hosts are redeployed as single servers by the next test that needs them)."""
    servers = [h["name"] for h in testbed.state["hosts"] if h.get("role") != "router"]
    run_testbed("up", "--hosts", str(len(servers)), "--group", "2", timeout=300)
    testbed.reload()
    rank0, rank1 = json.loads(run_testbed("status", "--json").stdout)["groups"][0]["hosts"]
    try:
        r = pyinfra_deploy([rank0, rank1])
        assert r.returncode == 0, both(r)[-4000:]
        assert "answers None" not in both(r)  # each wait names what /health said
        yield rank0, rank1
    finally:
        testbed.ssh(rank1, "systemctl start sglang.service")
        run_testbed("up", "--hosts", str(len(servers)), "--group", "0", timeout=300)
        testbed.reload()


def test_status_shows_a_group_as_one_unit(testbed, deployed_group):
    rank0, rank1 = deployed_group
    r = status(testbed, "--limit", rank1, "--json")
    doc = json.loads(r.stdout)
    assert [(h["host"], h["node_rank"]) for h in doc["hosts"]] == [(rank0, 0), (rank1, 1)]
    name = doc["hosts"][0]["group"]
    assert name and doc["hosts"][1]["group"] == name
    worker = doc["hosts"][1]
    assert worker["health"] == 200 and worker["unit"] == "active/running" and worker["models"] == []
    assert doc["groups"] == [{"name": name, "nodes": [rank0, rank1],
                              "dist_init_addr": f"{testbed.address(rank0)}:50000",
                              "state": "serving", "problem": None}]
    assert r.returncode == 0, both(r)

    # the group's name, as status shows it, is a --limit of its own
    by_name = json.loads(status(testbed, "--limit", name, "--json").stdout)
    assert [h["host"] for h in by_name["hosts"]] == [rank0, rank1]
    # the rank-1 node's own journal: a worker, ready once its dummy health server started
    lg = subprocess.run([str(BIN / "sglang-deploy"), "logs", str(testbed.inventory), rank1,
                         "--explain", "--json"], cwd=REPO, capture_output=True, text=True,
                        timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert lg.returncode == 0, both(lg)
    explained = json.loads(lg.stdout)
    assert explained["outcome"] == "ready" and explained["worker"]["node_rank"] == 1
    assert explained["summary"].startswith(f"worker of rank 1 of group {name} (2 nodes, ")

    testbed.ssh(rank1, "systemctl stop sglang.service", check=True)
    r = status(testbed, "--json")
    group = json.loads(r.stdout)["groups"][0]
    assert group["state"] in ("degraded", "down") and f"{rank1} (rank 1): unit inactive" in group["problem"]
    assert r.returncode == 1
    text = status(testbed)
    assert text.returncode == 1
    assert any(line.startswith(f"group {name} ({rank0}, {rank1}; ") and rank1 in line.split(": ", 1)[1]
               for line in text.stdout.splitlines()), text.stdout

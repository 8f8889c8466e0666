"""The routed fleet of the router tests (test_router.py, test_rollout_staging.py): the 3 testbed
hosts and the router host deployed (`routed`, module scope: the router host is removed when
the module ends), the state every such test starts from (`fleet`), and the helpers that run
pyinfra, `sglang-deploy`, rollouts and load through the router."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench import router_load

from .helpers import REPO, run_testbed

BIN = Path(sys.executable).parent
PYINFRA = str(BIN / "pyinfra")
SEED_FLAGS = {
    "tp-size": 8, "quantization": "modelopt_fp4", "moe-runner-backend": "flashinfer_cutlass",
    "enable-flashinfer-allreduce-fusion": True, "disable-cuda-graph": True,
    "trust-remote-code": True,
}
# The simulated peer copies are paced host memcpy on a shared 2-core machine: under the load
# test their speed drops below the testbed's 1 GB/s; this test is about the router.
DATA = ["gpu_p2p_min_gbps=0.05"]
RESULTS: dict = {}


@pytest.fixture(scope="module")
def routed(testbed):
    """The 3 hosts and the router host, deployed and verified. The router host is removed when
    the module ends, also after a failed set-up: the other modules' inventory has no `routers`
    group (their fixtures redeploy the servers)."""
    try:
        run_testbed("up", "--hosts", "3", "--router", timeout=900)
        testbed.reload()
        r = pyinfra("deploy.py", testbed)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        yield testbed
        out = os.environ.get("ROUTER_LOAD_RESULTS")
        if out:
            Path(out).write_text(json.dumps(RESULTS, indent=2) + "\n")
    finally:
        run_testbed("down", "--router", timeout=300)
        testbed.reload()


def pyinfra(deploy: str, testbed, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [PYINFRA, "-y", str(testbed.inventory), deploy, *args]
    for d in DATA:
        argv += ["--data", d]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    testbed.log.append(r)
    return r


def tool(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "sglang-deploy"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def router_of(testbed) -> tuple[str, str, list[str]]:
    """(router URL, its key, the worker URLs) from the testbed state."""
    st = testbed.state
    router = next(h for h in st["hosts"] if h.get("role") == "router")
    key = (Path(st["state_dir"]) / "router-key").read_text().strip()
    workers = [f"http://{h['address']}:30000" for h in st["hosts"] if h.get("role") != "router"]
    return f"http://{router['address']}:30000", key, workers


def servers(testbed) -> list[str]:
    return [h["name"] for h in testbed.state["hosts"] if h.get("role") != "router"]


def router_host(testbed) -> str:
    return next(h["name"] for h in testbed.state["hosts"] if h.get("role") == "router")


def changed(out: str) -> list[str]:
    """Operations of pyinfra's results table with a success (a change)."""
    import re

    rows = []
    for line in out.splitlines():
        m = re.match(r"\s{4}(.+?)\s{2,}(\d+)\s+([\d-]+)\s+([\d-]+)\s+([\d-]+)\s*$", line)
        if m and m.group(3) != "-" and m.group(1).strip() != "Grand total":
            rows.append(m.group(1).strip())
    return rows


def rollout(testbed, *args: str, data=()) -> tuple[subprocess.CompletedProcess, dict]:
    report = REPO / ".sglang-deploy" / f"router-test-{uuid.uuid4().hex[:8]}.json"
    report.parent.mkdir(exist_ok=True)
    argv = ["rollout", str(testbed.inventory), "--report", str(report), *args]
    for d in [*DATA, *data]:
        argv += ["--data", d]
    r = tool(*argv)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return r, doc


# SMG's counts of requests it sent to a worker that failed them before any response (a stopped
# server: connection refused, or a pooled connection it closed): retried on another worker
# (smg_worker_retries_total) or resent once (smg_router_upstream_send_retries_total).
RETRY_METRICS = ("smg_worker_retries_total", "smg_router_upstream_send_retries_total")


def router_retries(testbed) -> dict[str, float]:
    """RETRY_METRICS from the router's Prometheus endpoint, read on the router host."""
    out = testbed.ssh(router_host(testbed), "curl -sf 127.0.0.1:29000/metrics", check=True).stdout
    return {m: router_load.metric_sum(out, m) for m in RETRY_METRICS}


#: what the load figures keep of each host of a rollout's report
HOST_FIELDS = ("status", "router", "seconds", "drain_s", "drain_router", "readd_wait_s",
               "out_of_router_s")


def under_load(testbed, name: str, *args: str, data=()):
    url, key, _ = router_of(testbed)
    before = router_retries(testbed)
    result, (r, doc) = router_load.run_through(url, key, "glm-5", lambda: rollout(testbed, *args, data=data))
    summary = result.summary()
    after = router_retries(testbed)
    summary["retries_by_metric"] = {m: after[m] - before[m] for m in RETRY_METRICS}
    summary["router_retries"] = sum(summary["retries_by_metric"].values())
    RESULTS[name] = {"summary": summary, "rollout_rc": r.returncode,
                     "hosts": {h["host"]: {k: h.get(k) for k in HOST_FIELDS}
                               for h in doc.get("hosts", [])}}
    return r, doc, summary


def wait_all_workers_ready(testbed, deadline_s: float = 120.0) -> None:
    """Until the router counts every worker ready (`status --json`), or fail with its last view."""
    doc: dict = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        r = tool("status", str(testbed.inventory), "--json", *sum((["--data", d] for d in DATA), []))
        doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"out": r.stdout[-2000:]}
        workers = (doc.get("router") or {}).get("workers") or []
        if len(workers) == 3 and all(w["state"] == "ready" for w in workers):
            return
    raise AssertionError(f"the router did not count every worker ready in {deadline_s:.0f} s: {doc}")


def fleet_ready(testbed) -> bool:
    """The fleet is in `fleet`'s state: `status` passes (every server in sync with the
    module's data and healthy, the router reachable and every worker it knows ready) and the
    router knows all 3 workers."""
    r = tool("status", str(testbed.inventory), "--json", *[a for d in DATA for a in ("--data", d)])
    if r.returncode != 0 or not r.stdout.strip().startswith("{"):
        return False
    workers = (json.loads(r.stdout).get("router") or {}).get("workers") or []
    return len(workers) == 3


@pytest.fixture
def fleet(routed):
    """The state every test of this module starts from: the 3 servers converged on the
    module's configuration (the testbed inventory's data + DATA: the seed's flags, no extra
    environment), each serving the invocation a deploy verified, smg running on the router
    host, and the router counting every worker ready. Read first (`fleet_ready`); when it
    differs (a test left a rolled-out environment, a host rolled back, a worker out of the
    router), the deploy runs and the router is waited for."""
    if not fleet_ready(routed):
        r = pyinfra("deploy.py", routed)
        assert r.returncode == 0, "setting up the routed fleet failed:\n" + (r.stdout + r.stderr)[-4000:]
        wait_all_workers_ready(routed)
    return routed

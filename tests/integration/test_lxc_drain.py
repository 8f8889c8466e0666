"""A serving testbed host's container restarted by lxc_host.py through the router's drain
(issue 38, item 1: "unless the data says to restart it, through the same drain as a rollout
when it sits behind the router"; docs/operations.md, "Driver update on the LXC host").

Two servers behind the router (the router host booted for this module, removed at its end).
A simulated driver update on this machine, the LXC host (testbed/lxchost.py:
`driver_update` moves nvidia-uvm's major; the /dev nodes are every testbed's, so each test
puts them back), then the product's `pyinfra @local lxc_host.py` with tb1's container at
`restart: now` and `serves: {inventory: inventory/testbed.py, host: tb1}`: the router drains
tb1, the container restarts with the new passthrough, the fleet's deploy verifies tb1's
server, and it is put back. Observed from outside while light load runs through the router:
the router's workers and the container's init PID, sampled until the run ends.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from bench import router_load
from testbed import lostcontainer, lxc, lxchost
from testbed.fleet import find_host
from testbed.lxchost import DEFAULT_UVM

from .helpers import PYINFRA, REPO, TB1, both, data_args, run_testbed

pytestmark = pytest.mark.slow

DATA = ("gpu_p2p_min_gbps=0.05",)  # the simulated peer copies are slow under the load
NEW_UVM = 509  # the major a driver update gives nvidia-uvm here


@pytest.fixture(scope="module")
def routed(testbed):
    try:
        run_testbed("up", "--hosts", "2", "--router", timeout=900)
        testbed.reload()
        r = subprocess.run([PYINFRA, "-y", str(testbed.inventory), "deploy.py", *data_args(*DATA)],
                           cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                           stdin=subprocess.DEVNULL)
        testbed.log.append(r)
        assert r.returncode == 0, both(r)[-4000:]
        yield testbed
    finally:
        run_testbed("down", "--router", timeout=300)
        testbed.reload()


def drop_namespace(sim: lxchost.SimDriver) -> None:
    """The LXC host's namespace made afresh for each run (testbed/lxc.py `passthrough`): a
    copy made earlier would not see the hosts' overlays as they are now."""
    if subprocess.run(["findmnt", "-rn", str(sim.mntns)], capture_output=True,
                      check=False).returncode == 0:
        subprocess.run(["umount", str(sim.mntns)], capture_output=True, check=False)


def container(testbed, **over) -> dict:
    """tb1's entry in the LXC host's data: restart now, the server it holds named."""
    serves = {"inventory": str(testbed.inventory), "host": TB1, "data": list(DATA)}
    return {"name": TB1, "dialect": "lxc", "unprivileged": True, "restart": "now",
            "serves": serves, **over}


@pytest.fixture
def driver_updated(routed):
    """A driver update on the LXC host (nvidia-uvm moved to NEW_UVM); afterwards the nodes
    go back to DEFAULT_UVM and tb1's container is passed them by the product again (drained,
    restarted, verified, put back: a healthy routed host for what follows)."""
    testbed = routed
    sim = lxchost.SimDriver()
    drop_namespace(sim)
    sim.up()
    sim.driver_update(NEW_UVM)
    try:
        yield sim
    finally:
        sim.driver_update(DEFAULT_UVM)
        drop_namespace(sim)
        state = testbed.reload()
        r = sim.passthrough([container(testbed)], lxc.lxc_path(state), check=False)
        drop_namespace(sim)
        lostcontainer.adopt(TB1)  # the testbed's record of tb1: its new init PID and netns
        testbed.reload()
        assert r.returncode == 0, both(r)[-4000:]


def router(testbed) -> tuple[str, str, str]:
    st = testbed.state
    host = next(h for h in st["hosts"] if h.get("role") == "router")
    key = (Path(st["state_dir"]) / "router-key").read_text().strip()
    return (f"http://{host['address']}:30000", key,
            f"http://{find_host(st, TB1)['address']}:30000")


def listed(url: str, key: str) -> dict[str, str]:
    """The router's workers: URL -> status."""
    req = urllib.request.Request(url + "/workers", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    return {w["url"].rstrip("/"): w.get("status") or "?" for w in doc.get("workers", [])}


class Watch:
    """Samples (seconds, tb1 ready in the router, tb1's container init PID) until stopped."""

    def __init__(self, url: str, key: str, worker: str, lxc_path: str) -> None:
        self.args, self.samples = (url, key, worker, lxc_path), []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def pid(self) -> str | None:
        r = subprocess.run(["lxc-info", "-P", self.args[3], "-n", TB1, "-pH"], check=False,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None

    def _run(self) -> None:
        url, key, worker, _ = self.args
        t0 = time.monotonic()
        while not self.stop.is_set():
            try:
                status = listed(url, key).get(worker)
            except OSError as exc:
                status = f"router error {exc}"
            self.samples.append((round(time.monotonic() - t0, 2), status, self.pid()))
            self.stop.wait(0.3)

    def __enter__(self) -> Watch:  # noqa: PYI034
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_a_serving_container_restarts_through_the_drain_verified_and_put_back(routed,
                                                                              driver_updated):
    testbed, sim = routed, driver_updated
    state = testbed.reload()
    url, key, worker = router(testbed)
    assert listed(url, key).get(worker) == "ready"
    before = testbed.host_state(TB1)
    with Watch(url, key, worker, lxc.lxc_path(state)) as watch:
        pid0 = watch.pid()
        result, run = router_load.run_through(url, key, "glm-5", lambda: sim.passthrough(
            [container(testbed)], lxc.lxc_path(state), check=False), before_s=5.0)
    out = both(run)
    assert run.returncode == 0, out[-5000:]
    samples = watch.samples
    # order of events: the router had tb1 out before its container stopped; while it was
    # stopped or booting, tb1 was never in the router; it came back only after
    out_at = next(t for t, status, _ in samples if status != "ready")
    restarted_at = next(t for t, _, pid in samples if pid != pid0)
    assert out_at < restarted_at, samples
    assert all(status != "ready" for t, status, pid in samples
               if t >= restarted_at and pid in (None, pid0)), samples
    assert samples[-1][1] == "ready" and samples[-1][2] not in (None, pid0), samples
    back_at = next(t for t, status, pid in samples if t > restarted_at and status == "ready")
    line = (f"lxc_host.py restart through the drain: out of the router at {out_at:.1f}s, "
            f"container restarted at {restarted_at:.1f}s, back at {back_at:.1f}s; load "
            f"during: {result.summary()['during']}")
    print(line)
    testbed.log.append(line)
    # tb1's server came back verified: a new invocation, the one the deploy verified
    testbed.reload()
    after = testbed.host_state(TB1)
    assert after["invocation"] != before["invocation"], (before, after)
    assert after["verified"] == after["invocation"], after
    assert listed(url, key).get(worker) == "ready"
    summary = result.summary()
    assert summary["during"]["requests"] > 0 and summary["during"]["failed"] == 0, summary
    assert summary["before"]["failed"] == 0, summary
    # the passthrough in force: the new major in the config, allowed in the container
    assert f"c {NEW_UVM}:* rwm" in lxc.config_path(state, find_host(state, TB1)).read_text()
    for step in (f"drain {TB1} out of the router", "booted (systemd running)",
                 f"verify {TB1}: pyinfra", f"put {TB1} back into the router"):
        assert step in out, (step, out[-4000:])
    # a second run changes nothing: no drain, no restart
    again = sim.passthrough([container(testbed)], lxc.lxc_path(state), check=False)
    assert again.returncode == 0 and "drain" not in both(again) and "restart:" not in \
        both(again), both(again)[-3000:]
    assert testbed.host_state(TB1)["invocation"] == after["invocation"]


def test_a_server_that_fails_its_verify_stays_out_of_the_router_with_the_fix(routed,
                                                                            driver_updated):
    testbed, sim = routed, driver_updated
    state = testbed.reload()
    url, key, worker = router(testbed)
    # dry first: the steps are planned, nothing is drained or restarted
    pid = lxc.init_pid(state, find_host(state, TB1))
    dry = sim.passthrough([container(testbed)], lxc.lxc_path(state), args=("--dry",),
                          check=False)
    assert dry.returncode == 0, both(dry)[-3000:]
    for step in (f"drain {TB1} out of the router", "drain: the GPU passthrough changed",
                 f"verify {TB1}: pyinfra", f"put {TB1} back into the router"):
        assert f"[{TB1}] planned: {step}" in both(dry), (step, both(dry)[-3000:])
    assert listed(url, key).get(worker) == "ready"
    assert lxc.init_pid(state, find_host(state, TB1)) == pid
    testbed.scenario(TB1, "autotune-crash")  # the restarted server never serves
    try:
        run = sim.passthrough([container(testbed)], lxc.lxc_path(state), check=False)
        out = both(run)
        assert run.returncode != 0, out[-4000:]
        assert f"{TB1}'s server verified serving" in out, out[-4000:]
        assert f"sglang-deploy rebuild {testbed.inventory} {TB1} --data {DATA[0]}" in out, \
            out[-4000:]
        assert "stays out of the router" in out, out[-4000:]
        assert listed(url, key).get(worker) != "ready", listed(url, key)
    finally:
        lostcontainer.adopt(TB1)  # the restarted container (its init PID) for the testbed
        testbed.scenario(TB1, "healthy")

"""The router (SMG, the real wheel) in front of 3 testbed hosts, and rollouts under load.

`python -m testbed up --hosts 3 --router` adds the router host (inventory group `routers`);
the whole inventory is deployed (servers, then the router). The load test sends real
OpenAI-API requests through the router at a steady rate (bench/router_load.py) while a
rollout restarts every host: 0 failed requests with drain, also when a host fails and is
rolled back; the same rollout with `--no-drain` is the baseline that shows what drain
prevents (requests the router sent to a stopped server and had to retry). Figures go to
$ROUTER_LOAD_RESULTS (a JSON file) when set, for bench/run_all.py.

Each test sets up what it needs and passes alone (`pytest -k NAME`), whatever ran before it:
the module's `routed` fixture boots the router host and deploys once; the `fleet` fixture then
puts the fleet into the state every test here starts from (its docstring), reading it first
with `sglang-deploy status` and deploying only when it differs. Each test's docstring says
what state it needs and what it leaves.
"""

from __future__ import annotations

import json
import uuid

from bench import router_load

from .helpers import REPO
from .routedfleet import (  # noqa: F401  (`routed` and `fleet` are fixtures)
    DATA,
    SEED_FLAGS,
    changed,
    fleet,
    pyinfra,
    rollout,
    routed,
    router_host,
    router_of,
    router_retries,
    servers,
    tool,
    under_load,
    wait_all_workers_ready,
)


def test_router_deploy_routes_to_every_worker_and_a_second_run_changes_nothing(fleet):
    """Needs: `fleet`. Runs the deploy twice (no change: leaves the fleet as it found it)."""
    routed = fleet
    url, key, workers = router_of(routed)
    r = pyinfra("deploy.py", routed, "--data", "verify_converged=true")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    line = next(x for x in out.splitlines() if "router: routed to" in x)
    assert all(w in line for w in workers), line  # a generation reached each worker
    r = pyinfra("deploy.py", routed)
    assert r.returncode == 0 and changed(r.stdout) == [], changed(r.stdout)
    # the key: never in argv or the unit, the file root-only
    got = routed.ssh(router_host(routed),
                     "cat /proc/$(systemctl show -p MainPID --value smg)/cmdline | tr '\\0' ' '; echo; "
                     "cat /etc/systemd/system/smg.service; stat -c '%a %U' /etc/smg/secrets.env",
                     check=True).stdout
    assert key not in got and "600 root" in got
    # the workers bind their testbed address (the router reaches them), with the key
    first = servers(routed)[0]
    w = routed.ssh(first, "cat /etc/systemd/system/sglang.service", check=True).stdout
    assert f"--host {routed.address(first)}" in w and key not in w


def test_status_json_shows_the_router_and_its_workers(fleet):
    """Needs: `fleet` (every worker ready in the router). Read-only."""
    routed = fleet
    r = tool("status", str(routed.inventory), "--json", *sum((["--data", d] for d in DATA), []))
    doc = json.loads(r.stdout)
    url, _, workers = router_of(routed)
    assert doc["router"]["url"] == url and doc["router"]["error"] is None
    assert [(w["url"], w["state"]) for w in doc["router"]["workers"]] == [(u, "ready") for u in workers]
    assert {w["host"] for w in doc["router"]["workers"]} == {h["host"] for h in doc["hosts"]}


def test_rollout_with_drain_under_load_fails_no_request(fleet):
    """Needs: `fleet` (all 3 workers in the router, so each is drained and put back). Leaves
    the fleet on a new `sglang_env` value (the next `fleet` deploys it back)."""
    routed = fleet
    r, doc, s = under_load(routed, "drain", data=[f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}'])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert [h["status"] for h in doc["hosts"]] == ["done"] * 3
    assert [h["router"] for h in doc["hosts"]] == ["back"] * 3
    assert s["before"]["requests"] > 0 and s["during"]["requests"] > 0
    assert s["before"]["failed"] == 0 and s["during"]["failed"] == 0, s
    assert s["router_retries"] == 0, s  # no request was ever sent to a stopping server
    # each drain ended when the router routed nothing to the host and nothing was in flight:
    # the router's own answer at that moment still listed it `draining`, i.e. the drain ended
    # before SMG's fixed settle did (the put back then waited for the router to forget it)
    assert [h["drain_router"] for h in doc["hosts"]] == ["draining"] * 3, doc["hosts"]


def test_the_drain_that_waits_for_the_router_s_settle_fails_no_request_either(fleet):
    """The baseline of the drain figure: the same rollout under load with
    `rollout_drain_until=removed` (the drain also waits until the router has forgotten the
    worker: SMG's fixed settle, the behaviour before). Needs: `fleet`. Leaves the fleet on a
    new `sglang_env` value (the next `fleet` deploys it back)."""
    routed = fleet
    r, doc, s = under_load(routed, "drain-removed", data=[
        "rollout_drain_until=removed", f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}'])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert [(h["status"], h["router"]) for h in doc["hosts"]] == [("done", "back")] * 3
    assert s["during"]["requests"] > 0 and s["during"]["failed"] == 0, s
    # the router had forgotten each host when its drain ended: its put back never waited
    assert [(h["drain_router"], h["readd_wait_s"]) for h in doc["hosts"]] == [("removed", None)] * 3


def test_a_host_put_back_while_the_router_still_drains_it_is_added_back_after_the_removal(fleet):
    """Put back right after a drain that ended before the router's settle (the host's server
    never stopped, as if its restart were instant): the put back sees the router still
    holding the worker `draining`, waits until the router forgets it, adds it back and gets a
    generation routed to it; the router then lists every worker ready. Needs: `fleet`. Leaves
    it as found (the worker back in the router, under a new id)."""
    from sglang_deploy.controller import routerctl

    routed = fleet
    host = servers(routed)[0]
    router = routerctl.routers(str(routed.inventory), cwd=str(REPO), data=DATA)[0]
    lines: list[str] = []
    watch = router.drain(host, say=lines.append)
    assert (watch.router_state, watch.router_load, watch.worker_reqs) == ("draining", 0, 0)
    back = router.put_back(host, say=lines.append)
    assert back.steps[0] == "wait-removal" and back.steps[-1] == "verify", (back, lines)
    assert back.steps.index("add") > 0 and back.removal_wait_s is not None
    wait_all_workers_ready(routed)


def test_a_host_that_fails_is_rolled_back_and_put_back_under_load_without_a_failed_request(fleet):
    """Needs: `fleet` (the second server's known-good configuration is the module's, which
    its rollback restores). Sets the second server's `autotune-crash` scenario for the new
    flags (undone at the end). Leaves the first server on the new flags and the second rolled
    back (the next `fleet` deploys the first back)."""
    routed = fleet
    bad = servers(routed)[1]
    routed.scenario(bad, "autotune-crash", when="--mem-fraction-static 0.81")
    try:
        r, doc, s = under_load(routed, "failed-host-rolled-back",
                               data=["sglang_flags=" + json.dumps({**SEED_FLAGS, "mem-fraction-static": 0.81})])
    finally:
        routed.scenario(bad, "healthy")
    assert r.returncode == 1, (r.stdout + r.stderr)[-4000:]
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts[bad]["status"] == "rolled-back" and hosts[bad]["router"] == "back", hosts[bad]
    assert s["during"]["requests"] > 0 and s["during"]["failed"] == 0, s
    assert s["router_retries"] == 0, s


def test_without_drain_the_router_sends_requests_to_stopped_servers(fleet):
    """The baseline: without drain the router keeps sending requests to a server that is
    stopping or stopped, and has to retry them on another worker (a generation may run
    twice; with retries exhausted, or a stream already started, they fail).

    The same rollout under load with --no-drain is recorded, not asserted beyond its success
    (bench/performance-notes.md, router): how many requests meet a stopped server there
    depends on the moment (a simulated port is closed for about a second, and SMG's health
    check takes a stopping server out after a few 503s). What drain prevents is then shown
    without chance: a server stopped without telling the router still gets its turn.

    Needs: `fleet` (3 workers ready: the round robin gives the stopped one two turns of six).
    Leaves the fleet on a new `sglang_env` value and the first server started by hand, not by
    a deploy (the next `fleet` verifies or deploys it back)."""
    routed = fleet
    r, doc, s = under_load(routed, "no-drain", "--no-drain",
                           data=[f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}'])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert [h["status"] for h in doc["hosts"]] == ["done"] * 3
    assert all(h["router"] is None for h in doc["hosts"])

    url, key, _ = router_of(routed)
    wait_all_workers_ready(routed)  # SMG's health check may still hold a restarted one out
    stopped = servers(routed)[0]
    routed.ssh(stopped, "systemctl stop sglang", check=True)
    try:
        before = router_retries(routed)
        client = router_load.Load(url, key, "glm-5")
        for i in range(6):  # round robin over 3 workers: two turns of the stopped one
            client.one(2 * i)  # even: not streamed
        after = router_retries(routed)
    finally:
        routed.ssh(stopped, "systemctl start sglang", check=True)
    assert [x.ok for x in client.result.samples] == [True] * 6, client.result.summary()
    assert after["smg_worker_retries_total"] - before["smg_worker_retries_total"] >= 1, (before, after)


def test_an_unreachable_router_stops_the_rollout_before_any_host(fleet):
    """Needs: `fleet` (smg running, so that stopping it is the one difference). Stops smg
    and starts it again; no server is touched."""
    routed = fleet
    router = router_host(routed)
    routed.ssh(router, "systemctl stop smg", check=True)
    try:
        r, doc = rollout(routed, data=[f'sglang_env={{"ROLL": "{uuid.uuid4().hex[:6]}"}}'])
    finally:
        routed.ssh(router, "systemctl start smg", check=True)
    assert r.returncode == 1
    assert "router could not be reached" in r.stdout
    assert [h["status"] for h in doc["hosts"]] == ["untouched"] * 3

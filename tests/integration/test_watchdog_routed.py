"""The watchdog of a host behind the router (SMG on the testbed's router host), under load
through the router: two servers behind it; one is wedged (HTTP up, every generation hangs),
the watchdog takes it out of the router with the router's key (a systemd credential),
restarts it, verifies it and puts it back; the router routes to it again, and `logs
--explain` names the restart.

Module scope: the router host is booted for this module and removed at its end, also after
a failed set-up (the other modules' inventory has no `routers` group)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from bench import router_load

from .helpers import PYINFRA, REPO, TB1, TB2, both, data_args, run_testbed
from .routedfleet import RETRY_METRICS

DATA = ("watchdog=restart", "watchdog_interval_s=1", "watchdog_probe_timeout_s=2",
        "watchdog_probe_failures=2", "gpu_p2p_min_gbps=0.05")
STATE = "/var/lib/sglang-watchdog"


def deploy(testbed) -> subprocess.CompletedProcess:
    r = subprocess.run([PYINFRA, "-y", str(testbed.inventory), "deploy.py", *data_args(*DATA)],
                       cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                       stdin=subprocess.DEVNULL)
    testbed.log.append(r)
    return r


@pytest.fixture(scope="module")
def routed(testbed):
    try:
        # two servers: the router has a healthy worker to send the wedged one's share to
        run_testbed("up", "--hosts", "2", "--router", timeout=900)
        testbed.reload()
        r = deploy(testbed)
        assert r.returncode == 0, both(r)[-4000:]
        yield testbed
    finally:
        run_testbed("down", "--router", timeout=300)
        testbed.reload()


def router(testbed) -> tuple[str, str]:
    st = testbed.state
    host = next(h for h in st["hosts"] if h.get("role") == "router")
    return f"http://{host['address']}:30000", (Path(st["state_dir"]) / "router-key").read_text().strip()


def generate(url: str, key: str) -> int:
    req = urllib.request.Request(url + "/generate", method="POST", data=json.dumps(
        {"text": "x", "sampling_params": {"max_new_tokens": 1}}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def router_retries(testbed) -> dict[str, float]:
    """SMG's retry counters (routedfleet.RETRY_METRICS), read on the router host."""
    host = next(h["name"] for h in testbed.state["hosts"] if h.get("role") == "router")
    out = testbed.ssh(host, "curl -sf 127.0.0.1:29000/metrics", check=True).stdout
    return {m: router_load.metric_sum(out, m) for m in RETRY_METRICS}


def workers(url: str, key: str) -> dict[str, str]:
    """The router's workers: URL -> status (ready, or what it says)."""
    req = urllib.request.Request(url + "/workers", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    return {w["url"].rstrip("/"): (w.get("status") or ("ready" if w.get("is_healthy") else "not_ready"))
            for w in doc.get("workers", [])}


def test_a_wedged_host_behind_the_router_is_taken_out_restarted_and_put_back(routed):
    testbed = routed
    for h in (TB1, TB2):  # a clean record: no earlier restart counts against the cap
        testbed.ssh(h, f"systemctl stop sglang-watchdog && rm -f {STATE}/* && "
                       "systemctl start sglang-watchdog", check=True)
    url, key = router(testbed)
    worker = f"http://{next(h['address'] for h in testbed.state['hosts'] if h['name'] == TB1)}:30000"
    # TB1 and at least one other server ready behind it (the suite's testbed may hold more)
    ready = workers(url, key)
    assert set(ready.values()) == {"ready"} and worker in ready and len(ready) >= 2, ready
    before = testbed.host_state(TB1)["invocation"]
    wall_minus_mono = time.time() - time.monotonic()

    retries_before = router_retries(testbed)
    wedged_at: list[float] = []

    def wedge_and_wait() -> dict:
        testbed.scenario(TB1, "wedge")
        wedged_at.append(time.time())
        return testbed.wait_for("the watchdog's restart", lambda: next(
            (json.loads(x) for x in testbed.ssh(TB1, f"cat {STATE}/events.jsonl 2>/dev/null")
             .stdout.splitlines() if '"action": "restart"' in x), None), timeout=300)

    result, event = router_load.run_through(url, key, "glm-5", wedge_and_wait, before_s=5.0)
    summary = result.summary()
    steps = {s.split(" ", 1)[1].split(" (")[0]: float(s.split(" ", 1)[0]) for s in event["steps"]}
    # each failed request: when it left, against the moment the host left the router
    out_at = steps.get("taken out of the router")
    def left(s) -> float:  # seconds before the host was out of the router that it left
        return round(out_at - (s.start + wall_minus_mono), 2)

    failed = [{"stream": s.stream, "chunks": s.chunks, "error": s.error, "phase": s.phase,
               "seconds": round(s.seconds, 2), "left_s_before_out": left(s),
               "ended_s_after_wedge": round(s.start + wall_minus_mono + s.seconds
                                            - wedged_at[0], 2)}
              for s in result.samples if not s.ok]
    # the requests that left between the wedge and the host out of the router: some were
    # routed to the wedged server
    window = [s for s in result.samples
              if s.phase == "during" and 0 < left(s) <= out_at - wedged_at[0]]
    exposed = {kind: {"requests": len(got), "failed": sum(not s.ok for s in got),
                      "slowest_ok_s": max((round(s.seconds, 2) for s in got if s.ok), default=None)}
               for kind, got in (("stream", [s for s in window if s.stream]),
                                 ("whole", [s for s in window if not s.stream]))}
    retries = {m: v - retries_before[m] for m, v in router_retries(testbed).items()}
    out = os.environ.get("WATCHDOG_ROUTED_RESULTS")
    if out:
        figures = {k: round(v - wedged_at[0], 2) for k, v in steps.items()}
        figures["judged wedged"] = round(event["at"] - wedged_at[0], 2)
        Path(out).write_text(json.dumps({"summary": summary, "event": event, "failed": failed,
                                         "router_retries": retries, "exposed": exposed,
                                         "seconds_from_wedge": figures}, indent=2) + "\n")
    assert event["outcome"].startswith("restarted and verified"), event
    names = [s.split(" ", 1)[1] for s in event["steps"]]
    assert names[0] == "taken out of the router" and names[-1] == "back in the router", names
    after = testbed.host_state(TB1)
    assert after["invocation"] != before and after["verified"] == after["invocation"], after
    assert event["new_invocation"] == after["invocation"]
    # the host back in the router, serving through it
    assert workers(url, key).get(worker) == "ready", workers(url, key)
    assert generate(url, key) == 200
    # `logs --explain` names the restart that started this run
    r = subprocess.run([str(Path(PYINFRA).parent / "sglang-deploy"), "logs", str(testbed.inventory),
                        TB1, "--explain", "--json"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, both(r)[-3000:]
    named = json.loads(r.stdout)["watchdog_restart"]
    assert named["relation"] == "started" and named["evidence"] == event["evidence"], named
    # Through the router, nothing ended failed before the wedge (a stream begun before it and
    # still generating when the engine wedged is counted in "before" by its start, and is the
    # loss named below), nothing that left after the host
    # was out of the router, no whole (non-streamed) request and no stream of which nothing
    # had arrived: SGLang sends an OpenAI stream's 200 with its first token, so a request
    # hung on the wedged engine has sent nothing and SMG retries it on the other worker. The
    # only loss: a stream that had begun (tokens sent) when the engine wedged; no router can
    # finish it. The restart's event counts the requests it ended (docs/design.md, "The
    # watchdog after ready").
    assert all(f["ended_s_after_wedge"] > 0 for f in failed), (summary, failed)
    assert all(f["stream"] and f["chunks"] > 0 and f["left_s_before_out"] > 0
               for f in failed), failed
    assert exposed["whole"]["failed"] == 0, exposed
    counted = event["in_flight"]
    assert isinstance(counted.get("server"), int) and len(failed) <= counted["server"], (
        counted, failed)

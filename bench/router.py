"""Requests through the router during a 3-host rollout: drain on, a failed host, drain off.

Runs tests/integration/test_router.py (the router host, the deploy, the load test of
bench/router_load.py through three rollouts) on this TESTBED_DIR's testbed, which it leaves
up like the other suites, and turns the load figures it writes ($ROUTER_LOAD_RESULTS) into
Figures: failed requests with drain (baseline: the same rollout with --no-drain), failed
requests when a host fails and is rolled back, and the latency p50/p99 during the rollout
against before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from bench import router_load
from bench.common import PY, ROOT, Figure, log, not_measured

NAME = "Failed requests through the router during a 3-host rollout"


def run(cfg) -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "router-load.json"
        r = subprocess.run([PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            "tests/integration/test_router.py"], cwd=ROOT, capture_output=True,
                           text=True, env={**os.environ, "TESTBED_KEEP": "1",
                                           "ROUTER_LOAD_RESULTS": str(out)})
        log(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:])
        if not out.exists():
            return [not_measured("router_failed", NAME, "requests",
                                 f"the router load test did not finish: {r.stdout[-300:]}", "0")]
        return figures(json.loads(out.read_text()))


def figures(doc: dict) -> list[Figure]:
    """Figures of the load test's results (keys: drain, failed-host-rolled-back, no-drain)."""
    rate = f"{router_load.RATE:g} req/s, {router_load.MAX_TOKENS} tokens each, every other streamed"
    out = []
    drain, off = doc.get("drain"), doc.get("no-drain")
    if drain:
        s = drain["summary"]
        out.append(Figure(
            key="router_failed", name=NAME, unit="requests", samples=[s["during"]["failed"]],
            baseline_name="same rollout with --no-drain",
            baseline_samples=[off["summary"]["during"]["failed"]] if off else [],
            goal="0 failed", goal_kind="value_max", goal_value=1,
            notes=f"{rate}; {s['during']['requests']} requests during the rollout"
                  + (f", {off['summary']['during']['requests']} during the --no-drain one; its "
                     f"errors: {'; '.join(off['summary']['errors'][:3]) or 'none'}" if off else "")))
        out.append(Figure(
            key="router_retries", unit="requests", samples=[s.get("router_retries")],
            name="Requests the router sent to a stopped server and retried elsewhere",
            baseline_name="same rollout with --no-drain",
            baseline_samples=[off["summary"].get("router_retries")] if off else [],
            goal="0", goal_kind="value_max", goal_value=1,
            notes="SMG's smg_worker_retries_total + smg_router_upstream_send_retries_total over "
                  "the run: without drain the clients did not see these (SMG retried them on "
                  "another worker), but each is a generation that may run twice and the "
                  "retry's delay; how many there are depends on when the load meets the "
                  "simulated port's second of being closed"))
        out.append(Figure(
            key="router_p99", name="Latency p99 through the router, during the rollout vs before",
            unit="s", samples=[s["during"]["p99_s"]], baseline_name="before the rollout",
            baseline_samples=[s["before"]["p99_s"]],
            notes=f"p50 during {s['during']['p50_s']} s, before {s['before']['p50_s']} s; "
                  "the simulated server's token rate sets the request time"))
        if off:
            out.append(Figure(
                key="router_step", unit="s", name="Rollout step per host under load (drain)",
                samples=[h["seconds"] for h in drain["hosts"].values() if h.get("seconds")],
                baseline_name="same rollout with --no-drain",
                baseline_samples=[h["seconds"] for h in off["hosts"].values() if h.get("seconds")],
                notes="the rollout report's seconds per host: without drain the server, which "
                      "keeps taking new requests during its SIGTERM drain, stops only once the "
                      "router's health check (every 10 s) has taken it out"))
    out += drain_figures(drain, doc.get("drain-removed"))
    failed = doc.get("failed-host-rolled-back")
    if failed:
        s = failed["summary"]
        out.append(Figure(
            key="router_failed_rollback", unit="requests", samples=[s["during"]["failed"]],
            name="Failed requests when a host fails its verification and is rolled back",
            goal="0 failed", goal_kind="value_max", goal_value=1,
            notes=f"{rate}; {s['during']['requests']} requests during the rollout"))
    return out


SETTLE_S = 5.0  # SMG's drain_settle_secs (default; `smg launch` does not expose it)


def _hosts(run: dict | None, key: str) -> list:
    return [h[key] for h in ((run or {}).get("hosts") or {}).values() if h.get(key) is not None]


def drain_figures(drain: dict | None, removed: dict | None) -> list[Figure]:
    """The drain against the one that waits for the router's settle (rollout_drain_until=
    removed), the same 3-host rollout under the same load in the same run: each drain's wait
    (with the baseline's failed requests) and each host's time out of the router."""
    if not drain or not removed:
        return []
    base = "same rollout, drain until the router forgets the worker (rollout_drain_until=removed)"
    readd = _hosts(drain, "readd_wait_s")
    ended = [h.get("drain_router") for h in drain["hosts"].values()]
    s = removed["summary"]
    return [
        Figure(key="router_drain", unit="s", name="The drain under load (DELETE to out of "
                                                  "routing and idle), per host",
               samples=_hosts(drain, "drain_s"), baseline_name=base,
               baseline_samples=_hosts(removed, "drain_s"),
               goal=f"shorter than SMG's fixed settle ({SETTLE_S:g} s)", goal_kind="value_max",
               goal_value=SETTLE_S,
               notes="the rollout report's drain_s: from the DELETE until the router lists the "
                     "worker `draining` and neither its load nor the server's /v1/loads counts "
                     f"a request; the router's state when each drain ended: {', '.join(map(str, ended))} "
                     "(draining: the drain ended before the router's settle did); failed "
                     f"requests during the baseline's rollout: {s['during']['failed']} of "
                     f"{s['during']['requests']}"),
        Figure(key="router_out", unit="s", name="A host's time out of the router under load "
                                                "(drain start to put back)",
               samples=_hosts(drain, "out_of_router_s"), baseline_name=base,
               baseline_samples=_hosts(removed, "out_of_router_s"),
               notes="the rollout report's out_of_router_s; when a host's drain, deploy step "
                     "and verification take less than SMG's settle, its put back waits for the "
                     "router to forget the worker (a re-add is refused and a replace undone "
                     "by the pending removal), here "
                     + (", ".join(f"{x:.1f} s" for x in readd) if readd else "never")
                     + ": the time out of the router is then the settle plus the re-add; on a "
                       "real host the restart alone takes minutes"),
    ]

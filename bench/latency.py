"""Readiness and crash detection latency of the verifier, against the simulator's own clock.

Both moments are wall-clock epoch seconds on the same kernel clock (the testbed hosts are
containers on this machine): the simulator writes `ready_at` (at "The server is fired up and
ready to roll!") and `exited_at` (just before a crash exit) under the service's cache dir; the
deploy's report carries `verified_epoch_s` (the verifier's ready decision). The crash's fail moment
is when the failure line reaches the controller's output.

A restart is forced by a new value of `sglang_env` (a unit change) through bench/inventory.py.
"""

from __future__ import annotations

import math
import time

from bench.common import (
    Figure,
    converge,
    deploy,
    ensure_hosts,
    host_report,
    log,
    read_json_on,
    testbed,
)

SIM_DIR = "/var/cache/sglang/sglang-sim"   # sglang_cache_dir (default) / sglang-sim
PROBE_PERIOD_S = 10.0
HUMAN_SLEEP_S = 60.0
FAIL_MARKERS = ("the server exited in phase", "fatal error in phase", "the service restarted during startup")


def _restart_data(tag: str) -> dict:
    return {"sglang_env": {"BENCH_RUN": f"{tag}-{time.time():.3f}"}}


def ready_sample(host: str, tag: str = "ready", code=None) -> tuple[float, float, float]:
    """One restart: (verified - ready seconds, the server's startup seconds, deploy seconds)."""
    t = deploy([host], extra_data=_restart_data(tag), code=code)
    rep = host_report(host) or {}
    ready = read_json_on(host, f"{SIM_DIR}/ready.json") or {}
    if not rep.get("verified_epoch_s") or not ready.get("ready_at") or ready["ready_at"] < t.started_wall:
        raise RuntimeError(f"readiness ({tag}): no fresh ready moment (report {rep}, sim {ready})")
    return rep["verified_epoch_s"] - ready["ready_at"], ready["ready_at"] - ready["started_at"], t.seconds


def crash_sample(host: str, tag: str = "crash", code=None) -> float:
    """One restart into a crash (the host's scenario set by the caller): seconds from the
    server's exit to the verifier's failure line on the controller."""
    t = deploy([host], extra_data=_restart_data(tag), check=False, code=code)
    hit = t.first_line(lambda s: any(m in s for m in FAIL_MARKERS))
    exited = read_json_on(host, f"{SIM_DIR}/exit.json") or {}
    if t.ok or hit is None or not exited.get("exited_at") or exited["exited_at"] < t.started_wall:
        raise RuntimeError(f"crash ({tag}): expected a verifier failure after a fresh crash "
                           f"(rc {t.rc}, exit record {exited}):\n{t.tail()}")
    return hit[1] - exited["exited_at"]


def run(cfg) -> list[Figure]:
    host = ensure_hosts(1)[0]
    converge([host])
    lat, startup, sleep60, probe10 = [], [], [], []
    for i in range(cfg.runs):
        d, s, secs = ready_sample(host)
        lat.append(d)
        startup.append(s)
        # baselines from the same run's startup time: a human's fixed `sleep 60` after the
        # restart, and a probe every 10 s from the process start (first tick after ready)
        sleep60.append(max(HUMAN_SLEEP_S - s, 0.0))
        probe10.append(math.ceil(s / PROBE_PERIOD_S) * PROBE_PERIOD_S - s)
        log(f"readiness run {i + 1}/{cfg.runs}: startup {s:.2f}s, detected {lat[-1]:.3f}s after ready "
            f"(deploy {secs:.1f}s)")

    crash = []
    testbed("scenario", host, "autotune-crash")
    try:
        for i in range(cfg.runs):
            crash.append(crash_sample(host))
            log(f"crash run {i + 1}/{cfg.runs}: failure reported {crash[-1]:.3f}s after the exit")
    finally:
        testbed("scenario", host, "healthy")
        converge([host])
    return [
        Figure(key="ready_vs_sleep", name="Readiness detection latency (vs fixed sleep 60)", unit="s",
               samples=lat, baseline_name="`sleep 60` after the restart (same runs' startup)",
               baseline_samples=sleep60, goal="< 1 s", goal_kind="value_max", goal_value=1.0,
               notes="ready moment = simulator's ready_at; detection = the report's verified_epoch_s",
               extra={"startup_s": startup}),
        Figure(key="ready_vs_probe", name="Readiness detection latency (vs 10 s probe)", unit="s",
               samples=lat, baseline_name="probe every 10 s (same runs' startup)",
               baseline_samples=probe10, goal="< 1 s", goal_kind="value_max", goal_value=1.0),
        Figure(key="crash", name="Crash detection latency (autotune crash)", unit="s", samples=crash,
               goal="< 2 s", goal_kind="value_max", goal_value=2.0,
               notes="exit = simulator's exited_at just before its SIGKILL; failure = the verifier's "
                     "failure line reaching the controller's output"),
    ]

"""Rollout overhead per host: rollout wall time minus the server's own restart-to-ready time.

Runs `sglang-deploy rollout bench/inventory.py --report FILE` on 3 hosts with a change that
restarts every host (a new `sglang_env` value). Contract of the report: per host `host`,
`status` (done / rolled-back / untouched / converged / failed), `seconds` (wall time of that
host's step) and `restart_to_ready_s` (from the verifier).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import (
    BENCH_INVENTORY,
    PY,
    ROOT,
    Figure,
    bench_env,
    converge,
    ensure_hosts,
    log,
    not_measured,
    run_timed,
)

NAME = "Rollout overhead per host (3 hosts)"
GOAL = "< 3 s per host"


def available() -> bool:
    cli = Path(PY).parent / "sglang-deploy"
    r = subprocess.run([str(cli), "rollout", "--help"], cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0


def _hosts_of(report) -> list[dict]:
    if isinstance(report, list):
        return report
    for key in ("hosts", "steps", "results"):
        if isinstance(report.get(key), list):
            return report[key]
    raise ValueError(f"no per-host list in the rollout report: {list(report)}")


def run(cfg) -> list[Figure]:
    if not available():
        return [not_measured("rollout", NAME, "s", "`sglang-deploy rollout` is not in this tree", GOAL)]
    hosts = ensure_hosts(3)
    converge(hosts)
    overhead, walls, ready = [], [], []
    cli = str(Path(PY).parent / "sglang-deploy")
    for i in range(cfg.runs):
        with tempfile.TemporaryDirectory() as tmp:
            rep_file = Path(tmp) / "rollout.json"
            argv = [cli, "rollout", BENCH_INVENTORY, "--report", str(rep_file)]
            for h in hosts:
                argv += ["--limit", h]
            data = {"sglang_env": {"BENCH_RUN": f"rollout-{time.time():.3f}"}}
            t = run_timed(argv, env=bench_env(data))
            if not t.ok or not rep_file.exists():
                raise RuntimeError(f"rollout run {i + 1} failed (rc {t.rc}):\n{t.tail()}")
            steps = _hosts_of(json.loads(rep_file.read_text()))
        done = [s for s in steps if s.get("status") == "done" and s.get("restart_to_ready_s") is not None]
        if len(done) != len(hosts):
            raise RuntimeError(f"rollout run {i + 1}: expected {len(hosts)} hosts done, got {steps}")
        for s in done:
            overhead.append(s["seconds"] - s["restart_to_ready_s"])
            walls.append(s["seconds"])
            ready.append(s["restart_to_ready_s"])
        log(f"rollout run {i + 1}/{cfg.runs}: {t.seconds:.1f}s; per host "
            + ", ".join(f"{s['host']} {s['seconds']:.1f}s (ready {s['restart_to_ready_s']:.1f}s)" for s in done))
    converge(hosts)
    return [Figure(key="rollout", name=NAME, unit="s", samples=overhead, goal=GOAL,
                   goal_kind="value_max", goal_value=3.0,
                   notes="one sample per host per run: step seconds - restart_to_ready_s",
                   extra={"step_seconds": walls, "restart_to_ready_s": ready})]

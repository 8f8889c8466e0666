"""Rollout overhead per host: rollout wall time minus the server's own restart-to-ready time.

Runs `sglang-deploy rollout bench/inventory.py --report FILE` on 3 hosts with a change that
restarts every host (a new `sglang_env` value). Contract of the report: per host `host`,
`status` (done / rolled-back / untouched / converged / failed), `seconds` (wall time of that
host's step) and `restart_to_ready_s` (from the verifier).
"""

from __future__ import annotations

import json
import runpy
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
    mib = p2p_mib()
    p2p = p2p_test_seconds(hosts[0], cfg.runs, mib)
    return [Figure(key="rollout", name=NAME, unit="s", samples=overhead, goal=GOAL,
                   goal_kind="value_max", goal_value=3.0,
                   notes="one sample per host per run: step seconds - restart_to_ready_s; each "
                         "step includes the full P2P test before the restart (next figure)",
                   extra={"step_seconds": walls, "restart_to_ready_s": ready}),
            Figure(key="p2p_test", name=f"Full P2P test before each restart (1 host, {mib} MiB copies)",
                   unit="s", samples=p2p,
                   notes=f"`cuda_probe.py --p2p --mib {mib}` fed to the host's python over SSH, as "
                         "the deploy runs it: 56 GPU pairs, a verified copy and 3 timed copies each; "
                         "the stand-in's copies are host memcpy on this machine (real GPUs copy "
                         "64 MiB at tens of GB/s)")]


def p2p_mib() -> int:
    """The copy size the testbed inventory gives the deploy (the testbed must be up)."""
    return runpy.run_path(str(ROOT / "inventory" / "testbed.py"))["TESTBED_DATA"]["gpu_p2p_test_mib"]


def p2p_test_seconds(host: str, runs: int, mib: int) -> list[float]:
    """Wall time of the full P2P test as the deploy runs it before a restart."""
    probe = (ROOT / "sglang_deploy" / "remote" / "cuda_probe.py").read_text()
    out = []
    for _ in range(runs):
        t0 = time.monotonic()
        r = subprocess.run([PY, "-m", "testbed", "ssh", host, "python3", "-", "--p2p", "--mib",
                            str(mib)], cwd=ROOT, input=probe, capture_output=True, text=True,
                           timeout=300)
        seconds = time.monotonic() - t0
        report = json.loads(r.stdout.strip().splitlines()[-1])
        if not report.get("ok") or not all(p.get("verified") for p in report.get("p2p") or []):
            raise RuntimeError(f"P2P test on {host} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        out.append(round(seconds, 3))
    log(f"full P2P test on {host}: {out}")
    return out

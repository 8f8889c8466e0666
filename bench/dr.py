"""Disaster-recovery rebuild: a blank host (`python -m testbed wipe`) to verified serving from
the local wheelhouse, without and (when `sglang-deploy cache` exists) with restored caches.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from bench.common import PY, ROOT, Figure, converge, deploy, ensure_hosts, host_report, log, not_measured, testbed

NAME = "Disaster-recovery rebuild (blank host to verified serving)"


def cache_commands() -> bool:
    cli = Path(PY).parent / "sglang-deploy"
    r = subprocess.run([str(cli), "cache", "--help"], cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0


def _rebuild(host: str) -> tuple[float, float, float]:
    t0 = time.monotonic()
    wall0 = time.time()
    testbed("wipe", host)
    wiped = time.monotonic() - t0
    t = deploy([host])
    rep = host_report(host) or {}
    if not rep.get("verified_at") or rep["verified_at"] < wall0:
        raise RuntimeError(f"rebuild of {host}: no fresh verified report ({rep})")
    return time.monotonic() - t0, wiped, t.seconds


def run(cfg) -> list[Figure]:
    host = ensure_hosts(1)[0]
    converge([host])
    total, wipes, deploys = [], [], []
    for i in range(cfg.runs):
        a, w, d = _rebuild(host)
        total.append(a)
        wipes.append(w)
        deploys.append(d)
        log(f"DR run {i + 1}/{cfg.runs}: {a:.1f}s (wipe {w:.1f}s, deploy {d:.1f}s)")
    figs = [Figure(key="dr_plain", name=NAME + ", no caches", unit="s", samples=total,
                   notes="wipe + full deploy (install from /srv/wheelhouse, start, verify)",
                   extra={"wipe_s": wipes, "deploy_s": deploys})]
    if cache_commands():
        figs.append(not_measured("dr_cache", NAME + ", restored caches", "s",
                                 "`sglang-deploy cache` exists but bench/dr.py does not drive it yet"))
    else:
        figs.append(not_measured("dr_cache", NAME + ", restored caches", "s",
                                 "`sglang-deploy cache save/restore` is not in this tree"))
    return figs

"""Disaster-recovery rebuild: a blank host (`python -m testbed wipe`) to verified serving from
the local wheelhouse, with `sglang-deploy rebuild`, without and with restored caches (an
archive from `sglang-deploy cache save`, taken once from the converged host). Plain and
cached rebuilds alternate within each run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import (
    BENCH_INVENTORY,
    PY,
    Figure,
    bench_env,
    converge,
    ensure_hosts,
    host_report,
    log,
    run_timed,
    testbed,
)

NAME = "Disaster-recovery rebuild (blank host to verified serving)"
CLI = str(Path(PY).parent / "sglang-deploy")


def _rebuild(host: str, cache: str | None) -> tuple[float, float, float, dict]:
    t0 = time.monotonic()
    wall0 = time.time()
    testbed("wipe", host)
    wiped = time.monotonic() - t0
    t = run_timed([CLI, "rebuild", BENCH_INVENTORY, host, *(["--cache", cache] if cache else [])],
                  env=bench_env())
    rep = host_report(host) or {}
    if not t.ok or not rep.get("verified_epoch_s") or rep["verified_epoch_s"] < wall0:
        raise RuntimeError(f"rebuild of {host} (cache {cache}) failed or not verified (rc {t.rc}):\n{t.tail()}")
    return time.monotonic() - t0, wiped, t.seconds, rep


def run(cfg) -> list[Figure]:
    host = ensure_hosts(1)[0]
    converge([host])
    with tempfile.TemporaryDirectory(prefix="sglang-bench-cache-") as tmp:
        archive = str(Path(tmp) / f"{host}-cache.tar.gz")
        save = run_timed([CLI, "cache", "save", BENCH_INVENTORY, host, archive], env=bench_env())
        if not save.ok:
            raise RuntimeError(f"cache save failed (rc {save.rc}):\n{save.tail()}")
        size_mib = Path(archive).stat().st_size / (1 << 20)
        log(f"cache archive of {host}: {size_mib:.2f} MiB in {save.seconds:.1f}s")
        plain, cached, wipes, ready_plain, ready_cached = [], [], [], [], []
        for i in range(cfg.runs):
            a, w, _, rep = _rebuild(host, None)
            plain.append(a)
            wipes.append(w)
            ready_plain.append(rep.get("time_to_ready_s"))
            b, w, _, rep2 = _rebuild(host, archive)
            cached.append(b)
            wipes.append(w)
            ready_cached.append(rep2.get("time_to_ready_s"))
            log(f"DR run {i + 1}/{cfg.runs}: no caches {a:.1f}s (server ready {ready_plain[-1]}s), "
                f"restored caches {b:.1f}s (server ready {ready_cached[-1]}s)")
    return [
        Figure(key="dr_plain", name=NAME + ", no caches", unit="s", samples=plain,
               notes="`testbed wipe` + `sglang-deploy rebuild` (install from /srv/wheelhouse, start, verify)",
               extra={"wipe_s": wipes, "time_to_ready_s": ready_plain}),
        Figure(key="dr_cache", name=NAME + ", restored caches", unit="s", samples=cached,
               baseline_name="rebuild without caches (same runs)", baseline_samples=plain,
               notes=f"`rebuild --cache` with a {size_mib:.2f} MiB archive from `cache save`",
               extra={"time_to_ready_s": ready_cached}),
    ]

"""Readiness and crash detection latency (bench/latency.py's measures) for several versions
of the tool in one run, interleaved run by run on the same host:

    .venv/bin/python bench/run_all.py --only detection --versions before=2c60893,after=HEAD

Each version's code runs from its checkout (bench/versions.py); the simulator is the
testbed's, the same for every version. The first version listed is the baseline.
"""

from __future__ import annotations

from bench.common import Figure, converge, ensure_hosts, log, median, testbed
from bench.latency import crash_sample, ready_sample
from bench.versions import checkout


def run(cfg) -> list[Figure]:
    versions = [v.split("=", 1) for v in cfg.versions.split(",")]
    host = ensure_hosts(1)[0]
    converge([host])
    ready = {label: [] for label, _ in versions}
    crash = {label: [] for label, _ in versions}
    for i in range(cfg.runs):
        for label, rev in versions:
            ready[label].append(round(ready_sample(host, f"ready-{label}", code=checkout(rev))[0], 3))
            log(f"detection {label} run {i + 1}/{cfg.runs}: ready detected {ready[label][-1]} s after")
    testbed("scenario", host, "autotune-crash")
    try:
        for i in range(cfg.runs):
            for label, rev in versions:
                crash[label].append(round(crash_sample(host, f"crash-{label}", code=checkout(rev)), 3))
                log(f"detection {label} run {i + 1}/{cfg.runs}: crash reported {crash[label][-1]} s after")
    finally:
        testbed("scenario", host, "healthy")
        converge([host])
    base, base_rev = versions[0]
    figs = []
    for label, rev in versions[1:]:
        for key, name, samples in (("ready", "Readiness detection latency", ready),
                                   ("crash", "Crash detection latency (autotune crash)", crash)):
            figs.append(Figure(
                key=f"detection_{label}_{key}", name=f"{name}: {label}", unit="s",
                samples=samples[label], baseline_name=f"{base} ({base_rev})",
                baseline_samples=samples[base],
                notes=f"{label} = {rev}; interleaved with {base} run by run on one host; medians "
                      f"{median(samples[label])} vs {median(samples[base])}"))
    return figs

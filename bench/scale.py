"""Scale: pre-flight plus no-op deploy on many testbed hosts; time and controller peak memory.

Boots `--scale-hosts` hosts (default 16; fewer if the machine cannot hold them: the figure
says how many), converges them once, then times full no-op deploy.py runs (pre-flight is its
first stage) against `true` on the same hosts. Peak memory is the pyinfra process's own
maximum RSS (wait4 rusage: pyinfra is one process; SSH is paramiko inside it).
"""

from __future__ import annotations

from bench.common import Figure, changes, converge, deploy, ensure_hosts, log

TRUE = "bench/true_deploy.py"


def run(cfg) -> list[Figure]:
    hosts = []
    for n in sorted({min(8, cfg.scale_hosts), cfg.scale_hosts}):
        try:
            hosts = ensure_hosts(n)
        except RuntimeError as e:
            log(f"scale: {n} hosts did not come up: {str(e)[:300]}")
            break
    n = len(hosts)
    t = converge(hosts)
    secs, rss, base, base_rss, ch = [], [], [], [], []
    for i in range(cfg.scale_runs):
        b = deploy(hosts, deploy_file=TRUE)
        d = deploy(hosts)
        base.append(b.seconds)
        base_rss.append(b.maxrss_kib / 1024)
        secs.append(d.seconds)
        rss.append(d.maxrss_kib / 1024)
        ch.append(changes(d))
        log(f"scale run {i + 1}/{cfg.scale_runs}: {n} hosts: true {b.seconds:.1f}s, deploy {d.seconds:.1f}s, "
            f"controller peak RSS {rss[-1]:.0f} MiB (true: {base_rss[-1]:.0f} MiB)")
    return [
        Figure(key="scale_time", name=f"Pre-flight + no-op deploy, {n} hosts", unit="s", samples=secs,
               baseline_name=f"pyinfra `true`, {n} hosts", baseline_samples=base,
               notes=f"{n} testbed hosts ran here (asked for {cfg.scale_hosts}); converge of all "
                     f"{n} before the runs: {t.seconds:.0f}s",
               extra={"hosts": n, "changes": ch}),
        Figure(key="scale_rss", name=f"Controller peak memory, {n} hosts", unit="MiB", samples=rss,
               baseline_name=f"pyinfra `true`, {n} hosts", baseline_samples=base_rss),
    ]

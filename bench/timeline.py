"""Where the time of a no-op run goes: pyinfra's phases, and how busy the machine was in each.

    .venv/bin/python bench/timeline.py [--hosts 8] [--runs 3] [--deploy deploy.py]

A diagnostic, not a figure of docs/performance.md. It boots (or keeps) the first N testbed
hosts, converges them, then runs ``pyinfra -vv bench/inventory.py DEPLOY`` on 1 host and on N
hosts, RUNS times each. Each output line is timestamped, and every 10 ms a thread samples the
machine's busy CPU (/proc/stat, all cores) and the controller's own CPU (/proc/PID/stat).
For the median run of each size it prints one row per phase: when it starts, how long it
lasts, how many of the machine's cores were busy on average and how many of them the
controller used. The rest of the busy CPU is the testbed hosts' own work (sshd, the shell,
the host-state read, the CUDA probe) and the kernel. On this testbed the hosts share the
controller's cores, so a phase where the machine is at its core count is CPU-bound, and one
well below it waits on something (a round trip, a delayed ACK).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import byte_compile, changes, converge, deploy, ensure_hosts, log

# Each phase starts at a line of `pyinfra -vv` (its first or last match) and ends where the
# next one that appears starts; the first starts with the process, the last ends at its exit.
PHASES = (
    ("interpreter and pyinfra's imports", None, "first"),
    ("config.py (hooks) and the inventory", "--> Loading config", "first"),
    ("connect every host, take the deploy lock", "--> Loading inventory", "first"),
    ("load the deploy file up to its first command", "--> Preparing operation files", "first"),
    ("first command sent, until the last fact is in (deploy.py: the pre-flight snapshot)",
     ">>> ", "first"),
    ("prepare and run the operations", "Loaded fact", "last"),
    ("results, disconnect, exit", "--> Results:", "first"),
)


def phases(lines: list, seconds: float) -> list[tuple[str, float, float]]:
    """``[(label, start s, end s)]`` of one timed run (``Timed.lines``: (offset, wall, text);
    SECONDS: its length), in order; a phase whose line never appears (a failed run, another
    deploy file) is left out, and the one before it lasts until the next that does."""
    starts = []
    for label, needle, which in PHASES:
        hits = [0.0] if needle is None else [off for off, _, text in lines if needle in text]
        if hits:
            starts.append((label, hits[0] if which == "first" else hits[-1]))
    ends = [start for _, start in starts[1:]] + [seconds]
    return [(label, start, end) for (label, start), end in zip(starts, ends)]


def busy(samples: list, start: float, end: float) -> tuple[float | None, float | None]:
    """Average busy cores of the machine and of the controller between START and END, from
    ``Timed.cpu_samples`` ((offset, machine busy s, controller CPU s)); None without two
    samples in the window."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None, None
    dt = inside[-1][0] - inside[0][0]
    return (inside[-1][1] - inside[0][1]) / dt, (inside[-1][2] - inside[0][2]) / dt


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(t) -> str:
    """The phases of one ``Timed`` run (sampled) as a markdown table, then the whole run."""
    rows = ["| phase | start s | seconds | machine cores busy | controller cores |",
            "|---|---|---|---|---|"]
    for label, start, end in phases(t.lines, t.seconds):
        machine, controller = busy(t.cpu_samples, start, end)
        rows.append(f"| {label} | {start:.3f} | {end - start:.3f} | {_cores(machine)} | "
                    f"{_cores(controller)} |")
    rows.append(f"| **whole run** | | **{t.seconds:.3f}** | "
                f"{t.machine_cpu_s / t.seconds:.2f} ({t.machine_cpu_s:.2f} s CPU) | "
                f"{t.cpu_s / t.seconds:.2f} ({t.cpu_s:.2f} s CPU) |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--deploy", default="deploy.py")
    args = ap.parse_args(argv)
    byte_compile()
    hosts = ensure_hosts(args.hosts)
    converge(hosts)
    for target in (hosts[:1], hosts):
        runs = []
        for _ in range(args.runs):
            t = deploy(target, deploy_file=args.deploy, verbose=True, sample_s=0.01)
            if args.deploy == "deploy.py" and changes(t) != 0:
                raise SystemExit(f"not a no-op run: {changes(t)} changes\n{t.tail()}")
            runs.append(t)
        t = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
        log(f"{len(target)} host(s): runs {', '.join(f'{r.seconds:.3f}' for r in runs)} s; "
            f"median run below (median {statistics.median(r.seconds for r in runs):.3f} s)")
        print(f"\n{len(target)} host(s), {args.deploy}, {os.cpu_count()} cores:\n\n{table(t)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

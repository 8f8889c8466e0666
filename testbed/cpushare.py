"""A host's own CPUs: a testbed host held to a fixed share of this machine's cores.

A real fleet's hosts each install, import and smoke a release on their own CPUs: one host's
install takes as long whether the others install at the same moment or not. The testbed's
hosts all run on this machine's cores (2 here), so N hosts staging at once share them and
each takes up to N/2 times as long as alone, which no real fleet sees. ``python -m testbed
cpu HOST CORES`` moves HOST's processes (its nspawn and everything below it: the container's
systemd, sshd, the installs, the smoke, the server) into a child of the cgroup v1 ``cpu``
controller whose CFS quota is CORES cores: the host never gets more; and a high weight
(``cpu.shares`` ``SHARES``, 8x a process's) lets it take its share first on a loaded
machine (other sessions' tests), so that while the hosts' shares sum to less than the
machine's cores, it does not get less either: CORES cores of its own. ``cpu HOST 0`` takes
the limit off. It holds until the host's nspawn restarts (wipe, cgroup, down).
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed import TestbedError, procs

CPU_CGROUP = Path(os.environ.get("TESTBED_CPU_CGROUP", "/sys/fs/cgroup/cpu"))
PERIOD_US = 100_000
#: the weight of a limited host against the machine's other processes (1024 each)
SHARES = 8192


def cgroup_of(name: str) -> Path:
    return CPU_CGROUP / f"testbed-cpu-{name}"


def limit(name: str, pid: int, cores: float, timeout: float = 10.0) -> Path:
    """Hold host NAME (nspawn PID and its descendants) to CORES cores; the cgroup's path."""
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        raise TestbedError(f"`cpu` needs the cgroup v1 cpu controller at {CPU_CGROUP} (this "
                           "machine has none); on a cgroup v2 host with systemd the equivalent "
                           "is `systemctl set-property --runtime <the container's scope> "
                           "CPUQuota=...`")
    if cores <= 0:
        raise TestbedError(f"cores must be > 0 (0 takes the limit off), got {cores}")
    cg = cgroup_of(name)
    cg.mkdir(exist_ok=True)
    (cg / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
    (cg / "cpu.cfs_quota_us").write_text(f"{int(cores * PERIOD_US)}\n")
    (cg / "cpu.shares").write_text(f"{SHARES}\n")

    def outside():
        inside = set((cg / "cgroup.procs").read_text().split())
        return [p for p in procs._descendants(pid) if str(p) not in inside]

    procs._move_procs(name, outside, CPU_CGROUP, cg, timeout)
    return cg


def unlimit(name: str, timeout: float = 10.0) -> None:
    """Undo ``limit``: the host's processes back to the root cpu cgroup, the child removed."""
    cg = cgroup_of(name)
    if cg.exists():
        procs._move_procs(name, lambda: (cg / "cgroup.procs").read_text().split(), cg,
                          CPU_CGROUP, timeout)
        cg.rmdir()


def cores_of(name: str) -> float | None:
    """The host's limit in cores, None when it has none."""
    quota = cgroup_of(name) / "cpu.cfs_quota_us"
    if not quota.exists():
        return None
    q = int(quota.read_text())
    return None if q < 0 else q / int((cgroup_of(name) / "cpu.cfs_period_us").read_text())

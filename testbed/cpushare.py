"""A host's own CPUs: a testbed host held to a fixed share of this machine's cores.

A real fleet's hosts each install, import and smoke a release on their own CPUs: one host's
install takes as long whether the others install at the same moment or not. The testbed's
hosts all run on this machine's cores (2 here), so N hosts staging at once share them and
each takes up to N/2 times as long as alone, which no real fleet sees. ``python -m testbed
cpu HOST CORES`` holds HOST's container (its LXC payload cgroup of the cgroup v1 ``cpu``
controller: the container's init and everything below it: its systemd, sshd, the installs,
the smoke, the server) to a CFS quota of CORES cores: the host never gets more; and a high
weight (``cpu.shares`` ``SHARES``, 8x a process's) lets it take its share first on a loaded
machine (other sessions' tests), so that while the hosts' shares sum to less than the
machine's cores, it does not get less either: CORES cores of its own. ``cpu HOST 0`` takes
the limit off. It holds until the host's container restarts (wipe, kind, down), as an
``lxc-cgroup`` setting does.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed import TestbedError

CPU_CGROUP = Path(os.environ.get("TESTBED_CPU_CGROUP", "/sys/fs/cgroup/cpu"))
PERIOD_US = 100_000
#: the weight of a limited host against the machine's other processes (1024 each)
SHARES = 8192
DEFAULT_SHARES = 1024


def cgroup_of(pid: int) -> Path:
    """The cpu cgroup of the LXC container whose init is PID."""
    from testbed import lxc

    return lxc.payload_cgroup(pid, "cpu", CPU_CGROUP)


def limit(name: str, pid: int, cores: float) -> Path:
    """Hold host NAME (its container's init PID) to CORES cores; the cgroup's path."""
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        raise TestbedError(f"`cpu` needs the cgroup v1 cpu controller at {CPU_CGROUP} (this "
                           "machine has none); on a cgroup v2 LXC host the equivalent is "
                           "`lxc.cgroup2.cpu.max` in the container's config")
    if cores <= 0:
        raise TestbedError(f"cores must be > 0 (0 takes the limit off), got {cores}")
    cg = cgroup_of(pid)
    (cg / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
    (cg / "cpu.cfs_quota_us").write_text(f"{int(cores * PERIOD_US)}\n")
    (cg / "cpu.shares").write_text(f"{SHARES}\n")
    return cg


def unlimit(name: str, pid: int) -> None:
    """Undo ``limit``: no quota, the default weight."""
    cg = cgroup_of(pid)
    (cg / "cpu.cfs_quota_us").write_text("-1\n")
    (cg / "cpu.shares").write_text(f"{DEFAULT_SHARES}\n")


def cores_of(pid: int) -> float | None:
    """The container's limit in cores, None when it has none."""
    cg = cgroup_of(pid)
    q = int((cg / "cpu.cfs_quota_us").read_text())
    return None if q < 0 else q / int((cg / "cpu.cfs_period_us").read_text())

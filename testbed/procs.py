"""The processes of the testbed hosts: liveness, process trees, container inits left behind,
and the devices cgroup of the cgroup-denied scenario.

cgroup-denied: the host's processes are moved into a child of the (v1) devices cgroup that
denies read/write on the NVIDIA majors, as an LXC config without the
`lxc.cgroup*.devices.allow` lines does: opening the nodes really fails with EPERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from testbed import TestbedError, rootfs

DEVICES_CGROUP = Path(os.environ.get("TESTBED_DEVICES_CGROUP", "/sys/fs/cgroup/devices"))


def pid_running(pid: int) -> bool:
    """PID exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has exited already
        os.kill(pid, sig)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    """PID and every process below it."""
    return [pid, *(d for child in children(pid) for d in _descendants(child))]


def orphan_inits(upper: str) -> list[int]:
    """Container inits left running on the overlay with upper dir UPPER (e.g. after nspawn got
    SIGKILL)."""
    found = []
    needle = f"upperdir={upper},"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            nspid = next((ln.split()[1:] for ln in (proc / "status").read_text().splitlines()
                          if ln.startswith("NSpid:")), [])
            if len(nspid) < 2 or nspid[-1] != "1":
                continue  # not the init of a nested pid namespace
            if any(line.split()[4] == "/" and needle in line
                   for line in (proc / "mountinfo").read_text().splitlines()):
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def _move_procs(name: str, pids, src: Path, dest: Path, timeout: float) -> None:
    """Write each of PIDS() into DEST's cgroup.procs until PIDS() is empty: processes forked
    while we move inherit their parent's (old) cgroup, so one pass may not catch them all."""
    deadline = time.monotonic() + timeout
    while left := pids():
        if time.monotonic() > deadline:
            raise TestbedError(f"{name}: could not move every process from {src} to {dest}; "
                               f"left: {left[:10]}")
        for pid in left:
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                (dest / "cgroup.procs").write_text(f"{pid}\n")


def deny_devices(name: str, pid: int, timeout: float = 10.0) -> None:
    """Move host NAME's processes (PID and its descendants) into a devices cgroup that denies
    the NVIDIA majors."""
    if not (DEVICES_CGROUP / "devices.deny").exists():
        raise TestbedError(
            f"the cgroup-denied scenario needs the cgroup v1 devices controller at "
            f"{DEVICES_CGROUP} (this machine has none); on a cgroup v2 host with systemd the "
            "equivalent is `systemctl set-property --runtime <the container's scope> "
            "DevicePolicy=closed`")
    cg = DEVICES_CGROUP / f"testbed-{name}"
    cg.mkdir(exist_ok=True)
    for major in (195, rootfs.UVM_MAJOR):
        (cg / "devices.deny").write_text(f"c {major}:* rw\n")

    def outside():
        inside = set((cg / "cgroup.procs").read_text().split())
        return [p for p in _descendants(pid) if str(p) not in inside]

    _move_procs(name, outside, DEVICES_CGROUP, cg, timeout)


def allow_devices(name: str, timeout: float = 10.0) -> None:
    """Undo deny_devices: processes back to the parent cgroup, the child removed."""
    cg = DEVICES_CGROUP / f"testbed-{name}"
    if cg.exists():
        _move_procs(name, lambda: (cg / "cgroup.procs").read_text().split(), cg, DEVICES_CGROUP,
                    timeout)
        cg.rmdir()  # empty now, and nothing is left inside to fork into it

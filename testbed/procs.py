"""The processes of the testbed hosts: liveness, process trees, container inits left behind.
(The cgroup-denied scenario's devices cgroup: testbed/lxc.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


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

#!/usr/bin/env python3
"""Fault injector run ON a testbed host (stdlib only), detached from any SSH session.

    fault_watch.py ACTION PATTERN DEADLINE_S REPORT

Polls /proc every 20 ms (until DEADLINE_S) for a process whose command line contains
PATTERN (or starts with it: `^PATTERN`), then does ACTION to it and writes what it did to REPORT (JSON):

  drop-ssh   stop the process, kill -9 the sshd session process(es) that carry it (the SSH
             connection of the deploy drops, seen from the host side), then let it go on
  kill       kill -9 the process itself (an install killed half-way)

The test starts it with `systemd-run` so that killing sshd sessions never kills the watcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def find(pattern: str) -> int | None:
    """A process whose command line contains PATTERN (starts with it, if PATTERN starts with ^)."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        line = cmdline(int(name))
        if (line.startswith(pattern[1:]) if pattern.startswith("^") else pattern in line):
            return int(name)
    return None


def main(action: str, pattern: str, deadline_s: float, report: str) -> int:
    deadline = time.monotonic() + deadline_s
    pid = None
    while time.monotonic() < deadline:
        pid = find(pattern)
        if pid:
            break
        time.sleep(0.02)
    result = {"action": action, "pattern": pattern, "found": bool(pid)}
    if pid:
        result["pid"], result["cmdline"] = pid, cmdline(pid)
        if action == "kill":
            os.kill(pid, signal.SIGKILL)
        elif action == "drop-ssh":
            os.kill(pid, signal.SIGSTOP)
            chain, p = [], parent(pid)
            while p > 1:
                if comm(p) == "sshd" and parent(p) > 1 and comm(parent(p)) == "sshd":
                    chain.append(p)  # a per-connection sshd, not the listener
                p = parent(p)
            for p in chain:
                os.kill(p, signal.SIGKILL)
            result["killed_sshd"] = chain
            os.kill(pid, signal.SIGCONT)
        result["at"] = time.time()
    with open(report, "w") as fh:
        json.dump(result, fh)
    return 0 if pid else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]))

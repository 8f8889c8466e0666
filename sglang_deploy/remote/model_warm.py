#!/usr/bin/env python3
"""Read a model's shards into the page cache while the old server still serves (stdlib only).

  model_warm.py measure --model DIR
      {"model": <hoststate.model_state(DIR)>, "memory": {"available", "total"}}
  model_warm.py warm --model DIR [--keep-available BYTES] [--timeout-s S] [--every S]
      @@progress {"kind": "warm", "done_bytes", "total_bytes", "files_done", "files_total", ...}
      {"ok": true, "read_bytes", "seconds", "shard_bytes", "resident_before", "resident_after",
       "io_priority", "stopped"}

``warm`` runs at I/O priority idle (ioprio_set, else ``ionice -c3``) and nice 10, so that the
serving server's own reads come first. Shard by shard, window by window (64 MiB), only the
windows that are not already in the page cache (mincore, ``hoststate.resident_pages``):
posix_fadvise(WILLNEED) over them, then one sequential read that confirms they arrived. It
stops early, saying why, when MemAvailable falls below --keep-available (the margin the
controller's decision kept) or at --timeout-s: a warm is an optimisation, never a reason to
hold up the restart. Progress: one ``@@progress`` line every --every seconds (the bytes read
of those missing, and the files), as ``progress_watch.py`` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import hoststate
from progress_watch import Reporter

WINDOW = 64 << 20
CHUNK = 8 << 20
#: ioprio_set's system call number by machine (asm-generic: 30)
IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "ppc64le": 273, "s390x": 282, "i686": 289}


def idle_io_priority() -> str:
    """Put this process in the idle I/O class; returns how (``idle``) or why not."""
    number = IOPRIO_SET.get(platform.machine())
    if number is not None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            # ioprio_set(IOPRIO_WHO_PROCESS, 0 = this process, IOPRIO_CLASS_IDLE << 13)
            if libc.syscall(number, 1, 0, 3 << 13) == 0:
                return "idle"
        except (OSError, AttributeError):
            pass
    try:
        rc = subprocess.run(["ionice", "-c3", "-p", str(os.getpid())], stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=10, check=False).returncode
    except (OSError, subprocess.SubprocessError):
        rc = None
    return "idle (ionice)" if rc == 0 else "unchanged (neither ioprio_set nor ionice -c3 worked)"


def shard_paths(model: str) -> list[str]:
    state = hoststate.model_state(model, revisions=False)
    return [os.path.join(model, name) for name, info in sorted((state.get("shards") or {}).items())
            if info.get("exists")]


class Warm:
    """The read, its counters shared with the progress reporter."""

    def __init__(self, paths: list[str], keep_available: int, deadline: float) -> None:
        self.paths, self.keep, self.deadline = paths, keep_available, deadline
        self.plan: list[tuple[str, list[tuple[int, int]]]] = []  # path, missing windows
        self.total = self.done = self.files_done = 0
        self.stopped: str | None = None

    def measure(self) -> dict:
        return {"done_bytes": self.done, "total_bytes": self.total,
                "files_done": self.files_done, "files_total": len(self.plan)}

    def find_missing(self) -> None:
        page = hoststate.mmap_page_size()
        for path in self.paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                size, windows = os.fstat(fd).st_size, []
                for offset in range(0, size, WINDOW):
                    length = min(WINDOW, size - offset)
                    pages = hoststate.resident_pages(fd, offset, length)
                    if pages is None or pages < (length + page - 1) // page:
                        windows.append((offset, length))
            finally:
                os.close(fd)
            if windows:
                self.plan.append((path, windows))
                self.total += sum(length for _, length in windows)

    def why_stop(self) -> str | None:
        if time.monotonic() >= self.deadline:
            return "its deadline (--timeout-s) passed"
        avail = hoststate.meminfo().get("available")
        if avail is not None and avail < self.keep:
            return (f"MemAvailable fell to {avail} bytes, below the {self.keep} bytes kept "
                    "free")
        return None

    def run(self) -> None:
        buf = bytearray(CHUNK)
        for path, windows in self.plan:
            fd = os.open(path, os.O_RDONLY)
            try:
                for offset, length in windows:  # the kernel's readahead, queued at once
                    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
                for offset, length in windows:  # then read: each byte is there once it returns
                    self.stopped = self.why_stop()
                    if self.stopped:
                        return
                    end = offset + length
                    while offset < end:
                        got = os.preadv(fd, [memoryview(buf)[:min(CHUNK, end - offset)]], offset)
                        if got <= 0:
                            break
                        offset += got
                        self.done += got
            finally:
                os.close(fd)
            self.files_done += 1


def resident_total(paths: list[str]) -> int | None:
    found = [hoststate.resident_bytes(p) for p in paths]
    return None if any(r is None for r in found) else sum(found)


def cmd_warm(args) -> dict:
    started = time.monotonic()
    prio = idle_io_priority()
    try:
        os.nice(10)
    except OSError:
        pass
    paths = shard_paths(args.model)
    before = resident_total(paths)
    warm = Warm(paths, args.keep_available, started + args.timeout_s)
    warm.find_missing()
    # stdout gone (the SSH connection closed): nobody watches, stop reading
    reporter = Reporter(warm.measure, args.every, "warm",
                        on_gone=lambda: setattr(warm, "deadline", 0.0))
    reporter.start()
    try:
        warm.run()
    finally:
        reporter.finish()
    return {"ok": True, "read_bytes": warm.done, "to_read_bytes": warm.total,
            "seconds": round(time.monotonic() - started, 3),
            "shard_bytes": sum(os.path.getsize(p) for p in paths), "resident_before": before,
            "resident_after": resident_total(paths), "io_priority": prio,
            "stopped": warm.stopped}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="model_warm.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    me = sub.add_parser("measure")
    me.add_argument("--model", required=True)
    wa = sub.add_parser("warm")
    wa.add_argument("--model", required=True)
    wa.add_argument("--keep-available", type=int, default=0)
    wa.add_argument("--timeout-s", type=float, default=1800.0)
    wa.add_argument("--every", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.cmd == "measure":
        out = {"model": hoststate.model_state(args.model, revisions=False),
               "memory": hoststate.meminfo()}
    else:
        try:
            out = cmd_warm(args)
        except OSError as exc:  # a shard removed or unreadable: said, the restart goes on
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0 if out.get("ok", True) else 3


if __name__ == "__main__":
    sys.exit(main())

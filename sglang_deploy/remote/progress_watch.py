#!/usr/bin/env python3
"""Run a long command and report its progress from what it writes to disk (stdlib only).

  progress_watch.py [--every S] [--kind venv] [--venv DIR] [--packages N] [--cache DIR] -- CMD...

CMD runs with this process's stdin closed and its stdout/stderr (its own messages pass
through). Every S seconds (and once at the end) one line goes to stdout:

  @@progress {"kind": "venv", "elapsed_s": 35.0, "packages": 41, "packages_total": 180,
              "venv_bytes": ..., "cache_bytes": ...}

measured, not estimated: ``packages`` counts the ``*.dist-info`` folders in the venv's
site-packages, ``venv_bytes`` the venv's bytes, ``cache_bytes`` the bytes of what CMD added
to the uv cache (wheels downloaded or read from a wheelhouse and unpacked there, before uv
links them into the venv). The exit status is CMD's (128+N for
signal N). If stdout goes away (the SSH connection closed), CMD is stopped: an install
nobody watches is not left running behind a deploy that ended.

``folder_bytes`` and ``Reporter`` are also used by model_fetch.py (the model download).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

MARK = "@@progress "


def folder_bytes(paths, seen=None, skip=()) -> int:
    """Bytes of the regular files under PATHS, each inode counted once (a hard link is one
    file); folders named in SKIP are not entered."""
    seen = set() if seen is None else seen
    total = 0
    for top in paths:
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d not in skip]
            for name in files:
                try:
                    st = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue  # replaced or removed while walking
                key = (st.st_dev, st.st_ino)
                if key in seen or not stat.S_ISREG(st.st_mode):
                    continue
                seen.add(key)
                total += st.st_size
    return total


def emit(event: dict, out=None) -> None:
    out = out or sys.stdout
    out.write(MARK + json.dumps(event, sort_keys=True) + "\n")
    out.flush()


class Reporter(threading.Thread):
    """Calls MEASURE() every EVERY seconds and prints its dict (plus elapsed_s) until stopped;
    a broken stdout calls ON_GONE once."""

    def __init__(self, measure, every: float = 5.0, kind: str = "", on_gone=None) -> None:
        super().__init__(daemon=True)
        self.measure, self.every, self.kind, self.on_gone = measure, every, kind, on_gone
        self.started = time.monotonic()
        self.done = threading.Event()

    def report(self) -> bool:
        try:
            event = {"kind": self.kind, **self.measure(),
                     "elapsed_s": round(time.monotonic() - self.started, 1)}
            emit(event)
            return True
        except (BrokenPipeError, OSError):
            if self.on_gone:
                self.on_gone()
            return False

    def run(self) -> None:
        # on a fixed schedule (start + k * EVERY), so measuring does not stretch the period
        tick = 1
        while not self.done.wait(max(self.started + tick * self.every - time.monotonic(), 0)):
            if not self.report():
                return
            tick = int((time.monotonic() - self.started) // self.every) + 1

    def finish(self) -> None:
        self.done.set()
        self.join(timeout=self.every + 5)
        self.report()


def venv_measure(venv: str | None, cache: str | None, packages_total: int | None):
    archive = os.path.join(cache, "archive-v0") if cache else None
    before = set(os.listdir(archive)) if archive and os.path.isdir(archive) else set()

    def measure() -> dict:
        venv_bytes = folder_bytes([venv]) if venv else 0  # a missing folder has 0 bytes
        site = os.path.join(glob.escape(venv or ""), "lib", "*", "site-packages")
        packages = len(glob.glob(os.path.join(site, "*.dist-info"))) if venv else 0
        new = []
        if archive and os.path.isdir(archive):
            new = [os.path.join(archive, n) for n in os.listdir(archive) if n not in before]
        return {"packages": packages, "packages_total": packages_total, "venv_bytes": venv_bytes,
                "cache_bytes": folder_bytes(new)}

    return measure


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("progress_watch.py: usage: [options] -- CMD...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="progress_watch.py")
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--kind", default="venv")
    parser.add_argument("--venv")
    parser.add_argument("--packages", type=int)
    parser.add_argument("--cache", default=os.environ.get("UV_CACHE_DIR"))
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        print("progress_watch.py: no command after --", file=sys.stderr)
        return 2
    measure = venv_measure(args.venv, args.cache, args.packages)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def stop_child(*_):
        if child.poll() is None:
            child.terminate()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop_child)
    reporter = Reporter(measure, args.every, args.kind, on_gone=stop_child)
    reporter.start()
    rc = child.wait()
    reporter.finish()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())

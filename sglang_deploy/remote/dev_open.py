#!/usr/bin/env python3
"""Open test of the NVIDIA device nodes (stdlib only; the ``dev-open.txt`` of a snapshot).

Opens every /dev/nvidia* character device read-write and non-blocking, closes it, and prints
one line per node: ``<path> ok`` or ``<path> <ERRNO NAME> <message>``. EPERM means the
container's device cgroup refused the open; ENXIO/ENODEV mean the cgroup permitted it and no
driver instance answered.
"""

import errno
import glob
import os
import stat
import sys


def open_test(paths=None):
    if paths is None:
        paths = sorted(glob.glob("/dev/nvidia*"))
    lines = []
    for path in paths:
        try:
            if not stat.S_ISCHR(os.stat(path).st_mode):
                continue
        except OSError:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            lines.append(f"{path} {code} {exc.strerror}")
        else:
            os.close(fd)
            lines.append(f"{path} ok")
    return "\n".join(lines) + ("\n" if lines else "")


if __name__ == "__main__":
    sys.stdout.write(open_test(sys.argv[1:] or None))

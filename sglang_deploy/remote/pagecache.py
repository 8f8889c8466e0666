#!/usr/bin/env python3
"""The page cache's view of a file (stdlib only, part of ``hoststate.py``): how many of its
bytes are resident (mincore over a read-only mapping, nothing read) and the host's
MemAvailable. Imported by ``hoststate.py`` and ``model_warm.py`` in the tools folder; inlined
into ``hoststate.py`` where that is fed on stdin (``hostops.facts.stdin_script``)."""

from __future__ import annotations

import os
import sys

#: bytes of the file mapped per mincore call (its vector: one byte per page)
RESIDENCY_WINDOW = 1 << 30
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore: only the low bit of each byte means


def resident_pages(fd: int, offset: int, length: int) -> int | None:
    """Pages of the file FD in [OFFSET, OFFSET+LENGTH) in the page cache (OFFSET a multiple of
    the page size): the range mapped read-only (libc's mmap through ctypes), mincore,
    unmapped; no page is read. None when it cannot be told (not Linux, mapping refused)."""
    import ctypes

    if not sys.platform.startswith("linux") or length <= 0:
        return 0 if length <= 0 else None
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                         ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (length + mmap_page_size() - 1) // mmap_page_size()
    addr = lib.mmap(None, length, 1, 1, fd, offset)  # PROT_READ, MAP_SHARED
    if addr is None or addr == ctypes.c_void_p(-1).value:
        return None
    try:
        vec = (ctypes.c_ubyte * pages)()
        if lib.mincore(ctypes.c_void_p(addr), length, vec) != 0:
            return None
        return bytes(vec).translate(_LOW_BIT).count(1)
    finally:
        lib.munmap(ctypes.c_void_p(addr), length)


def mmap_page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path: str) -> int | None:
    """Bytes of the file at PATH in the page cache (whole pages, at most its size). None when
    it cannot be told (``resident_pages``), or when the kernel would not say: since Linux 5.2
    mincore reports a file's cache only to root, its owner or a process that may write it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st, done = os.fstat(fd), 0
        if os.geteuid() not in (0, st.st_uid) and not os.access(path, os.W_OK):
            return None
        for offset in range(0, st.st_size, RESIDENCY_WINDOW):
            length = min(RESIDENCY_WINDOW, st.st_size - offset)
            pages = resident_pages(fd, offset, length)
            if pages is None:
                return None
            done += min(pages * mmap_page_size(), length)
        return done
    finally:
        os.close(fd)


def meminfo() -> dict:
    """MemAvailable and MemTotal of /proc/meminfo, in bytes (None: not reported)."""
    found = {"available": None, "total": None}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                name = {"MemAvailable": "available", "MemTotal": "total"}.get(key)
                words = rest.split()
                if name and words and words[0].isdigit():
                    found[name] = int(words[0]) * (1024 if words[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return found

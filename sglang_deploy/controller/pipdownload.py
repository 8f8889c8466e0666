"""Wheels for the HOSTS' platform, fetched by pip's own ``pip download`` with hashes.

Used by ``sglang-deploy wheelhouse`` (every wheel of a lock) and by the controller's flag
check (the sglang wheel the lock names). pip brings index credentials (pip.conf, netrc,
keyring), retries, progress and the hash check; nothing here talks to an index itself.
The argv is built by pure functions (``platforms``, ``download_argv``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sglang_deploy.controller import runner

DEFAULT_PYTHON = "3.11"  # Debian 12's python3
DEFAULT_GLIBC = (2, 36)  # Debian 12
DEFAULT_ARCH = "x86_64"


def platforms(glibc: tuple[int, int] = DEFAULT_GLIBC, arch: str = DEFAULT_ARCH) -> list[str]:
    """Every platform tag a glibc GLIBC/ARCH host accepts, most specific first (pip expands
    only the legacy manylinux2014/2010 aliases itself, not ``manylinux_2_X``)."""
    tags = [f"manylinux_{glibc[0]}_{m}_{arch}" for m in range(glibc[1], 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}",
                   f"linux_{arch}"]


def download_argv(requirements: str | os.PathLike, dest: str | os.PathLike, *,
                  python: str = DEFAULT_PYTHON, glibc: tuple[int, int] = DEFAULT_GLIBC,
                  arch: str = DEFAULT_ARCH, index_url: str | None = None,
                  require_hashes: bool = True, extra: Sequence[str] = ()) -> list[str]:
    """``python -m pip download`` of every line of REQUIREMENTS (a file) into DEST: binary
    wheels for CPython PYTHON on glibc GLIBC/ARCH only, no dependency resolution (a lock is
    complete, and a ``--no-deps`` lock is meant to be partial)."""
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python, "-d", str(dest), "-r", str(requirements)]
    for tag in platforms(glibc, arch):
        argv += ["--platform", tag]
    if require_hashes:
        argv.append("--require-hashes")
    if index_url:
        argv += ["--index-url", index_url]
    return argv + list(extra)


def download(requirements: str, dest: str | os.PathLike, *, quiet: bool = False,
             on_line: Callable[[str], None] | None = None, **kw) -> tuple[int, str, list[str]]:
    """Run pip download for the REQUIREMENTS text into DEST.

    Returns (exit status, pip's output, the file names that are new in DEST)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in dest.iterdir()}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="requirements-") as req:
        req.write(requirements)
        req.flush()
        argv = download_argv(req.name, dest, **kw) + (["--quiet"] if quiet else [])
        try:
            rc, output = runner.run_lines(argv, on_line)
        except OSError as exc:
            return 127, str(exc), []
    new = sorted(p.name for p in dest.iterdir() if p.name not in before
                 and p.name.endswith(".whl"))
    return rc, output, new


def error_line(output: str) -> str:
    """pip's own error line (``ERROR: ...``), else the last line of its output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()] or ["no output"]
    return next((ln for ln in reversed(lines) if ln.startswith("ERROR:")), lines[-1])


#: pip's (urllib3's) words for an index it could not talk to, most specific first, and what
#: they mean; the host comes from the same message (``host='pypi.org', port=443``)
_UNREACHABLE = (
    (re.compile(r"ProxyError|Cannot connect to proxy|Tunnel connection failed", re.IGNORECASE),
     "the proxy cannot be reached"),
    (re.compile(r"NameResolutionError|Failed to resolve|name resolution|Name or service not "
                r"known|nodename nor servname|getaddrinfo failed|No address associated", re.IGNORECASE),
     "cannot resolve {host}"),
    (re.compile(r"Network is unreachable|No route to host", re.IGNORECASE),
     "network unreachable ({addr})"),
    (re.compile(r"Connection refused", re.IGNORECASE), "{addr} refused the connection"),
    (re.compile(r"timed out|ConnectTimeoutError|ReadTimeoutError", re.IGNORECASE),
     "{addr} did not answer in time"),
    (re.compile(r"Connection reset|Connection aborted|RemoteDisconnected|"
                r"NewConnectionError|Max retries exceeded", re.IGNORECASE),
     "no connection to {addr}"),
)
_HOST = re.compile(r"host='([^']+)', port=(\d+)")


def unreachable(output: str) -> str | None:
    """Why pip could not reach its index, from pip's OUTPUT (its retry warnings and errors:
    name resolution, refused or unreachable connections, timeouts, proxy), e.g. ``cannot
    resolve pypi.org``; None when pip talked to an index (then its own error line says what
    was wrong, e.g. no such version)."""
    for line in output.splitlines():
        if not re.search(r"connection broken by|Connection|Error|timed out|resolve", line):
            continue
        for pattern, text in _UNREACHABLE:
            if pattern.search(line):
                m = _HOST.search(line)
                return text.format(host=m.group(1) if m else "the index",
                                   addr=f"{m.group(1)}:{m.group(2)}" if m else "the index")
    return None

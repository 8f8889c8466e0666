"""Wheels for the HOSTS' platform, fetched by pip's own ``pip download`` with hashes.

Used by ``sglang-deploy wheelhouse`` (every wheel of a lock) and by the controller's flag
check (the sglang wheel the lock names). pip brings index credentials (pip.conf, netrc,
keyring), retries, progress and the hash check; nothing here talks to an index itself.
The argv is built by pure functions (``platforms``, ``download_argv``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sglang_deploy.shell import runner

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

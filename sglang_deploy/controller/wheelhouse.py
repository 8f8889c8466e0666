"""A local wheelhouse filled with every wheel of a lock (``sglang-deploy wheelhouse``, and the
testbed's own): pip's ``pip download --require-hashes`` for the hosts' platform
(``pipdownload``), then uv's own wheel."""

from __future__ import annotations

from pathlib import Path

from sglang_deploy.controller import pipdownload
from sglang_deploy.controller.pipdownload import DEFAULT_ARCH, DEFAULT_GLIBC, DEFAULT_PYTHON
from sglang_deploy.core import lockfile
from sglang_deploy.core.errors import UsageError, WheelhouseError


def fill(lock: Path, dest: Path, *, index: str | None = None, python: str = DEFAULT_PYTHON,
         glibc: tuple[int, int] = DEFAULT_GLIBC, arch: str = DEFAULT_ARCH,
         uv_version: str | None = None, log=lambda msg: None) -> dict:
    """Put every wheel of LOCK (and uv) into DEST with pip download.

    Returns {"fetched": [new wheel files], "pins": number of pins of the lock}."""
    if not lock.is_file():
        raise UsageError(what="LOCK: a lock file with hashes (locks/NAME.txt)",
                         found=f"no file {lock}", fix="make it with `sglang-deploy lock locks/NAME.in`")
    pins = lockfile.parse_lock(lock.read_text(), str(lock))
    kw = {"python": python, "glibc": glibc, "arch": arch, "index_url": index, "on_line": log}
    steps = [("".join(p.requirement() + "\n" for p in pins), True, f"the {len(pins)} pins of {lock}")]
    if uv_version:
        steps.append((f"uv=={uv_version}\n", False, f"uv=={uv_version}"))
    fetched: list[str] = []
    for requirements, hashed, what in steps:
        rc, output, new = pipdownload.download(requirements, dest, require_hashes=hashed, **kw)
        fetched += new
        if rc != 0:
            raise WheelhouseError(
                what=f"a wheel for CPython {python} on manylinux glibc {glibc[0]}.{glibc[1]} "
                     f"{arch} whose hash is in the lock, for {what}",
                found=f"pip download failed: {pipdownload.error_line(output)}",
                fix="pin versions that publish such wheels (or build them and add them by "
                    "hand: an offline host cannot build sdists); check --index-url and the "
                    "network")
    return {"fetched": fetched, "pins": len(pins) + (1 if uv_version else 0)}

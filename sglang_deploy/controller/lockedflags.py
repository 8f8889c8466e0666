"""The launch flags checked on the CONTROLLER, before any connection, against the flags the
LOCKED sglang defines.

The lock (``sglang_lock``) pins ``sglang==VERSION`` with the sha256 of each of its wheels.
The flags of that version are read statically (``flags.spec_from_wheel``: its
``server_args.py``, nothing imported) from one of those wheels: found in ``sglang_wheelhouse``
when that folder exists on the controller, else in the controller's wheel cache, else
downloaded there by pip by the exact pin and hashes. The parsed flags are kept by the wheel's
sha256 (``flagcache``), so a later run reads a small JSON file and no wheel at all. When no
wheel can be had (offline, no wheelhouse) the check is skipped with a warning: the check on
the host, after the install, stays the final guard.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_deploy.controller import flagcache, pipdownload
from sglang_deploy.core import data as datamod
from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import lockfile, service
from sglang_deploy.core.errors import DataError, FlagError


def cache_root() -> Path:
    return Path(os.environ.get("SGLANG_DEPLOY_CACHE", "~/.cache/sglang-deploy")).expanduser()


def wheel_cache() -> Path:
    """Where downloaded wheels are kept (shared with the testbed's wheel cache)."""
    env = os.environ.get("SGLANG_DEPLOY_WHEEL_CACHE")
    return Path(env).expanduser() if env else cache_root() / "wheels"


def spec_cache() -> Path:
    """Parsed flags by wheel sha256 (``flagcache`` entries)."""
    return cache_root() / "flagspec-wheels"


@dataclass(frozen=True)
class LockedFlags:
    version: str
    spec: flagmod.FlagSpec | None
    source: str            # the wheel (or cache entry) the flags come from
    warning: str | None = None


def find_wheel(pin: lockfile.Pin, folders: list[Path]) -> tuple[Path, str] | None:
    """(wheel, sha256) of a wheel of PIN in FOLDERS whose sha256 is one of the lock's."""
    for folder in folders:
        if not folder.is_dir():
            continue
        for wheel in sorted(folder.glob(f"sglang-{pin.version}-*.whl")):
            with open(wheel, "rb") as fh:
                sha = hashlib.file_digest(fh, "sha256").hexdigest()
            if sha in pin.hashes:
                return wheel, sha
    return None


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def download_note(version: str, dest: Path) -> str:
    """The one line said before the controller downloads the locked sglang wheel."""
    return (f"sglang-deploy: downloading the sglang {version} wheel (pip download, once per "
            f"version) into {dest}, to check the launch flags against it on the controller")


def no_wheel_warning(version: str, lock: Path, folders: list[Path], pip_output: str) -> str:
    """Why no wheel of LOCK's sglang VERSION could be had (offline: "no network", from pip's
    own output), and the fix."""
    where = " or ".join(str(f) for f in folders)
    reason = pipdownload.unreachable(pip_output)
    if reason:
        why = (f"no network: pip could not reach the package index ({reason}), and no wheel "
               f"of sglang=={version} with a hash of {lock} is in {where}")
        fix = ("fix: make an index reachable (pip's index-url or proxy settings), or put that "
               f"wheel in {where} (`sglang-deploy wheelhouse {lock} DIR` where there is "
               "network, then set `sglang_wheelhouse`)")
    else:
        why = (f"no wheel of sglang=={version} with a hash of {lock} in {where}, and pip could "
               f"not download one ({pipdownload.error_line(pip_output)})")
        fix = ("fix: an index that serves that wheel, or put it in "
               f"{where} (`sglang-deploy wheelhouse {lock} DIR`)")
    return (f"the launch flags were not checked on the controller: {why}; the host checks "
            f"them after the install; {fix}")


def locked_flags(lock: Path, wheelhouse: str | None = None,
                 note: Callable[[str], None] = _stderr) -> LockedFlags:
    """The flags of the sglang version LOCK pins (see the module docstring). NOTE is told,
    in one line, before a wheel is downloaded."""
    pin = lockfile.sglang_pin(lock.read_text(), str(lock))
    for sha in sorted(pin.hashes):
        spec = flagcache.load(spec_cache(), sha)
        if spec is not None:
            return LockedFlags(pin.version, spec, f"the flags of wheel sha256:{sha[:12]} (cached)")
    folders = ([Path(wheelhouse)] if wheelhouse else []) + [wheel_cache()]
    found = find_wheel(pin, folders)
    if found is None:
        note(download_note(pin.version, wheel_cache()))
        _, output, _ = pipdownload.download(pin.requirement() + "\n", wheel_cache(), quiet=True,
                                             extra=("--timeout", "20", "--retries", "1"))
        found = find_wheel(pin, [wheel_cache()])
        if found is None:
            return LockedFlags(pin.version, None, "",
                               warning=no_wheel_warning(pin.version, lock, folders, output))
    wheel, sha = found
    spec = flagmod.spec_from_wheel(wheel, pin.version)
    flagcache.store(spec_cache(), sha, spec)
    return LockedFlags(pin.version, spec, str(wheel))


@functools.lru_cache(maxsize=16)  # a cache: a lock file's version (its mtime) never changes
def _locked_flags_once(lock: str, mtime_ns: int, wheelhouse: str | None) -> LockedFlags:
    return locked_flags(Path(lock), wheelhouse)


def check(settings: datamod.Settings, cwd: str | os.PathLike = ".",
          warn: Callable[[str], None] | None = None) -> list[flagmod.Problem]:
    """Check one host's launch flags against the locked sglang; raise DataError (key
    ``sglang_flags``) naming each bad flag and the closest flag of that version. Returns the
    warnings (deprecated flags). Reads the lock once per file version and run. WARN is told
    why the flags could not be checked here, for each host (``hooks.validate_inventory``
    tells a run's warning once)."""
    lock = Path(cwd) / settings.sglang_lock
    locked = _locked_flags_once(str(lock), lock.stat().st_mtime_ns, settings.sglang_wheelhouse)
    if locked.spec is None:
        if warn is not None:
            warn(locked.warning or "")
        return []
    try:
        return flagmod.check_flags(service.flag_map(settings, with_api_key=True), locked.spec,
                                   locked.version, forbidden={})
    except FlagError as exc:
        raise DataError(key="sglang_flags",
                        what=f"launch flags that the locked SGLang {locked.version} defines "
                             f"({settings.sglang_lock})",
                        found=exc.found, fix=exc.fix, details=exc.details) from exc

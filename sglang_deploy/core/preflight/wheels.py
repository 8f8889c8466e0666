"""Will the lock's wheels install on the host (pure): its system python and its glibc.

The release venv is made from ``sglang_system_python`` and ``uv pip sync`` installs the
lock's wheels into it: CPython wheels of the lock's python (sglang 0.5.12.post1 is
``cp311-cp311-manylinux_2_34_x86_64``) and manylinux wheels, which install only on a glibc at
least as new as their tag. The host-state read reports both (``hoststate.py``: ``python``,
``glibc``), before anything is installed; these checks turn them into the pre-flight's rows
instead of a failed ``uv pip sync`` minutes later.

What a lock needs (:func:`lock_target`):

- python: the lock's header (``# sglang-deploy lock: platform ..., python X.Y``, or a
  ``--python-version X.Y`` in uv's command line) when it records one, else
  :data:`LOCK_PYTHON`, the default of ``sglang-deploy lock`` (``commands/lock.py``
  ``DEFAULT_PYTHON``: a lock is compiled for CPython 3.11 unless told otherwise).
- glibc: :data:`SGLANG_GLIBC` (2.34) when the lock pins sglang >= 0.5.11, whose wheels are
  ``manylinux_2_34``; no minimum for an older sglang (any glibc; its wheel tags are not in
  the lock's text). Only a host without glibc (musl) fails then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from sglang_deploy.core.data import KEYS
from sglang_deploy.core.preflight.checks import Check, _fail

#: the python a lock is compiled for when its header does not say (``sglang-deploy lock``'s
#: default, commands/lock.py DEFAULT_PYTHON: Debian 12's python3)
LOCK_PYTHON = "3.11"
#: the glibc sglang's wheels need from this version on: they are manylinux_2_34
SGLANG_GLIBC = "2.34"
SGLANG_GLIBC_SINCE = "0.5.11"

#: the glibc of ``sglang-deploy lock``'s default platform (commands/lock.py DEFAULT_PLATFORM,
#: ``x86_64-manylinux_2_36``): a host with an older glibc needs a lock made for its own
LOCK_PLATFORM_GLIBC = "2.36"
#: the oldest python sglang supports (its ``requires-python``): no lock can be made for older
SGLANG_MIN_PYTHON = "3.10"

_HEADER_PYTHON = re.compile(r"--python-version[ =]+(\d+\.\d+)")


@dataclass(frozen=True)
class WheelTarget:
    """What the lock's wheels need on the host: python X.Y, and glibc >= min_glibc (None:
    any glibc)."""

    python: str = LOCK_PYTHON
    min_glibc: str | None = SGLANG_GLIBC
    sglang_version: str | None = None


def lock_target(lock_text: str, sglang_version: str) -> WheelTarget:
    """The host a lock's wheels need: python from the header's ``--python-version`` (the
    comment lines before the first pin), else :data:`LOCK_PYTHON`; glibc from the sglang pin
    (SGLANG_VERSION, ``lockfile.sglang_pin``)."""
    from sglang_deploy.core import lockfile  # (its errors import pyinfra: not at --help)

    python = lockfile.parse_header(lock_text).python or LOCK_PYTHON
    for line in lock_text.splitlines():
        if line.strip() and not line.startswith("#"):
            break
        m = _HEADER_PYTHON.search(line)
        if m:
            python = m.group(1)
            break
    try:
        new = Version(sglang_version) >= Version(SGLANG_GLIBC_SINCE)
    except InvalidVersion:
        new = True  # an unreadable pin: ask for what the current wheels need
    return WheelTarget(python=python, min_glibc=SGLANG_GLIBC if new else None,
                       sglang_version=sglang_version)


def _version(text: str | None, parts: int = 2) -> tuple[int, ...] | None:
    """(3, 11) from "3.11" or "3.11.2"; None for None or a text that is no such version."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)+)\s*", text or "")
    if not m:
        return None
    numbers = tuple(int(n) for n in m.group(1).split("."))
    return numbers[:parts] if len(numbers) >= parts else None


def _floor(text: str) -> tuple[int, ...]:
    """The version of a floor this module or the lock names ("3.10", "2.34"): always one."""
    version = _version(text)
    if version is None:
        raise ValueError(f"not a version floor: {text!r}")
    return version


def lock_command(python: str, glibc: str | None = None) -> str | None:
    """The command that makes a lock for a host with PYTHON ("3.12") and GLIBC ("2.35"), or
    None when sglang cannot run on that python (older than :data:`SGLANG_MIN_PYTHON`, or not
    a version). The platform is named only when the host's glibc is older than the one
    ``sglang-deploy lock`` assumes (:data:`LOCK_PLATFORM_GLIBC`)."""
    have = _version(python)
    if have is None or have < _floor(SGLANG_MIN_PYTHON):
        return None
    minor = ".".join(map(str, have))
    platform = ""
    libc = _version(glibc)
    if libc is not None and libc < _floor(LOCK_PLATFORM_GLIBC):
        platform = f" --platform x86_64-manylinux_{libc[0]}_{libc[1]}"
    return (f"sglang-deploy lock --python-version {minor}{platform} locks/NAME.in "
            f"--output locks/NAME-py{minor.replace('.', '')}.txt")


def check_python(python: str | None, target: WheelTarget = WheelTarget(),
                 system_python: str = KEYS["sglang_system_python"].default,
                 glibc: str | None = None) -> Check:
    """The host's system python (``hoststate.py``'s ``python``, "3.11") against the lock's.
    A host whose python differs is told first how to make a lock for its own python
    (:func:`lock_command`; GLIBC, the host's, picks the platform), else to install the
    lock's."""
    want = f"Python {target.python} (the lock is compiled for CPython {target.python})"
    have = _version(python)
    if have is not None and have == _version(target.python):
        return Check("host-python", "pass", f"Python {python} ({system_python}), as the lock needs")
    install = (f"install CPython {target.python} on the host (Debian 12's python3 is 3.11) and "
               f"point `sglang_system_python` at it (now {system_python}); the release venv is "
               "made from that python")
    command = lock_command(python or "", glibc)
    if command and have is not None:  # a lock command is made only for a known version
        fix = (f"Make a lock for the host's Python {'.'.join(map(str, have))}: `{command}` "
               "(locks/NAME.in: the input of the lock in use), then point the data key "
               "`sglang_lock` at the new lock (group_data/all.py, or the host's data in the "
               f"inventory; `sglang-deploy lock --check` proves it). Or {install}")
    else:
        fix = install[0].upper() + install[1:] + (
            f" (sglang needs Python >= {SGLANG_MIN_PYTHON})" if have is not None else "")
    if have is None:
        return _fail("host-python", f"the version of {system_python} is unknown",
                     expected=want, found=f"unknown ({python!r})", fix=fix)
    return _fail("host-python",
                 f"{system_python} is Python {python}; the lock's wheels are for {target.python}",
                 expected=want, found=f"Python {python}", fix=fix)


def check_glibc(glibc: str | None, target: WheelTarget = WheelTarget()) -> Check:
    """The host's glibc (``hoststate.py``'s ``glibc``, "2.36"; None: not glibc, or unreadable)
    against the lock's manylinux wheels."""
    need = target.min_glibc
    if need:
        pins = f"the lock pins sglang {target.sglang_version}; " if target.sglang_version else ""
        expected = (f"glibc >= {need} ({pins}sglang >= {SGLANG_GLIBC_SINCE} wheels are "
                    f"manylinux_{need.replace('.', '_')})")
    else:
        expected = "glibc (the lock's wheels are manylinux wheels)"
    fix = ("Run the container from an image with " + (f"glibc {need} or newer" if need else "glibc")
           + " (Debian 12: glibc 2.36 and python 3.11, what the lock is made for); glibc cannot "
           "be upgraded in place")
    have = _version(glibc)
    if have is None:
        return _fail("host-glibc", "no glibc version found on the host (another C library, "
                     "such as musl, cannot install manylinux wheels)",
                     expected=expected, found=f"unknown ({glibc!r})", fix=fix)
    if need and have < _floor(need):
        return _fail("host-glibc", f"glibc {glibc} is older than the {need} the lock's wheels need",
                     expected=expected, found=f"glibc {glibc}", fix=fix)
    return Check("host-glibc", "pass", f"glibc {glibc}"
                 + (f" (>= {need}, as the lock's wheels need)" if need else ""))


def check_wheel_platform(python: str | None, glibc: str | None,
                         target: WheelTarget = WheelTarget(),
                         system_python: str = KEYS["sglang_system_python"].default) -> list[Check]:
    """Both checks: ``host-python`` and ``host-glibc``."""
    return [check_python(python, target, system_python, glibc), check_glibc(glibc, target)]

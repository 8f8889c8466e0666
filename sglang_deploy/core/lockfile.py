"""The release lock (``locks/NAME.txt``, ``uv pip compile --generate-hashes``), read (pure).

``Lock.of(text)`` is the one parsed form of a lock, cached per text (every host of a fleet
names the same lock): its pins with their sha256 hashes, its header, the version of any
package (``version``), the ``sglang`` pin the launch flags are checked against, and the
release id (the text's hash). ``parse_lock`` and ``sglang_pin`` are its two raising readers.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from sglang_deploy.core.errors import DataError


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]

    def requirement(self) -> str:
        """``name==version --hash=sha256:...`` (one line of a requirements file)."""
        return f"{self.name}=={self.version} " + " ".join(
            f"--hash=sha256:{h}" for h in sorted(self.hashes))


def _scan(text: str, source: str) -> tuple[tuple[Pin, ...], DataError | None]:
    """Every ``name==version`` pin (continuation lines joined), and the first problem that
    makes the text no installable lock: a line not pinned with ==, a pin without hashes."""
    joined = re.sub(r"\\\n", " ", text)
    pins, problem = [], None
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            problem = problem or DataError(
                key="sglang_lock", what=f"every requirement of {source} pinned with ==",
                found=f"`{line[:120]}`", fix="regenerate it: sglang-deploy lock")
            continue
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if not hashes:
            problem = problem or DataError(
                key="sglang_lock", what=f"hashes for every pin of {source}",
                found=f"{m.group(1)} has none", fix="regenerate the lock with `sglang-deploy lock`")
        pins.append(Pin(str(canonicalize_name(m.group(1))), m.group(2), hashes))
    return tuple(pins), problem


def parse_lock(text: str, source: str = "the lock") -> list[Pin]:
    """Pins of a hashed lock; raises DataError for a line that is not pinned with == or a pin
    without hashes."""
    lock = Lock.of(text, source)
    if lock.problem is not None:
        raise lock.problem
    return list(lock.pins)


def sglang_pin(text: str, source: str = "the lock") -> Pin:
    """The ``sglang==VERSION`` pin of a lock, with its hashes."""
    for pin in parse_lock(text, source):
        if pin.name == "sglang":
            return pin
    raise DataError(key="sglang_lock", what=f"{source} pins sglang==VERSION",
                    found="no sglang pin", fix="add sglang to the .in file and re-lock")


# ------------------------------------------------------------------ making and reading locks

#: the header line ``sglang-deploy lock`` writes under uv's own: the target it resolved for
TARGET_PREFIX = "# sglang-deploy lock: "
BOUNDS_PREFIX = "# bounded by: "


@dataclass(frozen=True)
class LockInput:
    """The directives of a ``locks/NAME.in`` (comment lines, so plain uv still reads it):

    - ``# lock-options: --no-deps``: uv options;
    - ``# constraint: kernels<0.15``: a uv constraint (bounds a package only if something
      requires it; never adds one), the reason in the comment lines above it;
    - ``# versions-from: glm5-blackwell.txt``: every package of that lock that this one also
      resolves gets that lock's version (path relative to the .in file).
    """

    options: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    versions_from: tuple[str, ...] = ()


def parse_input(text: str) -> LockInput:
    import shlex

    options, constraints, versions_from = [], [], []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or not key.startswith("#"):
            continue
        key = key.lstrip("#").strip()
        if key == "lock-options":
            options += shlex.split(value)
        elif key == "constraint":
            constraints.append(value.split("#", 1)[0].strip())
        elif key == "versions-from":
            versions_from.append(value.strip())
    return LockInput(tuple(options), tuple(c for c in constraints if c), tuple(versions_from))


def pins_as_constraints(lock_text: str, source: str = "the lock") -> str:
    """A constraints file (``name==version`` lines, no hashes) of every pin of a lock."""
    return "".join(f"{p.name}=={p.version}\n" for p in parse_lock(lock_text, source))


def header_lines(platform: str, python: str, constraints: Iterable[str] = (),
                 constraint_files: Iterable[str] = (), versions_from: Iterable[str] = (),
                 options: Sequence[str] = ()) -> list[str]:
    """The lines ``sglang-deploy lock`` adds under uv's header: the target, and everything
    that bounded the resolution besides the requirements."""
    lines = [f"{TARGET_PREFIX}platform {platform}, python {python}"
             + (f", options {' '.join(options)}" if options else "")]
    lines += [f"{BOUNDS_PREFIX}constraint {c}" for c in constraints]
    lines += [f"{BOUNDS_PREFIX}constraints file {f}" for f in constraint_files]
    lines += [f"{BOUNDS_PREFIX}versions of {f}" for f in versions_from]
    return lines


@dataclass(frozen=True)
class LockHeader:
    platform: str | None
    python: str | None
    options: tuple[str, ...]
    bounds: tuple[str, ...]

    @property
    def partial(self) -> bool:
        """A ``--no-deps`` lock holds only what it lists: not a complete environment."""
        return "--no-deps" in self.options


def parse_header(text: str) -> LockHeader:
    platform = python = None
    options: tuple[str, ...] = ()
    bounds = []
    for line in text.splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        if line.startswith(TARGET_PREFIX):
            m = re.match(r"platform (\S+), python ([\d.]+)(?:, options (.*))?$",
                         line[len(TARGET_PREFIX):].strip())
            if m:
                platform, python = m.group(1), m.group(2)
                options = tuple((m.group(3) or "").split())
        elif line.startswith(BOUNDS_PREFIX):
            bounds.append(line[len(BOUNDS_PREFIX):].strip())
    return LockHeader(platform, python, options, tuple(bounds))


def with_header(lock_text: str, lines: list[str]) -> str:
    """LOCK_TEXT with LINES after uv's leading comment block (replacing older such lines)."""
    body = [ln for ln in lock_text.splitlines()
            if not ln.startswith((TARGET_PREFIX, BOUNDS_PREFIX))]
    i = 0
    while i < len(body) and body[i].startswith("#"):
        i += 1
    return "\n".join(body[:i] + lines + body[i:]) + "\n"


@dataclass(frozen=True)
class Lock:
    """A lock's text, parsed once: pins by canonical name, and the header."""

    text: str
    pins: tuple[Pin, ...]
    header: LockHeader
    problem: DataError | None = None  # why it is no installable lock (None: it is)

    @staticmethod
    def of(text: str, source: str = "the lock") -> Lock:
        """The parsed lock, once per text (``problem`` says what makes it uninstallable)."""
        return _parsed(text, source)

    def version(self, *names: str) -> str | None:
        """The pinned version of the first of NAMES the lock holds (None: none)."""
        by_name = {p.name: p.version for p in self.pins}
        for name in names:
            found = by_name.get(str(canonicalize_name(name)))
            if found:
                return found
        return None

    @property
    def release_id(self) -> str:
        """The text's hash: a new lock is a new release folder."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> Lock:
    pins, problem = _scan(text, source)
    return Lock(text, pins, parse_header(text), problem)

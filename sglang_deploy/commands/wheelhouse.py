"""`sglang-deploy wheelhouse LOCK DIR`: fill a local wheelhouse with every wheel of a lock.

For air-gapped sites, or an index that no longer serves an old version: hosts whose data
sets ``sglang_wheelhouse`` install the release venv (``uv pip sync --offline --no-index
--find-links``) and uv itself from that folder, without reaching any index.

Each pinned package gets the one wheel that fits the HOSTS (CPython version and glibc
platform, default Debian 12 x86_64) and whose sha256 is one of the lock's hashes, so the
host's ``--require-hashes`` install accepts it. uv's own wheel (for the tool venv) is added
too, checked against the index's sha256. The pure parts (lock parsing, wheel choice) are
``parse_lock`` and ``choose_wheel``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from sglang_deploy.core.errors import SglangDeployError

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_PYTHON = "3.11"  # Debian 12's python3
DEFAULT_GLIBC = (2, 36)  # Debian 12
DEFAULT_ARCH = "x86_64"


class WheelhouseError(SglangDeployError):
    pass


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]


def parse_lock(text: str) -> list[Pin]:
    """Pins of a ``uv pip compile --generate-hashes`` lock (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    pins = []
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            raise WheelhouseError(what="every requirement of the lock pinned with ==",
                                  found=f"`{line[:120]}`", fix="regenerate it: sglang-deploy lock")
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        if not hashes:
            raise WheelhouseError(what="hashes for every pin", found=f"{m.group(1)} has none",
                                  fix="regenerate the lock with `sglang-deploy lock`")
        pins.append(Pin(str(canonicalize_name(m.group(1))), m.group(2), hashes))
    return pins


def target_tags(python: str = DEFAULT_PYTHON, glibc: tuple[int, int] = DEFAULT_GLIBC,
                arch: str = DEFAULT_ARCH) -> list[Tag]:
    """Wheel tags a CPython PYTHON on glibc GLIBC/ARCH accepts, most specific first."""
    major, minor = (int(x) for x in python.split(".")[:2])
    platforms = [f"manylinux_{glibc[0]}_{m}_{arch}" for m in range(glibc[1], 16, -1)]
    platforms += ["manylinux2014_" + arch, "manylinux2010_" + arch, "manylinux1_" + arch,
                  f"linux_{arch}"]
    return [*cpython_tags((major, minor), platforms=platforms),
            *compatible_tags((major, minor), platforms=platforms)]


def choose_wheel(files: list[dict], pin: Pin | None, tags: list[Tag], version: str | None = None):
    """The index file entry to download for PIN (or NAME==VERSION when PIN is None)."""
    rank = {t: i for i, t in enumerate(tags)}
    best = None
    for f in files:
        fn = f.get("filename", "")
        if not fn.endswith(".whl") or f.get("yanked"):
            continue
        try:
            _name, ver, _build, wtags = parse_wheel_filename(fn)
        except ValueError:
            continue
        if ver != Version(pin.version if pin else version):
            continue
        if pin is not None and f.get("hashes", {}).get("sha256") not in pin.hashes:
            continue
        score = min((rank[t] for t in wtags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, f)
    return best[1] if best else None


def _index_files(index: str, name: str) -> list[dict]:
    req = urllib.request.Request(f"{index.rstrip('/')}/{canonicalize_name(name)}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["files"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _download(entry: dict, dest: Path) -> bool:
    """Download ENTRY into DEST unless a file with the right hash is there. True if fetched."""
    target = dest / entry["filename"]
    digest = entry["hashes"]["sha256"]
    if target.exists() and _sha256(target) == digest:
        return False
    tmp = dest / f".{entry['filename']}.part"
    h = hashlib.sha256()
    with urllib.request.urlopen(entry["url"], timeout=600) as resp, open(tmp, "wb") as out:
        while chunk := resp.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != digest:
        tmp.unlink()
        raise WheelhouseError(what=f"{entry['filename']} with sha256 {digest}",
                              found=f"sha256 {h.hexdigest()}", fix="retry; check the index or proxy")
    tmp.rename(target)
    return True


def fill(lock: Path, dest: Path, *, index: str = DEFAULT_INDEX, python: str = DEFAULT_PYTHON,
         glibc: tuple[int, int] = DEFAULT_GLIBC, arch: str = DEFAULT_ARCH,
         uv_version: str | None = None, log=lambda msg: None) -> dict:
    """Put every wheel of LOCK (and uv) into DEST. Returns {"fetched": [...], "present": [...]}."""
    dest.mkdir(parents=True, exist_ok=True)
    tags = target_tags(python, glibc, arch)
    result: dict = {"fetched": [], "present": []}
    missing = []
    wanted: list[tuple[str, Pin | None, str | None]] = [(p.name, p, None) for p in parse_lock(lock.read_text())]
    if uv_version:
        wanted.append(("uv", None, uv_version))
    for name, pin, version in wanted:
        entry = choose_wheel(_index_files(index, name), pin, tags, version)
        if entry is None:
            missing.append(f"{name}=={pin.version if pin else version}")
            continue
        fetched = _download(entry, dest)
        result["fetched" if fetched else "present"].append(entry["filename"])
        log(("fetched " if fetched else "present ") + entry["filename"])
    if missing:
        raise WheelhouseError(
            what=f"a wheel for CPython {python} on manylinux glibc {glibc[0]}.{glibc[1]} {arch} "
                 "whose hash is in the lock, for every pin",
            found="none for " + ", ".join(missing),
            fix="pin versions that publish such wheels, or build them and add them by hand "
                "(an offline host cannot build sdists)")
    return result


def add_parser(sub) -> None:
    p = sub.add_parser("wheelhouse", help="fill a local wheelhouse with every wheel of a lock (offline installs)")
    p.add_argument("lock", type=Path, help="locks/NAME.txt")
    p.add_argument("dest", type=Path, help="wheelhouse folder to fill")
    p.add_argument("--index-url", default=DEFAULT_INDEX, help="simple index (JSON API)")
    p.add_argument("--python-version", default=DEFAULT_PYTHON, help="the hosts' CPython (X.Y)")
    p.add_argument("--glibc", default="%d.%d" % DEFAULT_GLIBC, help="the hosts' glibc (X.Y)")
    p.add_argument("--arch", default=DEFAULT_ARCH)
    p.add_argument("--uv-version", default="0.13.9", help="uv wheel for the tool venv ('' = none)")


def run(args) -> int:
    glibc = tuple(int(x) for x in args.glibc.split("."))
    try:
        result = fill(args.lock, args.dest, index=args.index_url, python=args.python_version,
                      glibc=glibc, arch=args.arch, uv_version=args.uv_version or None,
                      log=lambda m: print(m, file=sys.stderr))
    except SglangDeployError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"{args.dest}: {len(result['fetched'])} fetched, {len(result['present'])} already present")
    return 0

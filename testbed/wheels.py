"""Fetch real wheels from PyPI (simple JSON API), verified by sha256, cached locally.

Used by the testbed (its wheelhouse) and by tests that need the real files of a
given sglang version. Nothing fetched here is ever committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.request
import zipfile
from pathlib import Path

INDEX = os.environ.get("SGLANG_DEPLOY_SIMPLE_INDEX", "https://pypi.org/simple")
CACHE = Path(os.environ.get("SGLANG_DEPLOY_WHEEL_CACHE", "~/.cache/sglang-deploy/wheels")).expanduser()
PYTHON_TAG, PLATFORM = "cp311", "x86_64"  # the testbed's release venv


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_ok(filename: str) -> bool:
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    pys = py.split(".")
    # abi3 wheels: cp39-abi3 etc. are fine for any later CPython
    py_ok = (PYTHON_TAG in pys or "py3" in pys
             or (abi == "abi3" and any(p.startswith("cp3") for p in pys)))
    return py_ok and (plat == "any" or PLATFORM in plat)


def fetch_wheel(name: str, version: str) -> Path:
    """Return the path of the wheel of NAME==VERSION, downloading it once into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    req = urllib.request.Request(
        f"{INDEX}/{_normalise(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    prefix = f"{name.replace('-', '_')}-{version}-"
    candidates = [
        f for f in files
        if f["filename"].lower().startswith(prefix.lower()) and f["filename"].endswith(".whl")
        and not f.get("yanked") and _wheel_ok(f["filename"])
    ]
    if not candidates:
        raise LookupError(f"no wheel of {name}=={version} for {PYTHON_TAG}/{PLATFORM} on {INDEX}")
    # Prefer the most specific (platform) wheel, then the pure one.
    chosen = min(candidates, key=lambda f: f["filename"].endswith("-any.whl"))
    target = CACHE / chosen["filename"]
    digest = chosen["hashes"]["sha256"]
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    tmp = target.with_suffix(".part")
    with urllib.request.urlopen(chosen["url"], timeout=300) as resp, open(tmp, "wb") as out:
        h = hashlib.sha256()
        while chunk := resp.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != digest:
        tmp.unlink()
        raise ValueError(f"sha256 mismatch for {chosen['filename']}")
    tmp.rename(target)
    return target


def fetch_sglang(version: str) -> Path:
    return fetch_wheel("sglang", version)


def extract_member(wheel: Path, member: str) -> str:
    """Read one file (e.g. 'sglang/srt/server_args.py') from a wheel as text."""
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member).decode("utf-8")


def unpack(wheel: Path, dest: Path) -> Path:
    """Unpack a wheel into DEST (a fake site-packages); returns DEST."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest

"""Progress of long steps on the host (pure): the lines ``remote/progress_watch.py`` and
``remote/model_fetch.py`` print, rate and ETA from two samples, the text shown.

A sample is a dict with ``kind`` (``venv``, ``model`` or ``warm``) and ``elapsed_s``; a venv
sample has ``packages``/``packages_total``/``venv_bytes``/``cache_bytes``, a model sample (the
download) and a warm sample (the shards read into the page cache, ``remote/model_warm.py``)
``done_bytes``/``total_bytes``/``files_done``/``files_total``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sglang_deploy.core import lockfile

MARK = "@@progress "


def parse(line: str) -> dict[str, Any] | None:
    """The sample of one output line, or None when the line is not a progress line."""
    if not line.startswith(MARK):
        return None
    try:
        value = json.loads(line[len(MARK):])
    except ValueError:
        return None
    return value if isinstance(value, dict) and "elapsed_s" in value else None


def lock_packages(lock_text: str) -> int:
    """Packages a lock pins (its one parsed form, ``lockfile.Lock``)."""
    return len(lockfile.Lock.of(lock_text).pins)


def size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"


def duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = round(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def rate_eta(sample: Mapping[str, Any], previous: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(bytes/s between PREVIOUS and SAMPLE, seconds left at that rate) of a model sample;
    without a previous sample the average since the start. None when nothing moved."""
    done, total = sample.get("done_bytes"), sample.get("total_bytes")
    if done is None:
        return None, None
    if previous is not None and previous.get("done_bytes") is not None:
        dt = float(sample["elapsed_s"]) - float(previous["elapsed_s"])
        moved = done - previous["done_bytes"]
    else:
        dt, moved = float(sample["elapsed_s"]), done - (sample.get("start_bytes") or 0)
    if dt <= 0 or moved <= 0:
        return None, None
    rate = moved / dt
    return rate, (max(total - done, 0) / rate if total else None)


def fraction(sample: Mapping[str, Any]) -> float | None:
    """How far the step is (0..1) when a total is known."""
    if sample.get("kind") in ("model", "warm") and sample.get("total_bytes"):
        done: float = sample["done_bytes"] / sample["total_bytes"]
        return min(done, 1.0)
    if sample.get("packages_total"):
        packages: float = (sample.get("packages") or 0) / sample["packages_total"]
        return min(packages, 1.0)
    return None


def describe(sample: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> str:
    """One plain line: what is done, how fast, how long it has run (and is left to run)."""
    elapsed = duration(sample.get("elapsed_s"))
    if sample.get("kind") in ("model", "warm"):
        rate, eta = rate_eta(sample, previous)
        total = sample.get("total_bytes")
        pct = f" ({100 * sample['done_bytes'] / total:.1f}%)" if total else ""
        files = (f", {sample.get('files_done')}/{sample.get('files_total')} files"
                 if sample.get("files_total") else "")
        what = "model download" if sample["kind"] == "model" else \
            "model into the page cache"
        return (f"{what}: {size(sample.get('done_bytes'))} of {size(total)}{pct}, "
                f"{size(rate) + '/s' if rate else 'no data moved'}"
                f"{', ETA ' + duration(eta) if eta is not None else ''}{files}, {elapsed}")
    total = sample.get("packages_total")
    return (f"release venv: {sample.get('packages', 0)}{'/' + str(total) if total else ''} packages "
            f"installed, {size(sample.get('venv_bytes'))} in the venv, "
            f"{size(sample.get('cache_bytes'))} unpacked into the uv cache, {elapsed}")

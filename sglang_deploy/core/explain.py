"""Offline analysis of an SGLang server log (pure): what happened, where, why, and the fix.

``explain(lines)`` reads any text a server printed (a journal export, a ``server.log``, an
excerpt pasted from an issue) with the same tracker the live verifier uses
(logparse.StartupTracker, order checks off: a text may start in the middle of a startup)
and returns::

    {"outcome": "ready" | "failed" | "incomplete", "phase": <a verifier phase, "serving"
     after ready, or None>, "cause": <cause id or None>, "summary": <one line>, "fix": ...,
     "phases": [{"name", "at", "duration_s"}], "relevant_lines": [...], "ranks": [...]}

``incomplete``: the text ends with no verdict (an excerpt, or a server still starting or
hung). ``render_text`` prints it for a person.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sglang_deploy.core.logmarkers import PHASES
from sglang_deploy.core.logparse import StartupTracker
from sglang_deploy.core.logprefix import strip_prefix, timeline

__all__ = ["DEFAULT_VERSION", "explain", "render_text"]

#: the wording era assumed when the caller does not say (the patterns accept all eras)
DEFAULT_VERSION = "0.5.12.post1"
_CUT_MARKS = ("[... cut ...]", "[...]", "...")


def explain(lines: Iterable[str], version: str | None = None, *,
            year: int | None = None) -> dict[str, Any]:
    """Analyse a whole log; see the module docstring for the result. ``year``: the year of
    dates printed without one when the log has no full date (``logprefix.timeline``)."""
    tracker = StartupTracker(version or DEFAULT_VERSION, expect_autotune=False,
                             cuda_graph=True, strict_order=False)
    text = [raw.rstrip("\n") for raw in lines]
    text = [x for x in text if x.strip() and x.strip() not in _CUT_MARKS]
    stamps = timeline((strip_prefix(x.rsplit("\r", 1)[-1])[0] for x in text), year)
    # lines before the first timestamp count as printed at it
    last_ts = next((t for t in stamps if t is not None), None)
    stamped = last_ts is not None
    for line, ts in zip(text, stamps, strict=True):
        if ts is not None:
            last_ts = ts
        tracker.feed(line, last_ts if last_ts is not None else 0.0)
    d = tracker.diagnosis(offline=True)
    if d["failed"]:
        outcome, phase = "failed", d["phase"]
    elif tracker.ready_seen:
        outcome, phase = "ready", "ready"
    else:
        outcome, phase = "incomplete", tracker.phase_reached
        # a line that proves a later phase (a warmup request's answer, the KV cache
        # profile) counts as reached, even when its own marker was cut off
        proven = [hit.sig.phase for hit in tracker.hits if hit.sig.phase]
        phase = max(filter(None, [phase, *proven]), key=PHASES.index, default=None)
    return {
        "outcome": outcome,
        "phase": phase,
        "cause": d["cause"],
        "summary": d["summary"],
        "fix": d["fix"],
        "phases": _phases(tracker, stamped, None if outcome == "ready" else last_ts),
        "relevant_lines": _relevant(tracker, d, outcome),
        "ranks": sorted(tracker.ranks, key=_natural),
        "version": version,
    }


def _natural(rank: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", rank)]


def _phases(tracker: StartupTracker, stamped: bool, last_ts: float | None) -> list[dict]:
    entered = tracker.phase_entered
    text = tracker.phase_entered_text
    seen = [p for p in PHASES if p in entered and p != "starting"]
    out = []
    for i, p in enumerate(seen):
        end = entered[seen[i + 1]] if i + 1 < len(seen) else last_ts
        # never negative: a line stamped earlier than the one before (ranks or nodes whose
        # clocks differ, a second-precision stamp after a finer one) adds no time
        duration = max(0.0, round(end - entered[p], 3)) if stamped and end is not None else None
        out.append({"name": p, "at": text.get(p), "duration_s": duration})
    return out


def _relevant(tracker: StartupTracker, d: dict, outcome: str, limit: int = 14) -> list[str]:
    if outcome != "failed":
        return tracker.recent_lines(5)
    out: list[str] = list(d["evidence"])
    blocks = tracker.tracebacks()
    if blocks:
        block = blocks[0]
        # the error printed before its traceback (the header), the traceback's last lines
        picked = block if len(block) <= 5 else [block[0], "  ...", *block[-4:]]
        out += [x for x in picked if x not in out]
    for line in tracker.fatal:
        if len(out) >= limit:
            break
        key = strip_prefix(line)[2]
        if all(strip_prefix(x)[2] != key for x in out):
            out.append(line)
    return out[:limit]


def render_text(result: dict[str, Any]) -> str:
    """The analysis for a person: phases with times, outcome, phase, cause, fix, proof."""
    lines = []
    if result["phases"]:
        lines.append("phases seen:")
        for p in result["phases"]:
            dur = f"{p['duration_s']:.1f} s" if p.get("duration_s") is not None else ""
            lines.append(f"  {p['name']:<10} {p.get('at') or '':<24} {dur}".rstrip())
    else:
        lines.append("phases seen: none (no startup marker in the text)")
    lines.append(f"outcome:     {result['outcome']}")
    lines.append(f"phase:       {result['phase'] or 'unknown'}")
    if result["outcome"] == "failed":
        lines.append(f"cause:       {result['cause']}: {result['summary']}")
        lines.append(f"fix:         {result['fix']}")
    elif result["outcome"] == "incomplete":
        lines.append("cause:       none: the text ends without a verdict (an excerpt, a "
                     "server still starting, or a hang in the phase above)")
    ranks = result.get("ranks") or []
    if ranks:
        lines.append(f"ranks:       {len(ranks)} ({', '.join(ranks[:8])}"
                     f"{', ...' if len(ranks) > 8 else ''})")
    if result["relevant_lines"]:
        lines.append("lines:" if result["outcome"] != "failed" else "proof:")
        lines += [f"  {x[:300]}" for x in result["relevant_lines"]]
    return "\n".join(lines) + "\n"

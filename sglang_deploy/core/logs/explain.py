"""Offline analysis of an SGLang server log (pure): what happened, where, why, and the fix.

``explain(lines)`` reads any text a server printed (a journal export, a ``server.log``, an
excerpt pasted from an issue) with the same tracker the live verifier uses
(logparse.StartupTracker, order checks off: a text may start in the middle of a startup)
and returns::

    {"outcome": "ready" | "failed" | "incomplete", "phase": <a verifier phase, "serving"
     after ready, or None>, "cause": <cause id or None>, "summary": <one line>, "fix": ...,
     "phases": [{"name", "at", "duration_s"}], "relevant_lines": [...], "ranks": [...],
     "parallel": {"tp_size", "dp_size", "pp_size", "nnodes"} of the log's server args, or
     None, "worker": {"node_rank", "nnodes", "group", "rank0_addr", "health_at"} or None}

A group's node of rank >= 1 (``worker``) never prints the ready line: it is ``ready`` once
its dummy health server started (SGLang starts it when the node's schedulers are ready).

``incomplete``: the text ends with no verdict (an excerpt, or a server still starting or
hung). ``render_text`` prints it for a person; ``log_text`` turns the bytes of a file into
the text to analyse, refusing what is no text log (empty, binary, compressed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.logs.lastexc import describe, ending_exception
from sglang_deploy.core.logs.markers import PHASES
from sglang_deploy.core.logs.parse import StartupTracker
from sglang_deploy.core.logs.prefix import strip_prefix, timeline

__all__ = ["DEFAULT_VERSION", "LogInputError", "explain", "log_text", "render_text"]

#: the wording era assumed when the caller does not say (the patterns accept all eras)
DEFAULT_VERSION = "0.5.12.post1"
_CUT_MARKS = ("[... cut ...]", "[...]", "...")


class LogInputError(UsageError):
    """Input that is no log to explain (missing, empty, binary): an input error, exit 2."""

    title = "cannot explain this input"


# the first bytes of files that are no text log, and how to get the text out of them
_MAGIC = ((b"\x1f\x8b", "a gzip-compressed file", "zcat {src} | sglang-deploy explain-log -"),
          (b"\x28\xb5\x2f\xfd", "a zstd-compressed file",
           "zstdcat {src} | sglang-deploy explain-log -"),
          (b"\xfd7zXZ\x00", "an xz-compressed file", "xzcat {src} | sglang-deploy explain-log -"),
          (b"PK\x03\x04", "a zip archive", "unzip -p {src} | sglang-deploy explain-log -"),
          (b"LPKSHHRH", "a systemd journal file",
           "journalctl --file {src} -u sglang | sglang-deploy explain-log -"))
# NUL, other C0 controls and undecodable bytes (tab, \n, \r of tqdm, \b, \v, \f, ESC are text)
_NOT_TEXT = dict.fromkeys([*range(8), 0x0e, *range(0x0f, 0x1b), *range(0x1c, 0x20), 0xfffd])
_JOURNAL_NOTE_RE = re.compile(r"^-- .* --$")   # journalctl's `-- No entries --`, `-- Boot x --`
_GET_TEXT = ("pass the log as text: `journalctl -u sglang > sglang.log` (or pipe it: "
             "`journalctl -u sglang | sglang-deploy explain-log -`), or the server's own log file")


def log_text(data: bytes, source: str = "standard input") -> str:
    """The text of a log read as bytes (UTF-8, or UTF-16 with its byte-order mark, as
    PowerShell writes a redirect), NUL bytes dropped. Raises LogInputError for input that is
    no text log: empty (or journalctl's `-- No entries --` alone), compressed or a journal
    file (the fix says how to read it), or binary (NUL, control or undecodable bytes in
    more than 1 in 10 characters). A run of NUL bytes at the end (a file cut short by a
    crash) is no text and no sign of binary either."""
    src = "-" if source == "standard input" else source
    for magic, what, fix in _MAGIC:
        if data.startswith(magic):
            raise LogInputError(what="a text log", found=f"{source} is {what}",
                                fix="read it as text: " + fix.format(src=src))
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16", "replace")
    else:
        text = data.rstrip(b"\x00").decode("utf-8-sig", "replace")
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines or all(_JOURNAL_NOTE_RE.match(x.strip()) for x in lines):
        found = f"{source} is empty" if not lines else \
            f"{source} has no log line, only journalctl's {lines[0].strip()!r}"
        raise LogInputError(what="a log to explain", found=found, fix=_GET_TEXT)
    bad = len(text) - len(text.translate(_NOT_TEXT))
    if bad * 10 > len(text):
        raise LogInputError(what="a text log", found=f"{source} is binary data ({bad} of its "
                            f"{len(text)} characters are NUL, control or undecodable bytes)",
                            fix=_GET_TEXT)
    return text.replace("\x00", "")


def explain(lines: Iterable[str], version: str | None = None, *,
            year: int | None = None, group: str | None = None) -> dict[str, Any]:
    """Analyse a whole log; see the module docstring for the result. ``year``: the year of
    dates printed without one when the log has no full date (``logprefix.timeline``).
    ``group``: the ``sglang_group`` of the host whose log it is (named in a worker's
    explanation)."""
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
    worker = _worker(text, group)
    if d["failed"]:
        outcome, phase = "failed", d["phase"]
    elif tracker.ready_seen:
        outcome, phase = "ready", "ready"
    elif worker is not None:
        # a node of rank >= 1 never prints the ready line (rank 0 serves the API): its
        # schedulers are ready when it starts its dummy health server
        outcome, phase = "ready", "ready"
        d = {**d, "summary": worker_summary(worker)}
    else:
        outcome, phase = "incomplete", tracker.phase_reached
        # a line that proves a later phase (a warmup request's answer, the KV cache
        # profile) counts as reached, even when its own marker was cut off
        proven = [hit.sig.phase for hit in tracker.hits if hit.sig.phase]
        phase = max(filter(None, [phase, *proven]), key=PHASES.index, default=None)
    summary, error = d["summary"], d.get("error")
    if outcome == "failed":
        summary, error = _ended_by(text, d)
    return {
        "outcome": outcome,
        "phase": phase,
        "cause": d["cause"],
        "summary": summary,
        "fix": d["fix"],
        "phases": _phases(tracker, stamped, None if outcome == "ready" else last_ts),
        "relevant_lines": _relevant(tracker, d, outcome),
        "ranks": sorted(tracker.ranks, key=_natural),
        "parallel": _parallel(text),
        "version": version,
        # the exception that ended the log (type, message, where, code, rank, line, root)
        "error": error,
        "worker": worker if outcome == "ready" else None,
    }


def _ended_by(text: list[str], d: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The summary of a failure with the exception that ended its log added (unless the
    summary names it already: an uncatalogued exception is the cause itself), and that
    exception (lastexc.ending_exception) for ``error``; without one, the diagnosis's own."""
    exc = ending_exception(text)
    summary, first = d["summary"] or "", d.get("error")
    if exc is None:
        return summary, first
    same = first is not None and (first["type"], first["message"][:200], first["where"]) == (
        exc["type"], exc["message"], exc["where"])
    exc = {**exc, "summary": describe(exc)}
    said = bool(exc["message"]) and exc["message"][:60] in summary
    # nothing to add: the summary quotes its message and the log shows no frame or root
    if not same and not (said and exc["where"] is None and exc["root"] is None):
        known = f"{d['cause']}: {summary}"
        summary += f"; ended by {describe(exc, known)}"
    return summary, exc


_DUMMY_HEALTH_RE = re.compile(r"Dummy health check server started in background thread at (\S+)")
_NODE_ARG_RE = re.compile(r"(?:^|, ?)(node_rank|nnodes|dist_init_addr)=('[^']*'|\d+|None)")


def _worker(text: list[str], group: str | None) -> dict[str, Any] | None:
    """A node of rank >= 1 whose dummy health server started (engine.py: such a node serves
    only that, once its schedulers are ready): its rank, group and the health address."""
    addr = next((m.group(1) for x in reversed(text) if (m := _DUMMY_HEALTH_RE.search(x))), None)
    if addr is None:
        return None
    line = next((x for x in reversed(text) if _SERVER_ARGS in x), "")
    args = {k: v.strip("'") for k, v in _NODE_ARG_RE.findall(line.split(_SERVER_ARGS, 1)[-1])}
    rank = int(args["node_rank"]) if args.get("node_rank", "").isdigit() else None
    if rank == 0:
        return None
    nnodes = int(args["nnodes"]) if args.get("nnodes", "").isdigit() else None
    rank0 = args.get("dist_init_addr") if args.get("dist_init_addr") != "None" else None
    return {"node_rank": rank, "nnodes": nnodes, "group": group, "rank0_addr": rank0,
            "health_at": addr}


def worker_summary(w: dict[str, Any]) -> str:
    """``worker of rank 1 of group tbg1 (2 nodes, rank 0 at ADDR)``: what the node is, and
    why it is ready without a ready line."""
    of = f"group {w['group']}" if w.get("group") else "its group"
    about = ", ".join(filter(None, [f"{w['nnodes']} nodes" if w.get("nnodes") else None,
                                    f"rank 0 at {w['rank0_addr']}" if w.get("rank0_addr") else None]))
    rank = w["node_rank"] if w.get("node_rank") is not None else ">= 1"
    return (f"worker of rank {rank} of {of}{f' ({about})' if about else ''}: its schedulers "
            f"are ready and its dummy health server started at {w['health_at']}; rank 0 "
            "serves the API")


_SERVER_ARGS = "server_args=ServerArgs("
_SIZE_RE = re.compile(r"(?:^|, ?)(tp_size|dp_size|pp_size|nnodes)=(\d+)\b")


def _parallel(text: list[str]) -> dict[str, int] | None:
    """The parallel sizes the server was started with, from the log's own (last)
    ``server_args=ServerArgs(... tp_size=8, dp_size=1, ...)`` line; None without one."""
    line = next((x for x in reversed(text) if _SERVER_ARGS in x), None)
    if line is None:
        return None
    return {k: int(v) for k, v in _SIZE_RE.findall(line.split(_SERVER_ARGS, 1)[1])}


def _natural(rank: str) -> list[int | str]:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", rank)]


def _phases(tracker: StartupTracker, stamped: bool, last_ts: float | None
            ) -> list[dict[str, Any]]:
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


def _joined(lines: list[str]) -> list[str]:
    """LINES with a wrapper's prefix alone (journald's `DATE HOST python3[PID]: `, split
    from the server's own prefix that followed it) put back before the line it introduces."""
    out: list[str] = []
    for line in lines:
        if out and not strip_prefix(out[-1])[2].strip():
            out[-1] += line
        else:
            out.append(line)
    return out


def _relevant(tracker: StartupTracker, d: dict[str, Any], outcome: str,
              limit: int = 14) -> list[str]:
    if outcome != "failed":
        return _joined(tracker.recent_lines(12))[-5:]
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
    if result.get("worker"):
        lines.append(f"role:        {result['summary']}")
    if result["outcome"] == "failed":
        lines.append(f"cause:       {result['cause']}: {result['summary']}")
        lines.append(f"fix:         {result['fix']}")
    elif result["outcome"] == "incomplete":
        lines.append("cause:       none: the text ends without a verdict (an excerpt, a "
                     "server still starting, or a hang in the phase above)")
    ranks = result.get("ranks") or []
    sizes = result.get("parallel") or {}
    # the sizes the server args set: tp always, the others where more than 1
    size = ", ".join(f"{k}={v}" for k, v in sizes.items() if k == "tp_size" or v > 1)
    if ranks or size:
        seen = f"{len(ranks)} seen" if ranks else "none seen"
        listed = f" ({', '.join(ranks[:8])}{', ...' if len(ranks) > 8 else ''})" if ranks else ""
        lines.append(f"ranks:       {seen}{f' of {size}' if size else ''}{listed}")
    if result["relevant_lines"]:
        lines.append("lines:" if result["outcome"] != "failed" else "proof:")
        lines += [f"  {x[:300]}" for x in result["relevant_lines"]]
    return "\n".join(lines) + "\n"

"""Line prefixes of SGLang server logs, as they reach us (pure, cheap per line).

A line of an SGLang log can carry several prefixes, outermost first:

* a journal export: ``Mar 01 12:00:00 host python[123]: `` (``journalctl`` short) or
  ``2026-03-01T12:00:00+0000 host python[123]: `` (short-iso);
* docker compose: ``sglang-1  | `` (or a ``container_name``: ``my-sglang  | ``);
* Kubernetes (containerd/CRI): ``2025-07-25T05:09:16.157949381+08:00 stdout F ``;
* a log collector: ``ERROR 2026-03-01T12:00:00.123Z `` (cloud logging), a CI runner's
  ``2025-10-09T04:13:06.6371779Z ``, Kibana's ``May 16, 2026 @ 20:46:57.892    ``;
* Ray: ``(SGLangEngine pid=23901) `` (and its `` [repeated 2x across cluster]`` suffix);
* torchrun: ``[rank0]:``;
* Python logging wrappers: ``2025-03-07 23:50:27,532 - name - INFO - ``, vLLM-era
  ``INFO 11-26 14:23:34 weight_utils.py:243] ``;
* SGLang's own (configure_logger): ``[2026-03-01 12:00:00 TP0] ``, ``[2026-03-01
  12:00:00.123 DP0 TP0 EP0] ``, ``[2026-03-01 12:00:00] ``, ``[23:17:01 TP7] `` (0.3),
  ``[12-16 14:27:08] `` (diffusion), ``[gpu_id=0] `` (0.1/0.2), ``[TP0] `` (a rank
  without its timestamp, as logs are often pasted).

``strip_prefix`` peels them all and returns the timestamp, the rank and the message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, datetime, timedelta

__all__ = ["PROGRESS_RE", "parse_progress", "parse_ts", "redact", "split_updates", "strip_prefix",
           "timeline"]

_TS = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?"
_RANKS = r"(?: [A-Z][A-Z_]*\d+)*"
# SGLang's own prefix: full date, or time only (0.3), or month-day (diffusion)
_SGL_RE = re.compile(
    r"^\[(?P<ts>" + _TS + r"|\d{2}-\d{2} \d{2}:\d{2}:\d{2}|\d{2}:\d{2}:\d{2})"
    r"(?P<rank>" + _RANKS + r")\] ?(?P<msg>.*)$", re.DOTALL)
_GPU_ID_RE = re.compile(r"^\[(?P<rank>gpu_id=\d+|[A-Z][A-Z_]*\d+(?: [A-Z][A-Z_]*\d+)*)\] "
                        r"?(?P<msg>.*)$", re.DOTALL)
# outer wrappers, each optional; several may stack (peeled in a loop)
_WRAPPER_RE = re.compile(
    r"^(?:"
    # journalctl short / short-iso / short-precise
    r"(?P<syslog>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?) \S+ [\w.@/-]+(?:\[\d+\])?: "
    r"|(?P<jiso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})) \S+ "
    r"[\w.@/-]+\[\d+\]: "
    # collectors: "ERROR 2026-03-01T12:00:00.123Z ", CI "2025-10-09T04:13:06.63Z "
    r"|(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+)?"
    r"(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+"
    r"(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?:[a-z_]\w*\.\w+: )?)?"
    r"|(?P<kibana>[A-Z][a-z]{2} \d{1,2}, \d{4} @ \d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+"
    # docker compose: "service-1  | ", or the container_name padded to the longest one
    r"|[A-Za-z0-9][\w.-]*\s+\| ?"
    # containerd/CRI (Kubernetes pod logs): after the timestamp, the stream and a full or
    # partial flag: "2025-07-25T05:09:16.157949381+08:00 stdout F "
    r"|(?:stdout|stderr) [FP] "
    # Ray actor prefix
    r"|\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\) "
    # torchrun
    r"|\[(?P<trank>rank\d+)\]: ?"
    # python logging wrappers
    r"|(?P<pylog>" + _TS + r") - (?:[\w.\-]+ - )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"|(?:DEBUG|INFO|WARNING|ERROR) (?P<vllm>\d{2}-\d{2} \d{2}:\d{2}:\d{2}) [\w.]+:\d+\] "
    r")")
_WRAPPER_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789([")
_RAY_REPEAT_RE = re.compile(r" \[repeated \d+x across cluster\]$")
_EMBEDDED_PREFIX_RE = re.compile(
    r"(?=\[" + _TS + _RANKS + r"\] )|(?=\[gpu_id=\d+\] )"
    r"|(?<=\])(?=" + _TS + r" - )")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_prefix(line: str) -> tuple[str | None, str | None, str]:
    """``[2026-03-01 12:00:00 DP0 TP0] msg`` -> ``("2026-03-01 12:00:00", "DP0 TP0", "msg")``;
    wrappers (journal, collector, Ray, torchrun, logging) are peeled first; a line without
    any prefix -> ``(None, None, line)``."""
    ts = rank = None
    msg = line
    if msg[:1] != "[" or msg[1:2] == "r":
        for _ in range(4):
            if not msg or msg[0] not in _WRAPPER_START:
                break
            m = _WRAPPER_RE.match(msg)
            if m is None or m.end() == 0:
                break
            ts = ts or m.group("syslog") or m.group("jiso") or m.group("iso") or \
                m.group("kibana") or m.group("pylog") or m.group("vllm")
            rank = rank or m.group("trank")
            msg = msg[m.end():]
        if msg.endswith("cluster]"):
            msg = _RAY_REPEAT_RE.sub("", msg)
    if msg[:1] == "[":
        m = _SGL_RE.match(msg)
        if m is not None:
            return m.group("ts"), (m.group("rank").strip() or rank), m.group("msg")
        m = _GPU_ID_RE.match(msg)
        if m is not None:
            return ts, m.group("rank"), m.group("msg")
    return ts, rank, msg


def split_updates(line: str) -> list[str]:
    """Split one journal line into the pieces written separately: tqdm's ``\\r`` updates
    (0.5.10+ end them with ``\\r`` only, so journald joins them) and log lines of other
    processes glued onto an unterminated tqdm line. Empty pieces are dropped."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    out: list[str] = []
    for seg in line.split("\r"):
        pieces = _EMBEDDED_PREFIX_RE.split(seg) if "[" in seg[1:] or " - " in seg else [seg]
        out += [piece.rstrip("\n") for piece in pieces if piece.strip()]
    return out


# a timestamp as the prefixes write it: a full date (``2026-03-01 12:00:00``, ISO ``T``,
# Kibana's ``May 16, 2026 @ 20:46:57.892``), a month and day (``12-16 14:27:08``,
# journalctl's ``Dec 04 09:19:48``) or a time of day alone (0.3's ``23:17:01``)
_TS_RE = re.compile(
    r"^(?:(?P<Y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[ T]|(?P<m2>\d{2})-(?P<d2>\d{2}) "
    r"|(?P<b>[A-Z][a-z]{2}) (?P<d3>[ \d]?\d)(?:, (?P<Y3>\d{4}) @)? )?"
    r"(?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})(?:[.,](?P<f>\d+))?(?:Z|[+-]\d{2}:?\d{2})?$")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_EPOCH = datetime(1970, 1, 1)
_LEAP = 2000    # a yearless date is read in a leap year first, so that Feb 29 reads


def _parse(text: str | None) -> tuple[datetime, str] | None:
    """A timestamp as a prefix writes it -> (a naive datetime, what the text lacks: "" if
    nothing, "year" for a month and day, "date" for a time of day alone)."""
    m = _TS_RE.match(text) if text else None
    if m is None:
        return None
    g = m.groupdict()
    if g["Y"] or g["Y3"]:
        year, lacks = int(g["Y"] or g["Y3"]), ""
    elif g["m2"] or g["b"]:
        year, lacks = _LEAP, "year"
    else:
        year, lacks = _LEAP, "date"
    if lacks == "date":
        month, day = 1, 1
    elif g["b"]:
        month, day = _MONTHS.get(g["b"], 0), int(g["d3"])
    else:
        month, day = int(g["m"] or g["m2"]), int(g["d"] or g["d2"])
    try:
        dt = datetime(year, month, day, int(g["H"]), int(g["M"]), int(g["S"]))
    except ValueError:      # month 13, Feb 30, hour 25...
        return None
    if g["f"]:
        dt += timedelta(seconds=float("0." + g["f"]))
    return dt, lacks


def _in_year(dt: datetime, year: int) -> datetime | None:
    try:
        return dt.replace(year=year)
    except ValueError:      # Feb 29 in a common year
        return None


def _nearest(candidates: Iterable[datetime | None], anchor: datetime) -> datetime | None:
    return min(filter(None, candidates), key=lambda c: abs(c - anchor), default=None)


def timeline(texts: Iterable[str | None], year: int | None = None) -> list[float | None]:
    """Seconds on the log's own clock for the timestamps of its lines, in order (None where a
    line has none or it does not read).

    A date without a year (journalctl's ``Dec 04 09:19:48``, ``12-16 14:27:08``) takes the
    year that puts it nearest the line before (Dec 31 -> Jan 01 rolls over), a time of day
    alone (``23:17:01``) the nearest day. The first of them is placed near the log's first
    full date; in a log without any, its first yearless date is in YEAR (e.g. the current
    year; a leap year when None)."""
    parsed = [_parse(t) for t in texts]
    full = next((dt for dt, lacks in filter(None, parsed) if not lacks), None)
    if full is None:    # no full date: the first yearless one, in YEAR
        first = next((dt for dt, lacks in filter(None, parsed) if lacks == "year"), None)
        full = _in_year(first, year or _LEAP) if first is not None else None
    out: list[float | None] = []
    prev: datetime | None = None
    for p in parsed:
        if p is None:
            out.append(None)
            continue
        dt, lacks = p
        anchor = prev or full
        if lacks == "year":
            got = _in_year(dt, year or _LEAP) if anchor is None else \
                _nearest((_in_year(dt, anchor.year + k) for k in (-1, 0, 1)), anchor)
        elif lacks == "date":
            day = anchor.date() if anchor is not None else date(year or _LEAP, 1, 1)
            days = [datetime.combine(day + timedelta(days=k), dt.time()) for k in (-1, 0, 1)]
            got = days[1] if anchor is None else _nearest(days, anchor)
        else:
            got = dt
        if got is None:
            out.append(None)
            continue
        prev = got
        out.append((got - _EPOCH).total_seconds())
    return out


def parse_ts(text: str | None) -> float | None:
    """Seconds on the log's own clock for one timestamp as the prefixes write it (a date
    without a year in a leap year, a time of day alone on a fixed day); None when
    unreadable. For a whole log, ``timeline`` (years and days inferred)."""
    return timeline([text])[0]


# BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]" (+ "\n" <= 0.5.9)
PROGRESS_RE = re.compile(
    r"(?P<desc>Loading [^:\r\n]*?shards|Multi-thread loading shards|Loading safetensors "
    r"using [^:\r\n]*?):\s+(?P<pct>\d{1,3})%[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)")
_SECRET_RE = re.compile(
    r"""((?:admin_)?api_key['"]?\s*[=:]\s*)(['"])(?:(?!\2).)*\2""")
_SECRET_ARG_RE = re.compile(r"(--(?:admin-)?api-key(?:=|\s+))(\S+)")

def redact(text: str) -> str:
    """Hide API keys in a log line (the ``server_args=ServerArgs(... api_key='...')`` line
    that every version logs at INFO, and ``--api-key X`` in a printed command line)."""
    if "api" not in text:
        return text
    text = _SECRET_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}<redacted>{m.group(2)}", text)
    return _SECRET_ARG_RE.sub(lambda m: f"{m.group(1)}<redacted>", text)


def parse_progress(text: str) -> tuple[int, int, int] | None:
    """The LAST tqdm shard update in ``text`` -> ``(done, total, pct)``."""
    matches = list(PROGRESS_RE.finditer(text))
    if not matches:
        return None
    return int(matches[-1]["n"]), int(matches[-1]["total"]), int(matches[-1]["pct"])

"""The exception that ended a log (pure): the last one a failed server printed, as Python
printed it, with where it was raised and the root of its chain, so that explain-log names
it whatever the cause (a catalogued one, the generic scheduler exception, or none).

Reads any text explain-log reads: lines behind any prefix (``strip_prefix``: SGLang's
``[date TP3] ``, torch's ``[rank3]:``, journal exports, collectors; ANSI codes), ranks
interleaved (each rank's traceback is followed on its own), and tails that start inside a
traceback (frames and the exception line with no ``Traceback (most recent call last):``
above them). A chain (``The above exception was the direct cause of the following
exception:``, ``During handling of the above exception, another exception occurred:``) ends
on the last exception raised; its first one is the ``root``. Warnings are no exception, and
SGLang's teardown (the parent's ``Rank 0 scheduler is dead``, ``scheduler died during
initialization``) only reports a child's exception: it is that child's exception that
ended the log, when the text shows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sglang_deploy.core.logs.prefix import redact, strip_prefix

__all__ = ["describe", "ending_exception", "short_path"]

# `torch.OutOfMemoryError: ...`, `KeyError: 'x'`, `Exception: ...`, `AssertionError`,
# `triton.runtime.errors.OutOfResources: ...`; never a warning, nor a tool's bare `Error: `
_EXC_RE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Fault|"
    r"OutOfResources)|Exception))(?::(?P<msg>.*))?$")
_FRAME_RE = re.compile(r'^\s*File "(?P<path>[^"]*)", line (?P<line>\d+),? in (?P<func>\S+)')
_CHAINED = ("The above exception was the direct cause of the following exception",
            "During handling of the above exception, another exception occurred")
_TRACEBACK = "Traceback (most recent call last):"
# the parent's report of a child's death: it names no exception of its own
_TEARDOWN_RE = re.compile(r"scheduler is dead|scheduler died during initialization|"
                          r"Received sigquit from a child proces|Initialization failed\. "
                          r"Please see the error messages above")
_SITE_RE = re.compile(r"^.*?(?:/site-packages/|/dist-packages/|/python/(?=sglang/))")
_STDLIB_RE = re.compile(r"^.*/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
_MESSAGE_MAX = 200
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def short_path(path: str) -> str:
    """A frame's file as a person reads it: from the package down
    (``sglang/srt/x.py``), else the last three parts of a long path."""
    short = _SITE_RE.sub("", path)
    if short == path:
        short = _STDLIB_RE.sub("", path)
    if short == path and path.count("/") > 3:
        short = ".../" + "/".join(path.rsplit("/", 3)[1:])
    return short


class _Stream:
    """One rank's traceback as it is printed: its last frame, the code line under it, and
    whether the next exception continues a chain."""

    def __init__(self) -> None:
        self.where: str | None = None
        self.code: str | None = None
        self.after_frame = False
        self.chained = False
        self.open = False       # inside a traceback: after its header or a frame
        self.root: dict[str, Any] | None = None   # the first exception of the current chain

    def feed(self, text: str, raw: str, rank: str | None) -> dict[str, Any] | None:
        """One line of this rank's (TEXT without its prefixes, RAW as printed): the
        exception it is, or None."""
        after_frame, self.after_frame = self.after_frame, False
        if _TRACEBACK in text:
            self.open = True
            if not self.chained:
                self.root = None
            self.where = self.code = None
            return None
        if any(c in text for c in _CHAINED):
            self.chained = True
            return None
        if (m := _FRAME_RE.match(text)) is not None:
            self.where = f"{redact(short_path(m['path']))}:{m['line']}, in {m['func']}"
            self.code, self.after_frame, self.open = None, True, True
            return None
        m = _EXC_RE.match(text)
        if m is None or m["type"].endswith("Warning"):
            if after_frame and self.where is not None:
                self.code = redact(text)
            return None
        message = redact((m["msg"] or "").strip())
        if _TEARDOWN_RE.search(message):
            return None
        exc = {"type": m["type"], "message": message[:_MESSAGE_MAX], "where": self.where,
               "code": self.code, "rank": rank, "line": redact(raw), "root": None}
        root = self.root if self.chained else None
        if root is not None and (root["type"], root["message"]) != (exc["type"],
                                                                    exc["message"]):
            exc["root"] = {k: root[k] for k in ("type", "message", "where")}
        self.root = root or exc
        self.chained = self.open = False
        self.where = self.code = None
        return exc


def ending_exception(lines: Iterable[str]) -> dict[str, Any] | None:
    """The last exception the text printed (a warning or the teardown's report is none):
    ``type`` (qualified as printed), ``message`` (its first line, bounded), ``where`` it
    was raised (``sglang/srt/x.py:12, in func``, the last frame of its traceback; None
    without one), ``code`` (that frame's source line), ``rank`` (the prefix's, or the
    rank whose traceback it ends), ``line`` (as printed, redacted) and ``root``: the first
    exception of its chain (``type``, ``message``, ``where``) when that is another one.
    None when the text printed no exception."""
    streams: dict[str | None, _Stream] = {}
    last_rank: str | None = None
    found: dict[str, Any] | None = None
    for raw in lines:
        raw = raw.rsplit("\r", 1)[-1]
        if "\x1b" in raw:
            raw = _ANSI_RE.sub("", raw)
        ts, rank, msg = strip_prefix(raw)
        text = msg.strip()
        if not text:
            continue
        # a line with no rank continues the traceback of the rank printed last (SGLang
        # prints one prefix, then the traceback's lines bare; a wrapper may stamp each of
        # them with its own time): unless it is a line of its own, stamped and no
        # traceback's (the parent's `[date] Received sigquit ...`)
        if rank is None and ts is not None and not _continues(text, streams.get(last_rank)):
            last_rank = None
        elif rank is not None:
            last_rank = rank
        key = rank if rank is not None else last_rank
        s = streams.setdefault(key, _Stream())
        exc = s.feed(text, raw.strip(), key)
        if exc is not None:
            found = exc
    return found


def _continues(text: str, stream: _Stream | None) -> bool:
    """Is TEXT a line of a traceback being printed (a frame, its code, a chain's marker,
    the exception)?"""
    if stream is None:
        return False
    if any(c in text for c in _CHAINED) or stream.chained and _TRACEBACK in text:
        return True
    return stream.open and (stream.after_frame or _FRAME_RE.match(text) is not None
                            or _EXC_RE.match(text) is not None)


def describe(exc: dict[str, Any], known: str = "") -> str:
    """``RuntimeError: init failed (raised in sglang/x.py:3, in f) on TP0; root: KeyError:
    'k' (raised in ...)``: the exception for a summary; the parts of it KNOWN already
    says (its message) are not repeated."""
    said = bool(exc["message"]) and exc["message"][:60] in known
    head = exc["type"] if said or not exc["message"] else f"{exc['type']}: {exc['message']}"
    text = head + (f" (raised in {exc['where']})" if exc.get("where") else "") + \
        (f" on {exc['rank']}" if exc.get("rank") else "")
    root = exc.get("root")
    # a root the summary names already (an uncatalogued cause is the root itself)
    if root and not (root["where"] and root["where"] in known and root["type"] in known):
        rsaid = bool(root["message"]) and root["message"][:60] in known
        text += f"; root: {root['type']}" + ("" if rsaid or not root["message"]
                                              else f": {root['message']}") + \
            (f" (raised in {root['where']})" if root.get("where") else "")
    return text

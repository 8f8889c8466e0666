"""SGLang startup log parser (pure, incremental): phases, shard progress, fatal signatures.

Feed it the journal of the service line by line::

    t = StartupTracker("0.5.12.post1", expect_autotune=True, cuda_graph=False)
    for ts, line in journal:
        for ev in t.feed(line, ts):
            ...                       # ev.kind: phase | progress | fatal | warning | violation
    t.phase, t.shard_progress, t.phase_durations, t.fatal, t.ready_seen, t.relevant_lines()

Every marker below was read off the real wheels (sglang 0.5.9, 0.5.10, 0.5.12.post1,
0.5.23; uvicorn for ``Uvicorn running on``; flashinfer-python 0.6.11.post1 for the JIT
errors); ``tests/unit/test_logparse.py`` greps those sources for each ``Marker.source``.

Startup order (scheduler lines are ``[2026-03-01 12:00:00 TP0] ...``, one per rank):
``Load weight begin`` -> tqdm ``Loading safetensors checkpoint shards`` -> ``Load weight
end`` -> ``KV Cache is allocated`` -> FlashInfer autotune (``kernel_warmup``) -> CUDA graph
capture (decode; then piecewise) -> ``Uvicorn running on`` -> warmup (``GET /model_info``,
``POST /generate``) -> ``The server is fired up and ready to roll!``.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sglang_deploy.core.logs.causes import (
    GENERIC,
    Hit,
    Signature,
    call_phase,
    diagnose,
    frame_phase,
    line_phase,
    match_signature,
)
from sglang_deploy.core.logs.excerpt import relevant
from sglang_deploy.core.logs.firsterror import ExcLine
from sglang_deploy.core.logs.markers import MARKER_WORDS, PHASES, Marker, markers_for
from sglang_deploy.core.logs.prefix import (
    PROGRESS_RE,
    parse_progress,
    redact,
    split_updates,
    strip_prefix,
)

__all__ = ["Event", "StartupTracker"]

_IDX = {p: i for i, p in enumerate(PHASES)}

# tqdm bars of the later phases: "Capturing batches (bs=8 avail_mem=1.00 GB):  50%|..| 2/4"
# (cuda_graph_runner) and FlashInfer's "[AutoTuner]: Tuning <op>: 50%|..| 2/4"
_CAPTURE_BAR_RE = re.compile(r"^\s*Capturing batches \(")
_AUTOTUNE_BAR_RE = re.compile(r"^\s*\[AutoTuner\]: Tuning ")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
# the last line of a traceback: "torch.OutOfMemoryError: CUDA out of memory", "KeyError: 'x'"
_EXC_RE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|"
                     r"Warning)\b(?::|$)")
# a traceback frame's place: `File "/opt/venv/.../sglang/srt/x.py", line 12, in func`
_WHERE_RE = re.compile(r'File "([^"]*)", line (\d+),? in (\S+)')
_SHORT_PATH_RE = re.compile(r"^.*?(?:/site-packages/|/dist-packages/|/python/(?=sglang/))")
_RANK_PREFIX_RE = re.compile(r"(?:TP|DP|PP|EP|ATTN_CP|MOE_DP|gpu_id=|rank)\d+|gpu_id=\d+")
_RING, _MAX_BLOCK, _MAX_RELEVANT = 200, 120, 80   # recent lines, traceback lines, excerpt


@dataclass(frozen=True)
class Event:
    kind: str                 # "phase" | "progress" | "fatal" | "warning" | "violation"
    message: str
    ts: float
    phase: str | None = None  # the phase entered ("phase"), or current phase
    line: str | None = None   # the (redacted) message the event comes from
    data: dict[str, Any] = field(default_factory=dict)


_TB_SIG = Signature("other", re.compile(_TRACEBACK), "a rank raised an exception",
                    weight=GENERIC - 5, name="rank-traceback")
_NCCL_WARN_RE = re.compile(r"\bNCCL WARN\b")


class StartupTracker:
    """Incremental startup state of one server, fed journal lines in order.

    ``strict_order`` (live, the default): a startup out of order (ready without loading
    the weights, without the expected autotune...) is a violation. Offline (explain-log) a
    text may start in the middle of a startup: ``strict_order=False`` reports no violation.
    """

    def __init__(self, version: str, expect_autotune: bool, cuda_graph: bool, *,
                 strict_order: bool = True) -> None:
        self.expect_autotune = expect_autotune
        self.cuda_graph = cuda_graph
        self.strict_order = strict_order
        self._markers = markers_for(version)
        self._phase_idx = 0
        self.phase_entered: dict[str, float] = {}
        #: the log's own timestamp (as printed) of the line that entered each phase
        self.phase_entered_text: dict[str, str | None] = {}
        #: ``(done, total, pct)`` of the last tqdm shard update
        self.shard_progress: tuple[int, int, int] | None = None
        self.fatal: list[str] = []          # the fatal lines, in order
        self._reported: set[str] = set()    # rules and hit keys already reported
        self._seen: set[str] = set()
        self._ring: deque[str] = deque(maxlen=_RING)
        self._tb_current: list[str] | None = None
        self._tb_blocks: deque[list[str]] = deque(maxlen=8)   # the latest closed tracebacks
        self._nonfatal_lines: list[str] = []
        self._n = 0
        self.hits: list[Hit] = []           # every line that matched a cause signature
        self._frames: list[tuple[str, bool, bool]] = []  # (phase, inner-first, after ready)
        self._exc_lines: list[ExcLine] = []
        self._where: tuple[str, str | None] | None = None  # the last frame and its code
        self._tb_rank: str | None = None    # the rank whose traceback is being printed
        self._ranks: dict[str, None] = {}
        self._decoding = False              # a `Decode batch` stats line was seen
        self._weak_phase: str | None = None  # of the first weak frame that raised
        self._last_frame_weak: str | None = None
        # before ready: a traceback with no rank prefix, or a traceback frame line
        self._traceback_before_ready = False
        self._prev_frame = False
        self.last_ts_text: str | None = None

    # ---- properties -------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return PHASES[self._phase_idx]

    @property
    def ready_seen(self) -> bool:
        return "ready" in self._seen

    @property
    def _serving(self) -> bool:
        """After ready, or (a text that starts mid-way) after a `Decode batch` stats line:
        the scheduler logs one every --decode-log-interval (40) decode steps, which the
        startup's own warmup request (8 new tokens) never reaches."""
        return self.ready_seen or self._decoding

    @property
    def phase_reached(self) -> str | None:
        """The phase the markers show (None if none was seen); a shard bar at 100% counts
        as loaded even when `Load weight end` was cut off."""
        if self._seen <= {"starting"} and self.shard_progress is None:
            return None     # no marker, no shard progress
        prog = self.shard_progress
        if self.phase == "loading" and prog is not None and prog[0] == prog[1]:
            return "loaded"
        return self.phase

    @property
    def ranks(self) -> list[str]:
        return list(self._ranks)

    @property
    def phase_durations(self) -> dict[str, float]:
        """Seconds spent in each phase that has ended (from entering it to entering the
        next phase reached)."""
        order = [p for p in PHASES if p in self.phase_entered]
        return {a: round(self.phase_entered[b] - self.phase_entered[a], 3)
                for a, b in itertools.pairwise(order)}

    # ---- feeding ------------------------------------------------------------------------
    def feed(self, line: str | bytes, ts: float) -> list[Event]:
        if isinstance(line, (bytes, bytearray)):
            line = line.decode("utf-8", "replace")
        self.phase_entered.setdefault("starting", ts)
        events: list[Event] = []
        pieces = split_updates(line)
        progress_pieces = [p for p in pieces if "hards" in p and PROGRESS_RE.search(p)] \
            if "hards" in line else []
        if progress_pieces:
            prog = parse_progress(progress_pieces[-1])
            if prog is not None and prog != self.shard_progress:
                self.shard_progress = prog
                done, total, pct = prog
                events.append(Event("progress", f"checkpoint shards {done}/{total} ({pct}%)",
                                    ts, self.phase,
                                    data={"done": done, "total": total, "pct": pct}))
                if self._phase_idx < _IDX["loading"]:
                    events += self._enter("loading", ts, None)
            self._ring.append(redact(progress_pieces[-1]))
        for piece in pieces:
            if progress_pieces and piece in progress_pieces:
                continue
            events += self._feed_piece(piece, ts)
        return events

    def _feed_piece(self, raw: str, ts: float) -> list[Event]:
        self._n += 1
        ts_text, rank, msg = strip_prefix(raw)
        if ts_text:
            self.last_ts_text = ts_text
        if rank is not None and rank not in self._ranks and len(self._ranks) < 512:
            self._ranks[rank] = None
        shown = redact(raw)
        self._ring.append(shown)
        if msg.startswith(("Decode batch.", "Decode batch,")):
            self._decoding = True
        sig = match_signature(msg)
        events = self._traceback_line(msg, ts_text, rank, sig, ts, shown)
        self._frame_line(msg, shown, rank)
        events += self._signature_line(sig, msg, ts, shown)
        events += self._marker_line(msg, ts, shown)
        if ts_text is not None and self.phase_entered_text.get(self.phase, "") is None:
            self.phase_entered_text[self.phase] = ts_text
        return events

    def _traceback_line(self, msg: str, ts_text: str | None, rank: str | None,
                        sig: Signature | None, ts: float, shown: str) -> list[Event]:
        """Traceback blocks: start at "Traceback (most recent call last):" (possibly inside
        "Scheduler hit an exception: Traceback ..."), continue over unprefixed lines."""
        if _TRACEBACK in msg:
            chained = self._tb_current is not None and ts_text is None and any(
                c in "".join(self._tb_current[-3:]) for c in _CHAINED)
            if chained:
                self._block_append(shown)
                return []
            self._close_block()
            self._tb_current = [shown]
            self._tb_rank = rank
            if rank is not None and sig is None and _RANK_PREFIX_RE.search(rank):
                return self._hit(_TB_SIG, msg, ts, shown)
            if not self.ready_seen:
                self._traceback_before_ready = True
        elif self._tb_current is not None:
            if ts_text is None:
                self._block_append(shown)
            else:
                self._close_block()
        return []

    def _frame_line(self, msg: str, shown: str, rank: str | None) -> None:
        """A traceback's frame (``File "..."``), the code line after it, or its exception
        line: the phases the frames name, the exception lines (with where they were raised
        and the RANK whose traceback they end)."""
        prev_frame, self._prev_frame = self._prev_frame, False
        self._note_where(msg, prev_frame)
        if 'File "' in msg:
            fp = frame_phase(msg)
            if fp is not None:
                self._prev_frame = not fp[1]
                if not self.ready_seen:
                    self._traceback_before_ready = True
                # the innermost frame so far (an exception line right after its code
                # line makes it the frame that raised)
                self._last_frame_weak = fp[2]
                if fp[0] is not None and len(self._frames) < 4000:
                    self._frames.append((fp[0], fp[1], self._serving))
        elif prev_frame and "(" in msg:
            phase = call_phase(msg)
            if phase is not None and len(self._frames) < 4000:
                self._frames.append((phase, False, self._serving))
        elif msg[:1].isalpha() and _EXC_RE.match(msg) and len(self._exc_lines) < 200:
            self._note_exception(msg, shown, rank)
            if self._last_frame_weak and self._weak_phase is None and not self._serving:
                self._weak_phase = self._last_frame_weak
            self._last_frame_weak = None

    def _signature_line(self, sig: Signature | None, msg: str, ts: float,
                        shown: str) -> list[Event]:
        """A known failure signature's hit, or an NCCL warning (once per text)."""
        if sig is not None:
            return self._hit(sig, msg, ts, shown)
        if "NCCL WARN" in msg and _NCCL_WARN_RE.search(msg):
            key = "nccl-warn|" + msg[:120]
            if key not in self._reported:
                self._reported.add(key)
                self._nonfatal_lines.append(shown)
                return [Event("warning", "nccl-warn: NCCL printed a warning", ts,
                              self.phase, shown, {"signature": "nccl-warn"})]
        return []

    def _marker_line(self, msg: str, ts: float, shown: str) -> list[Event]:
        """A phase marker, or a capture/autotune progress bar entering its phase."""
        if MARKER_WORDS.search(msg) is not None:
            for marker in self._markers:
                if marker.pattern.search(msg):
                    return self._on_marker(marker, msg, ts, shown)
            return []
        bar = "capture" if _CAPTURE_BAR_RE.match(msg) else \
            "autotune" if _AUTOTUNE_BAR_RE.match(msg) else None
        if bar is not None and self._phase_idx < _IDX[bar]:
            return self._enter(bar, ts, shown)
        return []

    def _note_where(self, msg: str, prev_frame: bool) -> None:
        """Keep the last traceback frame's place (``sglang/srt/x.py:12, in func``) and its
        code line, for the exception line that follows them."""
        if 'File "' in msg:
            if (m := _WHERE_RE.search(msg)) is not None:
                path = _SHORT_PATH_RE.sub("", m.group(1))
                self._where = (f"{redact(path)}:{m.group(2)}, in {m.group(3)}", None)
        elif prev_frame and self._where is not None and not _EXC_RE.match(msg):
            self._where = (self._where[0], msg.strip())

    def _note_exception(self, msg: str, shown: str, rank: str | None) -> None:
        """An exception line, with where it was raised and the rank whose traceback it ends."""
        where, code = self._where or (None, None)
        self._exc_lines.append(ExcLine(shown, self._serving, redact(msg).strip(), where,
                                       redact(code) if code else None,
                                       rank or (self._tb_rank if self._tb_current else None)))
        self._where = None

    def _hit(self, sig: Signature, msg: str, ts: float, shown: str) -> list[Event]:
        if len(self.hits) < 500:
            self.hits.append(Hit(sig, self._n, shown, msg, self._serving,
                                 sig.phase or line_phase(msg)))
        # once per signature and message (the same line of every rank is one event)
        key = sig.id + "|" + re.sub(r"\b(?:TP|DP|PP|EP|Rank |rank)\s?\d+\b", "", msg)[:200]
        if sig.fatal:
            self.fatal.append(shown)
        if key in self._reported:
            return []
        self._reported.add(key)
        if not sig.fatal:
            self._nonfatal_lines.append(shown)
        return [Event("fatal" if sig.fatal else "warning", f"{sig.id}: {sig.summary}", ts,
                      self.phase, shown, {"signature": sig.id, "cause": sig.cause})]

    def _block_append(self, shown: str) -> None:
        """Append to the open traceback; past ``_MAX_BLOCK`` lines drop from the middle
        (keep the first lines and the latest ones: the exception is at the end)."""
        assert self._tb_current is not None
        self._tb_current.append(shown)
        if len(self._tb_current) > _MAX_BLOCK:
            del self._tb_current[10]

    def _close_block(self) -> None:
        if self._tb_current:
            self._tb_blocks.append(self._tb_current)
        self._tb_current = None

    def _on_marker(self, marker: Marker, msg: str, ts: float, shown: str) -> list[Event]:
        events: list[Event] = []
        phase = marker.phase
        idx = _IDX[phase]
        if phase == "capture" and not self.cuda_graph and self.strict_order and \
                not re.match(r"^Capture (?:piecewise|draft)", msg):
            events += self._rule(
                "warning", "capture-disabled",
                "CUDA graph capture ran although the deploy expects it disabled "
                "(--disable-cuda-graph)", ts, shown)
        if self.strict_order and phase == "autotune" and "autotune" not in self._seen:
            # a FlashInfer autotune that starts after graphs were captured or the server
            # listens: out of order (graphs captured with untuned kernels)
            if self._phase_idx >= _IDX["captured"]:
                events += self._rule(
                    "violation", "autotune-order",
                    f"FlashInfer autotune started after {self.phase}: out of order (the "
                    "graphs were captured before the kernels were tuned)", ts, shown)
            if not self.expect_autotune:
                events += self._rule(
                    "warning", "autotune-unexpected",
                    "FlashInfer autotune ran although the deploy did not expect it", ts, shown)
        if idx > self._phase_idx:
            if self.strict_order:
                events += self._check_skipped(phase, ts, shown)
            events += self._enter(phase, ts, shown)
        self._seen.add(phase)
        return events

    def _check_skipped(self, target: str, ts: float, shown: str) -> list[Event]:
        events: list[Event] = []
        if "loaded" not in self._seen and target in ("http", "warmup", "ready"):
            events += self._rule(
                "violation", "no-weights", f"the server reached {target} but no `Load weight end` was seen "
                "(weights not loaded?)", ts, shown)
        if self.expect_autotune and _IDX[target] > _IDX["autotuned"] and \
                "autotuned" not in self._seen:
            if "autotune" in self._seen:
                events += self._rule(
                    "violation", "autotune-incomplete",
                    f"FlashInfer autotune started but never completed before {target}",
                    ts, shown)
            else:
                reached = "became ready" if target == "ready" else f"reached {target}"
                events += self._rule(
                    "violation", "no-autotune", f"the server {reached} without FlashInfer "
                    "autotune: the autotune patch did not take effect", ts, shown)
        if self.cuda_graph and target in ("http", "ready") and "capture" not in self._seen:
            events += self._rule(
                "warning", "no-capture", f"the server reached {target} without CUDA graph "
                "capture (SGLang may have disabled it itself; look for `Disable cuda graph`)",
                ts, shown)
        return events

    def _enter(self, phase: str, ts: float, shown: str | None) -> list[Event]:
        prev = self.phase
        self._phase_idx = _IDX[phase]
        self.phase_entered.setdefault(phase, ts)
        self.phase_entered_text.setdefault(
            phase, self.last_ts_text if shown is None else strip_prefix(shown)[0])
        self._seen.add(phase)
        return [Event("phase", f"{prev} -> {phase}", ts, phase, shown, {"from": prev})]

    def _rule(self, kind: str, name: str, message: str, ts: float, shown: str) -> list[Event]:
        """A ``violation`` or ``warning`` of the startup order, once per rule."""
        if name in self._reported:
            return []
        self._reported.add(name)
        return [Event(kind, message, ts, self.phase, shown, {"rule": name})]

    # ---- diagnosis --------------------------------------------------------------------
    def diagnosis(self, *, offline: bool = False) -> dict[str, Any]:
        """What the lines so far say (logcauses.diagnose): ``failed``, the failure's
        ``phase`` (``serving`` after ready), ``cause``, ``summary``, ``fix``, ``evidence``.
        ``offline``: a traceback before ready counts as a failure too (live, only a rank's
        traceback or a fatal line does: the process may still be printing)."""
        bare = offline and not self.ready_seen and self._traceback_before_ready
        return diagnose(self.hits, self._frames, self._exc_lines, bare_traceback=bare,
                        phase_reached=self.phase_reached, weak_phase=self._weak_phase)

    # ---- reporting --------------------------------------------------------------------
    def recent_lines(self, n: int = 30) -> list[str]:
        return list(self._ring)[-n:]

    def tracebacks(self) -> list[list[str]]:
        return [*self._tb_blocks, *([self._tb_current] if self._tb_current else [])]

    def relevant_lines(self, limit: int | None = None) -> list[str]:
        """What to show an operator (``logexcerpt.relevant``), at most ``limit`` lines."""
        return relevant(self.tracebacks(), self.fatal + self._nonfatal_lines,
                        self.recent_lines(30), limit or _MAX_RELEVANT)

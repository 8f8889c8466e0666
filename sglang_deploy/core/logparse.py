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

__all__ = [
    "FATAL_SIGNATURES",
    "PHASES",
    "Event",
    "Marker",
    "Signature",
    "StartupTracker",
    "markers_for",
    "parse_progress",
    "redact",
    "split_updates",
    "strip_prefix",
]

PHASES = ("starting", "loading", "loaded", "kv_cache", "autotune", "autotuned", "capture",
          "captured", "http", "warmup", "ready")
_IDX = {p: i for i, p in enumerate(PHASES)}

# `[2026-03-01 12:00:00 TP0] `, `[2026-03-01 12:00:00.123 DP0 TP0 EP0] `, `[...] `
# (configure_logger: "[%(asctime)s{maybe_ms}{prefix}] %(message)s", prefix " DP0 PP0 TP0 ...")
_PREFIX_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?)"
    r"(?P<rank>(?: [A-Z][A-Z_]*\d+)*)\] ?(?P<msg>.*)$", re.DOTALL)
_EMBEDDED_PREFIX_RE = re.compile(
    r"(?=\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?(?: [A-Z][A-Z_]*\d+)*\] )")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]" (+ "\n" <= 0.5.9)
_PROGRESS_RE = re.compile(
    r"(?P<desc>Loading [^:\r\n]*?shards|Multi-thread loading shards|Loading safetensors "
    r"using [^:\r\n]*?):\s+(?P<pct>\d{1,3})%[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_SECRET_RE = re.compile(
    r"""((?:admin_)?api_key['"]?\s*[=:]\s*)(['"])(?:(?!\2).)*\2""")
_SECRET_ARG_RE = re.compile(r"(--(?:admin-)?api-key(?:=|\s+))(\S+)")


def redact(text: str) -> str:
    """Hide API keys in a log line (the ``server_args=ServerArgs(... api_key='...')`` line
    that every version logs at INFO, and ``--api-key X`` in a printed command line)."""
    text = _SECRET_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}<redacted>{m.group(2)}", text)
    return _SECRET_ARG_RE.sub(lambda m: f"{m.group(1)}<redacted>", text)


def strip_prefix(line: str) -> tuple[str | None, str | None, str]:
    """``[2026-03-01 12:00:00 DP0 TP0] msg`` -> ``("2026-03-01 12:00:00", "DP0 TP0", "msg")``;
    ``[2026-03-01 12:00:00] msg`` -> ``(ts, None, msg)``; anything else -> ``(None, None,
    line)``."""
    m = _PREFIX_RE.match(line)
    if not m:
        return None, None, line
    rank = m.group("rank").strip() or None
    return m.group("ts"), rank, m.group("msg")


def split_updates(line: str) -> list[str]:
    """Split one journal line into the pieces written separately: tqdm's ``\\r`` updates
    (0.5.10+ end them with ``\\r`` only, so journald joins them) and log lines of other
    processes glued onto an unterminated tqdm line. Empty pieces are dropped."""
    line = _ANSI_RE.sub("", line)
    out: list[str] = []
    for seg in line.split("\r"):
        for piece in _EMBEDDED_PREFIX_RE.split(seg):
            if piece.strip():
                out.append(piece.rstrip("\n"))
    return out


def parse_progress(text: str) -> tuple[int, int, int] | None:
    """The LAST tqdm shard update in ``text`` -> ``(done, total, pct)``."""
    last = None
    for m in _PROGRESS_RE.finditer(text):
        last = m
    if last is None:
        return None
    return int(last.group("n")), int(last.group("total")), int(last.group("pct"))


# --------------------------------------------------------------------------------------
# markers
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    phase: str
    pattern: re.Pattern[str]
    #: literal text of the emitting code (what the tests grep in the wheel)
    source: str
    #: package the source belongs to: sglang | uvicorn | flashinfer | torch | nccl
    origin: str = "sglang"
    #: file (inside the wheel) that holds ``source``, for the tests
    path: str = ""


def _v(version: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", version.split("+")[0])
    base = tuple(int(x) for x in nums[:3])
    post = 1 if "post" in version else 0
    return base + (post,)


_MR = "sglang/srt/model_executor/model_runner.py"
_POOL = "sglang/srt/mem_cache/memory_pool.py"
_SETUP = "sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py"
_KV_RE = re.compile(r"\bKV Cache (?:is allocated|VA upper bound)\.")
_CAP_BEGIN_RE = re.compile(
    r"^Capture (?:[\w-]+ ){0,4}?(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU) graph begin\b")
_CAP_END_RE = re.compile(
    r"^Capture (?:[\w-]+ ){0,4}?(?:cuda|CUDA|cpu|CPU|npu|NPU|xpu|XPU) graph end\b")


def markers_for(version: str) -> list[Marker]:
    """Phase markers for one sglang version. The patterns accept every spelling known
    from 0.5.9 to 0.5.23; ``source``/``path`` name the emitting code of THIS version
    (the tests check them against the wheels). Wording eras, read off the wheels:

    * KV cache: ``KV Cache is allocated. #tokens:`` (<= 0.5.12), ``KV Cache is allocated.
      dtype: ..`` (0.5.13 .. 0.5.16), ``{cache_name} is allocated. dtype:`` (0.5.17),
      ``{cache_name} {'VA upper bound' | 'is allocated'}. dtype:`` (0.5.18+);
    * autotune start: ``Running FlashInfer autotune...`` (<= 0.5.11), ``... with cache:
      <path>`` (0.5.12+), in model_runner.py (<= 0.5.13), runner/base_runner.py (0.5.14),
      runner/flashinfer_autotune.py (0.5.15+);
    * decode graph capture: ``Capture cuda graph begin.`` (<= 0.5.13), ``Capture target
      decode CUDA graph begin.`` from model_runner.py (0.5.14, 0.5.15) and from
      model_runner_components/cuda_graph_setup.py (0.5.16+); piecewise/prefill/draft
      captures use the same ``Capture ... graph begin|end`` shape.
    """
    v = _v(version)
    ms: list[Marker] = [
        Marker("loading", re.compile(r"^Load weight begin\b"), "Load weight begin. avail mem=",
               path=_MR),
        Marker("loaded", re.compile(r"^Load weight end\b"), "Load weight end. ", path=_MR),
    ]
    if v >= (0, 5, 18):
        kv_src = "'is allocated'}. dtype: {self.dtype}, "
    elif v >= (0, 5, 17):
        kv_src = "{cache_name} is allocated. dtype: {self.dtype}, "
    elif v >= (0, 5, 13):
        kv_src = "KV Cache is allocated. dtype: {self.dtype}, #tokens: "
    else:
        kv_src = "KV Cache is allocated. #tokens: "
    ms.append(Marker("kv_cache", _KV_RE, kv_src, path=_POOL))
    if v >= (0, 5, 15):
        at_path = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
    elif v >= (0, 5, 14):
        at_path = "sglang/srt/model_executor/runner/base_runner.py"
    else:
        at_path = _MR
    at_src = ("Running FlashInfer autotune with cache: %s" if v >= (0, 5, 12)
              else "Running FlashInfer autotune...")
    ms += [
        Marker("autotune", re.compile(r"^Running FlashInfer autotune\b"), at_src, path=at_path),
        Marker("autotuned", re.compile(r"^FlashInfer autotune completed\."),
               "FlashInfer autotune completed.", path=at_path),
    ]
    if v >= (0, 5, 16):
        cap = ("Capture {capture_name} {graph_backend[model_runner.device]} ", _SETUP)
    elif v >= (0, 5, 14):
        cap = ("Capture {capture_name} {graph_backend[self.device]} ", _MR)
    else:
        cap = ("Capture {graph_backend[self.device]} ", _MR)
    ms += [
        Marker("capture", _CAP_BEGIN_RE, cap[0] + "begin. ", path=cap[1]),
        Marker("captured", _CAP_END_RE, cap[0] + "end. ", path=cap[1]),
        Marker("http", re.compile(r"Uvicorn running on\b"),
               "Uvicorn running on", origin="uvicorn", path="uvicorn/server.py"),
        # warmup: _execute_server_warmup polls /model_info, then POSTs /generate
        Marker("warmup", re.compile(r'"GET /(?:get_)?model_info HTTP/[\d.]+" 200'),
               'url + "/model_info"', path="sglang/srt/entrypoints/http_server.py"),
        Marker("ready", re.compile(r"The server is fired up and ready to roll!"),
               "The server is fired up and ready to roll!",
               path="sglang/srt/entrypoints/http_server.py"),
    ]
    return ms


@dataclass(frozen=True)
class Signature:
    name: str
    pattern: re.Pattern[str]
    hint: str
    fatal: bool = True
    source: str = ""
    origin: str = "sglang"


FATAL_SIGNATURES: tuple[Signature, ...] = (
    Signature("scheduler-exception", re.compile(r"Scheduler hit an exception:"),
              "a scheduler (model worker) crashed; the traceback says why",
              source="Scheduler hit an exception: "),
    Signature("child-sigquit", re.compile(r"Received sigquit from a child process"),
              "a child process (scheduler/detokenizer) failed; see the lines above",
              source="Received sigquit from a child process. It usually means the child failed."),
    Signature("scheduler-dead", re.compile(r"scheduler is dead|scheduler died during "
                                           r"initialization"),
              "a scheduler process died during startup; see its traceback",
              source="scheduler died during initialization"),
    Signature("init-failed", re.compile(r"Initialization failed\."),
              "startup or the warmup request failed; see the error above",
              source="Initialization failed. "),
    Signature("not-enough-memory",
              re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
              "the KV cache does not fit: raise --mem-fraction-static (or lower "
              "--context-length / --max-running-requests / --chunked-prefill-size)",
              source="Not enough memory. Please try to increase --mem-fraction-static"),
    Signature("cuda-graph-capture", re.compile(r"Capture cuda graph failed"),
              "CUDA graph capture failed: lower --cuda-graph-max-bs / --mem-fraction-static "
              "or set --disable-cuda-graph",
              source="Capture cuda graph failed: "),
    Signature("ninja-build",
              re.compile(r"RuntimeError: Ninja build failed\.|^Ninja build failed\."),
              "the FlashInfer JIT build failed (the compilation errors of the autotune TODO): "
              "check nvcc/CUDA toolkit version and the Ninja output",
              source='msg = "Ninja build failed."', origin="flashinfer"),
    Signature("no-nvcc", re.compile(r"Could not find nvcc"),
              "FlashInfer JIT needs nvcc: install the CUDA toolkit and put nvcc on PATH "
              "(or set CUDA_HOME) for the service",
              source="Could not find nvcc and default", origin="flashinfer"),
    Signature("cuda-oom", re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError"),
              "a GPU ran out of memory: lower --mem-fraction-static or free the GPUs",
              origin="torch"),
    Signature("port-in-use",
              re.compile(r"error while attempting to bind on address .*address already in use"),
              "another process holds the server's port: find it with `ss -ltnp` on the host "
              "and stop it, or set `sglang_port` to a free port",
              origin="uvicorn"),
    Signature("nccl-warn", re.compile(r"\bNCCL WARN\b"),
              "NCCL reported a problem (P2P/transport): check NCCL_P2P_DISABLE / NCCL_P2P_LEVEL "
              "and the GPU topology", fatal=False, origin="nccl"),
)


@dataclass(frozen=True)
class Event:
    kind: str                 # "phase" | "progress" | "fatal" | "warning" | "violation"
    message: str
    ts: float
    phase: str | None = None  # the phase entered ("phase"), or current phase
    line: str | None = None   # the (redacted) message the event comes from
    data: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# tracker
# --------------------------------------------------------------------------------------


class StartupTracker:
    """Incremental startup state of one server, fed journal lines in order."""

    def __init__(self, version: str, expect_autotune: bool, cuda_graph: bool, *,
                 ring: int = 200, max_block: int = 120, max_relevant: int = 80) -> None:
        self.version = version
        self.expect_autotune = expect_autotune
        self.cuda_graph = cuda_graph
        self._markers = markers_for(version)
        self._phase_idx = 0
        self._entered: dict[str, float] = {}
        self._first_ts: float | None = None
        self._last_ts: float | None = None
        self._progress: tuple[int, int, int] | None = None
        self._fatal: list[str] = []
        self._fatal_hints: list[str] = []
        self._fatal_seen: set[str] = set()
        self._warnings_seen: set[str] = set()
        self._violations: list[str] = []
        self._violated: set[str] = set()
        self._seen: set[str] = set()
        self._ring: deque[str] = deque(maxlen=ring)
        self._max_block = max_block
        self._max_relevant = max_relevant
        self._tb_current: list[str] | None = None
        self._tb_blocks: list[list[str]] = []
        self._decode_capture_seen = False
        self._nonfatal_lines: list[str] = []

    # ---- properties -------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return PHASES[self._phase_idx]

    @property
    def ready_seen(self) -> bool:
        return "ready" in self._seen

    @property
    def shard_progress(self) -> tuple[int, int, int] | None:
        """``(done, total, pct)`` of the last tqdm shard update, or None."""
        return self._progress

    @property
    def fatal(self) -> list[str]:
        return list(self._fatal)

    @property
    def fatal_hints(self) -> list[str]:
        return list(self._fatal_hints)

    @property
    def violations(self) -> list[str]:
        return list(self._violations)

    @property
    def phase_entered(self) -> dict[str, float]:
        return dict(self._entered)

    @property
    def phase_durations(self) -> dict[str, float]:
        """Seconds spent in each phase that has ended (from entering it to entering the
        next phase reached)."""
        order = [p for p in PHASES if p in self._entered]
        out = {}
        for a, b in itertools.pairwise(order):
            out[a] = round(self._entered[b] - self._entered[a], 3)
        return out

    def elapsed_in_phase(self, now: float) -> float:
        return now - self._entered.get(self.phase, self._first_ts if self._first_ts is not None
                                       else now)

    # ---- feeding ------------------------------------------------------------------------
    def feed(self, line: str | bytes, ts: float) -> list[Event]:
        if isinstance(line, (bytes, bytearray)):
            line = line.decode("utf-8", "replace")
        if self._first_ts is None:
            self._first_ts = ts
            self._entered.setdefault("starting", ts)
        self._last_ts = ts
        events: list[Event] = []
        pieces = split_updates(line)
        progress_pieces = [p for p in pieces if _PROGRESS_RE.search(p)]
        if progress_pieces:
            prog = parse_progress(progress_pieces[-1])
            if prog is not None and prog != self._progress:
                self._progress = prog
                done, total, pct = prog
                events.append(Event("progress", f"checkpoint shards {done}/{total} ({pct}%)",
                                    ts, self.phase, data={"done": done, "total": total,
                                                          "pct": pct}))
                if self._phase_idx < _IDX["loading"]:
                    events += self._enter("loading", ts, None)
            self._remember(redact(progress_pieces[-1]))
        for piece in pieces:
            if progress_pieces and piece in progress_pieces:
                continue
            events += self._feed_piece(piece, ts)
        return events

    def _remember(self, text: str) -> None:
        self._ring.append(text)

    def _feed_piece(self, raw: str, ts: float) -> list[Event]:
        events: list[Event] = []
        ts_text, _rank, msg = strip_prefix(raw)
        shown = redact(raw)
        self._remember(shown)
        # traceback blocks: start at "Traceback (most recent call last):" (possibly inside
        # "Scheduler hit an exception: Traceback ..."), continue over unprefixed lines
        if _TRACEBACK in msg:
            chained = self._tb_current is not None and ts_text is None and any(
                c in "".join(self._tb_current[-3:]) for c in _CHAINED)
            if chained:
                self._block_append(shown)
            elif not chained:
                self._close_block()
                self._tb_current = [shown]
        elif self._tb_current is not None:
            if ts_text is None:
                self._block_append(shown)
            else:
                self._close_block()
        for sig in FATAL_SIGNATURES:
            if sig.pattern.search(msg):
                key = sig.name + "|" + re.sub(r"\b(?:TP|DP|PP|EP|Rank )\s?\d+\b", "", msg)[:200]
                if sig.fatal:
                    self._fatal.append(shown)
                    if sig.hint not in self._fatal_hints:
                        self._fatal_hints.append(sig.hint)
                    if key not in self._fatal_seen:
                        self._fatal_seen.add(key)
                        events.append(Event("fatal", f"{sig.name}: {sig.hint}", ts, self.phase,
                                            shown, {"signature": sig.name}))
                elif key not in self._warnings_seen:
                    self._warnings_seen.add(key)
                    events.append(Event("warning", f"{sig.name}: {sig.hint}", ts, self.phase,
                                        shown, {"signature": sig.name}))
                    self._nonfatal_lines.append(shown)
                break
        for marker in self._markers:
            if marker.pattern.search(msg):
                events += self._on_marker(marker, msg, ts, shown)
                break
        return events

    def _block_append(self, shown: str) -> None:
        """Append to the open traceback; past ``max_block`` lines drop from the middle
        (keep the first lines and the latest ones: the exception is at the end)."""
        assert self._tb_current is not None
        self._tb_current.append(shown)
        if len(self._tb_current) > self._max_block:
            del self._tb_current[10]

    def _close_block(self) -> None:
        if self._tb_current:
            self._tb_blocks.append(self._tb_current)
            self._tb_blocks = self._tb_blocks[-8:]
        self._tb_current = None

    def _on_marker(self, marker: Marker, msg: str, ts: float, shown: str) -> list[Event]:
        events: list[Event] = []
        phase = marker.phase
        idx = _IDX[phase]
        if phase == "capture" and not re.match(r"^Capture (?:piecewise|draft)", msg):
            if not self._decode_capture_seen and not self.cuda_graph:
                self._decode_capture_seen = True
                events.append(self._warning(
                    "capture-disabled",
                    "CUDA graph capture ran although the deploy expects it disabled "
                    "(--disable-cuda-graph)", ts, shown))
            self._decode_capture_seen = True
        # a FlashInfer autotune that starts after graphs were captured or the server
        # listens: out of order (graphs captured with untuned kernels)
        if phase == "autotune" and self._phase_idx >= _IDX["captured"] and \
                "autotune" not in self._seen:
            events += self._violation(
                "autotune-order",
                f"FlashInfer autotune started after {self.phase}: out of order (the graphs "
                "were captured before the kernels were tuned)", ts, shown)
        if phase == "autotune" and not self.expect_autotune and "autotune" not in self._seen:
            events.append(self._warning(
                "autotune-unexpected",
                "FlashInfer autotune ran although the deploy did not expect it", ts, shown))
        if idx > self._phase_idx:
            events += self._check_skipped(phase, ts, shown)
            events += self._enter(phase, ts, shown)
        self._seen.add(phase)
        return events

    def _check_skipped(self, target: str, ts: float, shown: str) -> list[Event]:
        events: list[Event] = []
        t = _IDX[target]
        if t > _IDX["loaded"] and "loaded" not in self._seen and target in ("http", "warmup",
                                                                            "ready"):
            events += self._violation(
                "no-weights", f"the server reached {target} but no `Load weight end` was seen "
                "(weights not loaded?)", ts, shown)
        if self.expect_autotune and t > _IDX["autotuned"] and "autotuned" not in self._seen:
            if "autotune" in self._seen:
                events += self._violation(
                    "autotune-incomplete",
                    f"FlashInfer autotune started but never completed before {target}",
                    ts, shown)
            elif target == "ready":
                events += self._violation(
                    "no-autotune",
                    "the server became ready without FlashInfer autotune: the autotune "
                    "patch did not take effect", ts, shown)
            else:
                events += self._violation(
                    "no-autotune",
                    f"the server reached {target} without FlashInfer autotune: the "
                    "autotune patch did not take effect", ts, shown)
        if self.cuda_graph and target in ("http", "ready") and "capture" not in self._seen \
                and "no-capture" not in self._warnings_seen:
            events.append(self._warning(
                "no-capture", f"the server reached {target} without CUDA graph capture "
                "(SGLang may have disabled it itself; look for `Disable cuda graph`)",
                ts, shown))
        return events

    def _enter(self, phase: str, ts: float, shown: str | None) -> list[Event]:
        prev = self.phase
        self._phase_idx = _IDX[phase]
        self._entered.setdefault(phase, ts)
        self._seen.add(phase)
        return [Event("phase", f"{prev} -> {phase}", ts, phase, shown, {"from": prev})]

    def _violation(self, name: str, message: str, ts: float, shown: str) -> list[Event]:
        if name in self._violated:
            return []
        self._violated.add(name)
        self._violations.append(message)
        return [Event("violation", message, ts, self.phase, shown, {"rule": name})]

    def _warning(self, name: str, message: str, ts: float, shown: str) -> Event:
        self._warnings_seen.add(name)
        return Event("warning", message, ts, self.phase, shown, {"rule": name})

    # ---- reporting --------------------------------------------------------------------
    def recent_lines(self, n: int = 30) -> list[str]:
        return list(self._ring)[-n:]

    def tracebacks(self) -> list[list[str]]:
        blocks = list(self._tb_blocks)
        if self._tb_current:
            blocks.append(self._tb_current)
        return [list(b) for b in blocks]

    def relevant_lines(self, limit: int | None = None) -> list[str]:
        """What to show an operator: the first traceback (where a crash starts; other
        ranks usually repeat it), a different last one if any, then the fatal lines
        (deduplicated across ranks), bounded to ``limit`` lines. Without any of those: the
        last lines of the log."""
        limit = limit or self._max_relevant
        out: list[str] = []
        blocks = self.tracebacks()
        if blocks:
            out += blocks[0]
            if len(blocks) > 1 and _tb_tail(blocks[-1]) != _tb_tail(blocks[0]):
                out += ["..."] + blocks[-1]
        seen_msgs = {_dedup_key(x) for x in out}
        extras: list[str] = []
        for line in self._fatal + self._nonfatal_lines:
            key = _dedup_key(line)
            if key in seen_msgs:
                continue
            seen_msgs.add(key)
            extras.append(line)
        if not out and not extras:
            return self.recent_lines(min(limit, 30))
        if len(out) + len(extras) > limit:
            keep_tb = max(limit - len(extras), limit // 2)
            if len(out) > keep_tb:
                head = max(keep_tb // 4, 1)
                tail = keep_tb - head - 1
                out = out[:head] + [f"... ({len(out) - head - tail} lines omitted)"] + \
                    (out[-tail:] if tail > 0 else [])
            extras = extras[: max(limit - len(out), 0)]
        return out + extras


def _dedup_key(line: str) -> str:
    key = re.sub(r"^\[[^\]]*\] ?", "", line)
    return re.sub(r"\bRank \d+\b", "Rank N", key)[:200]


def _tb_tail(block: list[str]) -> str:
    return block[-1] if block else ""

"""Phase markers of SGLang startup logs, per version (pure). See logparse for the order."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MARKER_WORDS", "PHASES", "Marker", "markers_for"]

PHASES = ("starting", "loading", "loaded", "kv_cache", "autotune", "autotuned", "capture",
          "captured", "http", "warmup", "ready")
#: a cheap pre-filter: a message without any of these matches no marker
MARKER_WORDS = re.compile(r"Load weight|Loading model from|Endpoint '/get_model_info'|KV Cache|Memory pool end|FlashInfer autotune|"
                          r"^Capture |Uvicorn running|model_info|fired up")


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
    return (*(int(x) for x in nums[:3]), int("post" in version))


_MR = "sglang/srt/model_executor/model_runner.py"
_POOL = "sglang/srt/mem_cache/memory_pool.py"
_SETUP = "sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py"
# 0.3 .. 0.4 print no `KV Cache is allocated` line: their `Memory pool end` follows the
# allocation the same way
_KV_RE = re.compile(r"\bKV Cache (?:is allocated|VA upper bound)\.|^Memory pool end\b")
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
    cap_src, cap_path = _capture_source(v)
    return [
        Marker("loading", re.compile(r"^Load weight begin\b|^Loading model from \d+ "
                                      r"safetensors files"), "Load weight begin. avail mem=",
               path=_MR),
        Marker("loaded", re.compile(r"^Load weight end\b"), "Load weight end. ", path=_MR),
        Marker("kv_cache", _KV_RE, _kv_source(v), path=_POOL),
        *_autotune_markers(v),
        Marker("capture", _CAP_BEGIN_RE, cap_src + "begin. ", path=cap_path),
        Marker("captured", _CAP_END_RE, cap_src + "end. ", path=cap_path),
        Marker("http", re.compile(r"Uvicorn running on\b"),
               "Uvicorn running on", origin="uvicorn", path="uvicorn/server.py"),
        # warmup: _execute_server_warmup polls /model_info, then POSTs /generate
        Marker("warmup", re.compile(r'"GET /(?:get_)?model_info HTTP/[\d.]+" 200|^Endpoint '
                                     r"'/get_model_info' is deprecated"),
               'url + "/model_info"', path="sglang/srt/entrypoints/http_server.py"),
        Marker("ready", re.compile(r"The server is fired up and ready to roll!"),
               "The server is fired up and ready to roll!",
               path="sglang/srt/entrypoints/http_server.py"),
    ]


def _kv_source(v: tuple[int, ...]) -> str:
    """The KV-cache line's source text in version V."""
    if v >= (0, 5, 18):
        return "'is allocated'}. dtype: {self.dtype}, "
    if v >= (0, 5, 17):
        return "{cache_name} is allocated. dtype: {self.dtype}, "
    if v >= (0, 5, 13):
        return "KV Cache is allocated. dtype: {self.dtype}, #tokens: "
    return "KV Cache is allocated. #tokens: "


def _autotune_markers(v: tuple[int, ...]) -> list[Marker]:
    """The autotune start and end markers of version V (their file moved twice)."""
    if v >= (0, 5, 15):
        at_path = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
    elif v >= (0, 5, 14):
        at_path = "sglang/srt/model_executor/runner/base_runner.py"
    else:
        at_path = _MR
    at_src = ("Running FlashInfer autotune with cache: %s" if v >= (0, 5, 12)
              else "Running FlashInfer autotune...")
    return [
        Marker("autotune", re.compile(r"^Running FlashInfer autotune\b"), at_src, path=at_path),
        Marker("autotuned", re.compile(r"^FlashInfer autotune completed\."),
               "FlashInfer autotune completed.", path=at_path),
    ]


def _capture_source(v: tuple[int, ...]) -> tuple[str, str]:
    """(the graph capture lines' source text before begin/end, its file) in version V."""
    if v >= (0, 5, 16):
        return "Capture {capture_name} {graph_backend[model_runner.device]} ", _SETUP
    if v >= (0, 5, 14):
        return "Capture {capture_name} {graph_backend[self.device]} ", _MR
    return "Capture {graph_backend[self.device]} ", _MR

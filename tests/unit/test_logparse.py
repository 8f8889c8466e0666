"""sglang_deploy.core.logs.parse: markers checked against the REAL wheels, then the tracker on
synthetic journals (tests/fixtures/logs/*.jsonl, one ``{"ts": s, "line": text}`` per
journal entry, built from the real log strings: CR-joined tqdm updates, tracebacks from
several ranks, an API key in the ``server_args=`` line)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from sglang_deploy.core.logs import causes as C
from sglang_deploy.core.logs import parse as L
from testbed.wheels import extract_member, fetch_sglang, fetch_wheel

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
VERSIONS = ["0.5.9", "0.5.10", "0.5.12.post1", "0.5.23"]
# the versions where a wording changed (see markers_for)
BOUNDARIES = ["0.5.11", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18"]


@cache
def srt_sources(version: str) -> str:
    import zipfile

    with zipfile.ZipFile(fetch_sglang(version)) as zf:
        return "\n".join(zf.read(n).decode("utf-8", "replace") for n in zf.namelist()
                         if n.startswith("sglang/srt/") and n.endswith(".py")
                         and "/test/" not in n)


def journal(name: str) -> list[tuple[float, str]]:
    rows = [json.loads(x) for x in (FIXTURES / name).read_text().splitlines() if x.strip()]
    return [(r["ts"], r["line"]) for r in rows]


def run(name: str, version: str, expect_autotune=True, cuda_graph=False):
    t = L.StartupTracker(version, expect_autotune=expect_autotune, cuda_graph=cuda_graph)
    events = []
    for ts, line in journal(name):
        events += t.feed(line, ts)
    return t, events


# ---------------------------------------------------------------------------------------
# markers against the real sources
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS + BOUNDARIES)
def test_phase_markers_exist_in_the_wheel(version):
    w = fetch_sglang(version)
    for m in L.markers_for(version):
        if m.origin != "sglang":
            continue
        text = extract_member(w, m.path)
        assert m.source in text, f"{version}: {m.phase} marker {m.source!r} not in {m.path}"


@pytest.mark.parametrize("version", VERSIONS)
def test_fatal_signatures_exist_in_the_wheel(version):
    src = srt_sources(version)
    for sig in C.SIGNATURES:
        if sig.origin != "sglang":
            continue
        assert (sig.source and sig.source in src) or sig.pattern.search(src), \
            f"{version}: {sig.id} ({sig.source or sig.pattern.pattern})"


def test_uvicorn_and_flashinfer_strings():
    uv = extract_member(fetch_wheel("uvicorn", "0.34.0"), "uvicorn/server.py")
    http = next(m for m in L.markers_for("0.5.12.post1") if m.phase == "http")
    assert http.source in uv and http.pattern.search(
        "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)")
    # flashinfer-python pinned by sglang 0.5.12.post1
    fi = extract_member(fetch_wheel("flashinfer-python", "0.6.11.post1"),
                        "flashinfer/jit/cpp_ext.py")
    for sig in C.SIGNATURES:
        if sig.origin == "flashinfer":
            assert sig.source in fi, sig.name


def test_tqdm_bar_format_matches_progress_regex():
    for version in VERSIONS:
        src = srt_sources(version)
        m = re.search(r'^BAR_FORMAT = "(.*?)"', src, re.MULTILINE)
        assert m, version
        fmt = m.group(1).replace("\\n", "\n")
        line = fmt.format(desc="Loading safetensors checkpoint shards", percentage=48,
                          n_fmt="12", total_fmt="25", elapsed="00:10", remaining="00:12",
                          rate_fmt="1.20it/s")
        assert L.parse_progress(line) == (12, 25, 48), version
        assert 'desc="Loading safetensors checkpoint shards"' in src


@pytest.mark.parametrize("version, line", [
    ("0.5.9", "KV Cache is allocated. #tokens: 812345, KV size: 51.20 GB"),
    ("0.5.13", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 5, KV size: 1.00 GB"),
    ("0.5.23", "KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 5, KV size: 1.00 GB"),
    ("0.5.23", "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 5, KV size: 1.00 GB"),
])
def test_kv_wordings(version, line):
    assert any(m.phase == "kv_cache" and m.pattern.search(line) for m in L.markers_for(version))


@pytest.mark.parametrize("line, phase", [
    ("Capture cuda graph begin. This can take up to several minutes. avail mem=18.20 GB",
     "capture"),
    ("Capture cuda graph end. Time elapsed: 12.50 s. mem usage=0.80 GB. avail mem=17.40 GB.",
     "captured"),
    ("Capture piecewise CUDA graph begin. avail mem=17.40 GB", "capture"),
    ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1", "capture"),
    ("Capture target prefill CUDA graph end. elapsed=3.00 s", "captured"),
    ("Capture draft extend cuda graph begin (step 1). This can take up to several minutes.",
     "capture"),
    ("Capture cuda graph bs [1, 2, 4, 8]", None),
    ("Capture cuda graph failed: CUDA error", None),
    ("Running FlashInfer autotune...", "autotune"),
    ("Running FlashInfer autotune with cache: /x/rank_tp0.json", "autotune"),
    ("FlashInfer autotune completed.", "autotuned"),
])
def test_marker_patterns(line, phase):
    hits = [m.phase for m in L.markers_for("0.5.23") if m.pattern.search(line)]
    assert hits == ([phase] if phase else [])


# ---------------------------------------------------------------------------------------
# prefix, progress, redaction
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, expected", [
    ("[2026-03-01 12:00:00 TP0] Load weight begin.", ("2026-03-01 12:00:00", "TP0",
                                                      "Load weight begin.")),
    ("[2026-03-01 12:00:00] The server is fired up and ready to roll!",
     ("2026-03-01 12:00:00", None, "The server is fired up and ready to roll!")),
    ("[2026-03-01 12:00:00 DP0 TP0] x", ("2026-03-01 12:00:00", "DP0 TP0", "x")),
    ("[2026-03-01 12:00:00 PP1 TP3 EP3] x", ("2026-03-01 12:00:00", "PP1 TP3 EP3", "x")),
    ("[2026-03-01 12:00:00.123 ATTN_CP0 MOE_DP1 TP2] x",
     ("2026-03-01 12:00:00.123", "ATTN_CP0 MOE_DP1 TP2", "x")),
    ("  File \"x.py\", line 1, in f", (None, None, "  File \"x.py\", line 1, in f")),
    ("[1/3] nvcc -c x.cu", (None, None, "[1/3] nvcc -c x.cu")),
])
def test_strip_prefix(line, expected):
    assert L.strip_prefix(line) == expected


def test_progress_takes_the_last_cr_update():
    bar = "Loading safetensors checkpoint shards: {:3d}% Completed | {}/25 [00:01<00:02, 1.2it/s]"
    line = "".join("\r" + bar.format(int(n * 4), n) for n in range(13))
    assert L.parse_progress(line) == (12, 25, 48)
    t = L.StartupTracker("0.5.12.post1", True, False)
    evs = t.feed(line, 1.0)
    assert t.shard_progress == (12, 25, 48)
    assert [e.kind for e in evs].count("progress") == 1
    assert t.phase == "loading"


def test_log_line_glued_to_unterminated_tqdm_line():
    line = ("\rLoading safetensors checkpoint shards:  48% Completed | 12/25 [00:10<00:12]"
            "[2026-03-01 12:00:30 TP0] Load weight end. elapsed=41.2 s")
    pieces = L.split_updates(line)
    assert pieces[-1].startswith("[2026-03-01 12:00:30 TP0] Load weight end")
    t = L.StartupTracker("0.5.12.post1", True, False)
    t.feed(line, 1.0)
    assert t.shard_progress == (12, 25, 48) and t.phase == "loaded"


def test_bytes_and_ansi():
    t = L.StartupTracker("0.5.12.post1", True, False)
    t.feed(b"\x1b[A\rLoading safetensors checkpoint shards:  4% Completed | 1/25 [..]", 0.0)
    assert t.shard_progress == (1, 25, 4)


def test_redact():
    s = "server_args=ServerArgs(api_key='sk-1', admin_api_key=\"a\", x=1)"
    assert "sk-1" not in L.redact(s) and '"a"' not in L.redact(s)
    assert "'api_key': '<redacted>'" in L.redact("server_args={'api_key': 'sk-2', 'x': 1}")
    assert L.redact("python -m sglang.launch_server --api-key sk-3 --port 1") == \
        "python -m sglang.launch_server --api-key <redacted> --port 1"


# ---------------------------------------------------------------------------------------
# whole journals
# ---------------------------------------------------------------------------------------


def test_healthy_pinned_seed_profile():
    t, events = run("healthy-0.5.12.post1.jsonl", "0.5.12.post1", cuda_graph=False)
    phases = [e.phase for e in events if e.kind == "phase"]
    assert phases == ["loading", "loaded", "kv_cache", "autotune", "autotuned", "capture",
                      "captured", "http", "warmup", "ready"]  # piecewise capture still runs
    assert t.ready_seen and t.phase == "ready"
    assert not [e for e in events if e.kind in ("fatal", "violation", "warning")]
    assert t.shard_progress == (25, 25, 100)
    d = t.phase_durations
    assert d["loading"] > 30 and d["autotune"] >= 30 and "ready" not in d
    assert not t.fatal
    # the API key of the server_args= line never reaches what we keep
    t2 = L.StartupTracker("0.5.12.post1", True, False)
    t2.feed(journal("healthy-0.5.12.post1.jsonl")[0][1], 0.0)
    (kept,) = t2.recent_lines()
    assert "server_args=" in kept and "sk-test" not in kept and "<redacted>" in kept
    assert "sk-test" not in t2.relevant_lines()[0]


@pytest.mark.parametrize("name, version", [("healthy-0.5.9-cudagraph.jsonl", "0.5.9"),
                                           ("healthy-0.5.23-cudagraph.jsonl", "0.5.23")])
def test_healthy_other_versions_with_cuda_graph(name, version):
    t, events = run(name, version, cuda_graph=True)
    assert t.ready_seen
    assert not [e for e in events if e.kind in ("fatal", "violation", "warning")]
    assert list(t.phase_entered) == list(L.PHASES)


def test_cuda_graph_expected_but_absent_is_a_warning():
    _, events = run("healthy-0.5.12.post1.jsonl", "0.5.12.post1", cuda_graph=True)
    assert not [e for e in events if e.kind == "warning"]  # piecewise capture counts
    t = L.StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    evs = []
    for ts, line in journal("no-autotune-0.5.12.post1.jsonl"):
        if "piecewise" not in line:
            evs += t.feed(line, ts)
    assert [e.data["rule"] for e in evs if e.kind == "warning"] == ["no-capture"]
    assert not [e for e in evs if e.kind == "violation"]


def test_decode_capture_with_cuda_graph_disabled_is_a_warning():
    _, events = run("healthy-0.5.9-cudagraph.jsonl", "0.5.9", cuda_graph=False)
    assert [e.data["rule"] for e in events if e.kind == "warning"] == ["capture-disabled"]


def test_ready_without_autotune_is_a_violation():
    _, events = run("no-autotune-0.5.12.post1.jsonl", "0.5.12.post1")
    v = [e for e in events if e.kind == "violation"]
    assert len(v) == 1
    assert "without FlashInfer autotune: the autotune patch did not take effect" in v[0].message
    # reported as soon as it is certain (graph capture follows the kernel warmup)
    assert v[0].phase == "kv_cache"


def test_ready_without_autotune_message_when_nothing_in_between():
    t = L.StartupTracker("0.5.12.post1", expect_autotune=True, cuda_graph=False)
    for i, line in enumerate(["[2026-03-01 12:00:00 TP0] Load weight begin. avail mem=1 GB",
                              "[2026-03-01 12:00:00 TP0] Load weight end. x",
                              "[2026-03-01 12:00:00] The server is fired up and ready to roll!"]):
        evs = t.feed(line, float(i))
    (v,) = [e for e in evs if e.kind == "violation"]
    assert v.message == ("the server became ready without FlashInfer autotune: the autotune "
                         "patch did not take effect")


def test_no_autotune_expected_no_violation():
    _, events = run("no-autotune-0.5.12.post1.jsonl", "0.5.12.post1", expect_autotune=False)
    assert not [e for e in events if e.kind in ("violation", "fatal", "warning")]


def test_unexpected_autotune_is_a_warning():
    _, events = run("healthy-0.5.12.post1.jsonl", "0.5.12.post1", expect_autotune=False)
    assert [e.data["rule"] for e in events if e.kind == "warning"] == ["autotune-unexpected"]


def test_autotune_started_never_completed():
    t = L.StartupTracker("0.5.12.post1", True, False)
    evs = []
    for i, m in enumerate(["Load weight begin. a", "Load weight end. b",
                           "Running FlashInfer autotune with cache: /c",
                           "Capture piecewise CUDA graph begin. avail mem=1 GB"]):
        evs += t.feed(f"[2026-03-01 12:00:00 TP0] {m}", float(i))
    (v,) = [e for e in evs if e.kind == "violation"]
    assert "started but never completed" in v.message


def test_autotune_after_capture_is_out_of_order():
    t = L.StartupTracker("0.5.12.post1", True, True)
    evs = []
    for i, m in enumerate(["Load weight begin. a", "Load weight end. b",
                           "KV Cache is allocated. #tokens: 1, KV size: 1 GB",
                           "Capture cuda graph begin. x", "Capture cuda graph end. y",
                           "Running FlashInfer autotune with cache: /c"]):
        evs += t.feed(f"[2026-03-01 12:00:00 TP0] {m}", float(i))
    rules = [e.data["rule"] for e in evs if e.kind == "violation"]
    assert "autotune-order" in rules


def test_lagging_ranks_do_not_move_the_phase_back():
    t = L.StartupTracker("0.5.12.post1", False, False)
    t.feed("[2026-03-01 12:00:00 TP0] Load weight end. x", 1.0)
    t.feed("[2026-03-01 12:00:00 TP0] KV Cache is allocated. #tokens: 1, KV size: 1 GB", 2.0)
    evs = t.feed("[2026-03-01 12:00:00 TP7] Load weight end. x", 3.0)
    assert t.phase == "kv_cache" and not evs


def test_crash_ninja_autotune():
    t, events = run("crash-ninja-0.5.12.post1.jsonl", "0.5.12.post1")
    fatal = [e for e in events if e.kind == "fatal"]
    names = [e.data["signature"] for e in fatal]
    assert names[:2] == ["scheduler-exception", "jit-build"]
    assert "sigquit-teardown" in names and "scheduler-died" in names
    d = t.diagnosis()
    assert (d["cause"], d["phase"]) == ("jit-build", "autotune")
    assert t.phase == "autotune" and not t.ready_seen
    rel = t.relevant_lines()
    text = "\n".join(rel)
    # the whole chained traceback of the first rank, ending with the Ninja output
    assert rel[0].endswith("Scheduler hit an exception: Traceback (most recent call last):")
    assert "The above exception was the direct cause" in text
    assert "RuntimeError: Ninja build failed. Ninja output:" in text
    assert "ninja: build stopped: subcommand failed." in text
    assert "scheduler died during initialization (exit code: -3)" in text
    assert "Received sigquit from a child process" in text
    # the same traceback of TP3 is not repeated in full
    assert text.count("Ninja build failed.") == 1
    assert len(rel) <= 80
    fix = t.diagnosis()["fix"]
    assert "JIT kernel build" in fix and "nvcc" in fix


def test_crash_kv_oom_0_5_9():
    t, events = run("crash-kv-oom-0.5.9.jsonl", "0.5.9")
    names = {e.data["signature"] for e in events if e.kind == "fatal"}
    assert {"scheduler-exception", "not-enough-memory", "sigquit-teardown"} <= names
    assert t.diagnosis()["cause"] == "not-enough-memory"
    assert t.diagnosis()["phase"] == "kv_cache"
    assert t.shard_progress == (25, 25, 100) and t.phase == "loaded"
    assert "--mem-fraction-static" in t.diagnosis()["fix"]
    assert any("Not enough memory" in x for x in t.relevant_lines())


def test_crash_no_nvcc_and_nccl_warning():
    t, events = run("crash-no-nvcc-0.5.12.post1.jsonl", "0.5.12.post1")
    kinds = [(e.kind, e.data.get("signature")) for e in events if e.kind in ("fatal", "warning")]
    # a P2P warning of NCCL is no failure by itself (and not the cause here)
    assert ("warning", "nccl-p2p") in kinds and ("fatal", "no-nvcc") in kinds
    assert t.diagnosis()["cause"] == "no-nvcc"
    rel = t.relevant_lines()
    assert any("Could not find nvcc" in x for x in rel)
    assert any("NCCL WARN" in x for x in rel)
    assert not any("NCCL WARN" in x for x in t.fatal)


def test_relevant_lines_bounded_and_fallback():
    t = L.StartupTracker("0.5.12.post1", True, False)
    for i in range(50):
        t.feed(f"[2026-03-01 12:00:00 TP0] line {i}", float(i))
    assert t.relevant_lines() == [f"[2026-03-01 12:00:00 TP0] line {i}" for i in range(20, 50)]
    t.feed("[2026-03-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent "
           "call last):", 60.0)
    for i in range(500):
        t.feed(f'  File "f{i}.py", line {i}, in g', 60.0)
    t.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 60.0)
    rel = t.relevant_lines(limit=40)
    assert len(rel) <= 40
    assert rel[0].endswith("Traceback (most recent call last):")
    assert rel[-1].startswith("torch.OutOfMemoryError") or any(
        x.startswith("torch.OutOfMemoryError") for x in rel)
    assert any("omitted" in x for x in rel)


def test_port_in_use_is_fatal_with_a_fix():
    t = L.StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=False)
    events = t.feed("ERROR:    [Errno 98] error while attempting to bind on address "
                    "('127.0.0.1', 30000): address already in use", 1.0)
    assert [e.kind for e in events] == ["fatal"]
    fix = t.diagnosis()["fix"]
    assert t.fatal and "sglang_port" in fix and "ss -ltnp" in fix


def test_decode_batch_lines_never_make_a_live_startup_ready_and_a_crash_after_them_is_serving():
    t = L.StartupTracker("0.5.12.post1", expect_autotune=False, cuda_graph=True)
    ts = "2026-03-01 12:00:00"
    lines = [f"[{ts} TP0] Load weight begin. avail mem=94.10 GB",
             f"[{ts} TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=60.0 GB",
             f"[{ts} TP0] Decode batch. #running-req: 1, #token: 40, token usage: 0.00"]
    events = [e for i, line in enumerate(lines) for e in t.feed(line, float(i))]
    assert not t.ready_seen and t.phase == "loaded" and not t.diagnosis()["failed"]
    events += t.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                     9.0)
    d = t.diagnosis()
    assert d["failed"] and d["phase"] == "serving" and d["cause"] == "cuda-oom"
    assert not t.ready_seen and not [e for e in events if e.kind == "violation"]

"""explain-log names the exception that ended a log, whatever the cause (catalogued, the
generic scheduler exception, or none) and whatever the shape of the text: a tail that
starts inside a traceback, rank and journal prefixes, ANSI codes, interleaved ranks,
chained exceptions (the last raised ended it, the first is its root), long messages, and
the parent's report of a dead child (which is no exception of its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_deploy.core.logs.explain import explain, render_text
from sglang_deploy.core.logs.lastexc import ending_exception, short_path

VENV = "/opt/venv/lib/python3.11/site-packages"
REAL = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "real"

# a scheduler raising while serving: the generic cause, then the parent's teardown
SERVING = [
    "[2026-03-01 12:00:00] The server is fired up and ready to roll!",
    "[2026-03-01 12:05:00 TP3] Scheduler hit an exception: Traceback (most recent call last):",
    f'  File "{VENV}/sglang/srt/managers/scheduler.py", line 999, in event_loop_overlap',
    "    batch_result = self.run_batch(batch)",
    f'  File "{VENV}/sglang/srt/layers/sampler.py", line 120, in forward',
    "    assert torch.all(probs >= 0)",
    "IndexError: index 151936 is out of bounds for dimension 0 with size 151936",
    ("[2026-03-01 12:05:00] Received sigquit from a child process. It usually means the child "
    "failed."),
]


def test_a_generic_cause_names_the_exception_that_ended_the_log():
    r = explain(SERVING)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "serving", "scheduler-exception")
    assert r["error"]["type"] == "IndexError" and r["error"]["rank"] == "TP3"
    assert r["error"]["where"] == "sglang/srt/layers/sampler.py:120, in forward"
    assert r["summary"].endswith("(raised in sglang/srt/layers/sampler.py:120, in forward) on "
                                 "TP3")
    assert "IndexError: index 151936" in render_text(r)


def test_a_tail_that_starts_inside_a_traceback():
    tail = SERVING[4:7]     # no header, no prefix: two frame lines and the exception
    r = explain(tail)
    assert r["outcome"] == "failed"
    assert r["error"]["type"] == "IndexError"
    assert r["error"]["where"] == "sglang/srt/layers/sampler.py:120, in forward"
    assert r["error"]["code"] == "assert torch.all(probs >= 0)"


@pytest.mark.parametrize("prefix", [
    "[2026-03-01 12:05:00 TP3] ", "[2026-03-01 12:05:00.123 DP0 TP3 EP3] ", "[rank3]: ",
    "Dec 05 12:05:00 gpu1 python[123]: ", "2026-03-01T12:05:00+0000 gpu1 python3[77]: ",
    "\x1b[36m(SGLangEngine pid=23901)\x1b[0m ", "sglang-1  | ",
])
def test_every_line_behind_a_prefix(prefix):
    lines = [prefix + x for x in ["Traceback (most recent call last):", *SERVING[2:7]]]
    exc = ending_exception(lines)
    assert exc is not None and exc["type"] == "IndexError"
    assert exc["where"] == "sglang/srt/layers/sampler.py:120, in forward"
    assert exc["message"] == "index 151936 is out of bounds for dimension 0 with size 151936"


def test_ansi_codes_around_the_exception():
    exc = ending_exception([("\x1b[31mRuntimeError: CUDA error: device-side assert "
                            "triggered\x1b[0m")])
    assert exc["type"] == "RuntimeError" and exc["message"].startswith("CUDA error: device-side")


def test_interleaved_ranks_keep_their_own_frames():
    lines = ["[rank0]: Traceback (most recent call last):",
             "[rank1]: Traceback (most recent call last):",
             f'[rank0]:   File "{VENV}/sglang/srt/a.py", line 1, in fa',
             f'[rank1]:   File "{VENV}/sglang/srt/b.py", line 2, in fb',
             "[rank1]:     y()",
             "[rank0]:     x()",
             "[rank1]: ValueError: from b",
             "[rank0]: TypeError: from a"]
    exc = ending_exception(lines)
    assert (exc["type"], exc["where"], exc["rank"]) == ("TypeError", "sglang/srt/a.py:1, in fa",
                                                         "rank0")
    assert exc["code"] == "x()"
    assert ending_exception(lines[:-1])["where"] == "sglang/srt/b.py:2, in fb"


@pytest.mark.parametrize("marker", [
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
])
def test_a_chain_ends_on_the_last_raised_and_names_its_root(marker):
    lines = ["Traceback (most recent call last):",
             f'  File "{VENV}/sglang/srt/models/llama.py", line 5, in load_weights',
             "    param = params[name]",
             "KeyError: 'lm_head.weight'", "", marker, "",
             "Traceback (most recent call last):",
             f'  File "{VENV}/sglang/srt/model_loader/loader.py", line 9, in load_model',
             "    raise RuntimeError('weights do not match') from e",
             "RuntimeError: weights do not match"]
    exc = ending_exception(lines)
    assert (exc["type"], exc["where"]) == ("RuntimeError",
                                           "sglang/srt/model_loader/loader.py:9, in load_model")
    assert exc["root"] == {"type": "KeyError", "message": "'lm_head.weight'",
                           "where": "sglang/srt/models/llama.py:5, in load_weights"}
    # a new traceback (no chain marker) starts a new chain: no root
    assert ending_exception(lines[:4] + lines[7:])["root"] is None


def test_a_long_message_is_its_first_line_bounded():
    lines = [f"ValueError: {'x' * 1000}", "  second line of the message"]
    exc = ending_exception(lines)
    assert exc["message"] == "x" * 200


def test_the_parents_report_of_a_dead_child_is_no_exception():
    lines = [*SERVING[1:7],
             ("[2026-03-01 12:05:01] RuntimeError: Rank 0 scheduler is dead. Please check if "
             "there are relevant logs."),
             ("[2026-03-01 12:05:01] Exception: Rank 0 scheduler died during initialization "
             "(exit code: 1)")]
    assert ending_exception(lines)["type"] == "IndexError"
    assert ending_exception(lines[-2:]) is None


def test_warnings_are_no_exception():
    assert ending_exception(["UserWarning: TypedStorage is deprecated"]) is None
    assert ending_exception(["FutureWarning: x", "OSError: [Errno 28] No space left"])[
        "type"] == "OSError"


@pytest.mark.parametrize(("path", "short"), [
    (f"{VENV}/sglang/srt/x.py", "sglang/srt/x.py"),
    ("/sgl-workspace/sglang/python/sglang/srt/x.py", "sglang/srt/x.py"),
    ("/usr/lib/python3.10/multiprocessing/process.py", "multiprocessing/process.py"),
    ("/home/user/work/repo/deep/tool.py", ".../repo/deep/tool.py"),
    ("tool.py", "tool.py"),
])
def test_short_paths(path, short):
    assert short_path(path) == short


def test_a_catalogued_cause_says_where_its_exception_was_raised():
    """The cause's own line quotes the message: only where it was raised is added."""
    r = explain(["[2026-03-01 12:00:00 TP0] Load weight begin. avail mem=94.12 GB",
                 ("[2026-03-01 12:00:05 TP0] Scheduler hit an exception: Traceback (most recent "
                 "call last):"),
                 (f'  File "{VENV}/sglang/srt/model_executor/model_runner.py", line 9, in '
                 "load_model"),
                 "    self.model = get_model()",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."])
    assert r["cause"] == "cuda-oom" and r["error"]["type"] == "torch.OutOfMemoryError"
    assert r["summary"].count("Tried to allocate") == 1
    assert r["summary"].endswith("; ended by torch.OutOfMemoryError (raised in sglang/srt/"
                                 "model_executor/model_runner.py:9, in load_model) on TP0")


def test_no_exception_adds_nothing():
    lines = [("[2026-03-01 12:00:00] Received sigquit from a child process. It usually means "
             "the child failed."), "Killed"]
    r = explain(lines)
    assert r["outcome"] == "failed" and r["error"] is None and "ended by" not in r["summary"]


def test_the_real_tail_that_starts_inside_a_traceback():
    """kvcache-ai/ktransformers#1666 (corpus 079): TP1's exception line first, with no
    header, then TP2's traceback; the log ends on TP2's."""
    text = (REAL / "079-kt-tail-starts-mid-traceback-ranks-not-loaded.log").read_text()
    r = explain(text.splitlines())
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "loading", "ValueError")
    assert (r["error"]["type"], r["error"]["rank"]) == ("ValueError", "TP2")
    assert r["error"]["where"] == "sglang/srt/model_executor/model_runner.py:849, in load_model"
    assert "ended by ValueError: TP rank 2 could finish" in r["summary"]


WRAP = "2025-03-08 02:04:48,693 - __main__ - INFO - "


def test_a_wrapper_that_stamps_every_line_keeps_the_rank_of_the_traceback():
    """A Python logging wrapper (allenai/olmocr#105's shape) stamps each line of a rank's
    traceback with its own time and no rank: the lines still belong to that rank, and
    the parent's own stamped line after it does not."""
    lines = [WRAP + "[2025-03-08 02:04:48 TP0] Scheduler hit an exception: Traceback (most "
             "recent call last):",
             WRAP + f'  File "{VENV}/sglang/srt/models/llama.py", line 5, in load_weights',
             WRAP + "    param = params[name]",
             WRAP + "KeyError: 'lm_head.weight'",
             WRAP + "", WRAP + "The above exception was the direct cause of the following "
             "exception:", WRAP + "",
             WRAP + "Traceback (most recent call last):",
             WRAP + f'  File "{VENV}/sglang/srt/model_loader/loader.py", line 9, in load_model',
             WRAP + "RuntimeError: weights do not match"]
    exc = ending_exception(lines)
    assert (exc["type"], exc["rank"], exc["root"]["type"]) == ("RuntimeError", "TP0",
                                                               "KeyError")
    parent = ending_exception([*lines, "[2025-03-08 02:04:49] ValueError: a parent's own"])
    assert (parent["type"], parent["rank"], parent["where"]) == ("ValueError", None, None)


@pytest.mark.parametrize(("name", "cause", "ended"), [
    # a tail with no traceback header, then the parent's SIGQUIT teardown
    ("001-nccl-unhandled-system-error-init.log", "nccl-p2p",
     ("RuntimeError", ("sglang/srt/distributed/device_communicators/pynccl_wrapper.py:350, in "
      "NCCL_CHECK"), None)),
    # Ray's prefix and `[repeated 2x across cluster]`, cut inside the chained traceback
    ("012-ray-ninja-build-failed-capture.log", "jit-build",
     ("subprocess.CalledProcessError", "subprocess.py:571, in run", "TP1")),
    # the child's exception, then the parent's `Received sigquit`
    ("086-serving-lora-illegal-access-overlap-sigquit.log", "illegal-memory-access",
     ("RuntimeError", "torch/cuda/streams.py:100, in synchronize", "TP0")),
    # a Ray worker's tail that starts inside the traceback
    ("089-ray-workerdict-illegal-access-get-model-worker-batch.log", "illegal-memory-access",
     ("RuntimeError", "sglang/srt/managers/schedule_batch.py:1602, in get_model_worker_batch",
      None)),
    # the parent's `scheduler died` alone: no exception of the child's in the text
    ("025-mi300x-scheduler-died-exit-3.log", "other", None),
    ("079-kt-tail-starts-mid-traceback-ranks-not-loaded.log", "ValueError",
     ("ValueError", "sglang/srt/model_executor/model_runner.py:849, in load_model", "TP2")),
])
def test_real_logs_name_the_exception_that_ended_them(name, cause, ended):
    r = explain((REAL / name).read_text(encoding="utf-8", errors="replace").splitlines())
    assert r["cause"] == cause
    got = r["error"] and (r["error"]["type"], r["error"]["where"], r["error"]["rank"])
    assert got == ended
    if ended is not None and ended[1] is not None:
        assert f"(raised in {ended[1]})" in r["summary"]


def test_the_command_prints_it_and_its_json_carries_it(tmp_path, capsys):
    """`explain-log FILE` on a journal export of a tail (journal prefixes, ANSI colours,
    no traceback header): the cause line names it, `--json`'s error holds it."""
    from sglang_deploy.commands import cli, common

    journal = "Dec 05 12:05:00 gpu1 python3[4242]: "
    lines = [journal + x for x in SERVING[2:7]]
    lines[-1] = lines[-1].replace("IndexError", "\x1b[31mIndexError") + "\x1b[0m"
    path = tmp_path / "sglang.log"
    path.write_text("\n".join(lines) + "\n")
    assert cli.main(["explain-log", str(path)]) == common.EXIT_FAILED
    out = capsys.readouterr().out
    cause = next(x for x in out.splitlines() if x.startswith("cause:"))
    assert "IndexError" in cause and "sampler.py:120, in forward" in cause
    assert cli.main(["explain-log", "--json", str(path)]) == common.EXIT_FAILED
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["type"], error["where"]) == ("IndexError",
                                               "sglang/srt/layers/sampler.py:120, in forward")


@pytest.mark.parametrize("start", range(len(SERVING)))
def test_a_tail_cut_anywhere_before_the_exception_still_names_it(start):
    """Every tail of the log that holds the exception line names it; where it was raised
    whenever the frame above it is in the tail too."""
    tail = SERVING[start:]
    exc = ending_exception(tail)
    if start > 6:
        assert exc is None
        return
    assert exc["type"] == "IndexError"
    assert exc["where"] == ("sglang/srt/layers/sampler.py:120, in forward" if start <= 4
                            else None)
    r = explain(tail)
    assert r["outcome"] == "failed" and r["error"]["type"] == "IndexError"


@pytest.mark.parametrize("line", [
    "Error: No such container: sglang", "Exit code: -9", ("Exception raised from recvBytes at "
    "/pytorch/torch/csrc/distributed/c10d/Utils.hpp:679 (most recent call first):"),
    "[2026-03-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
])
def test_lines_that_are_no_exception(line):
    assert ending_exception([line]) is None

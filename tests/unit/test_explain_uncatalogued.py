"""explain-log names an error nobody catalogued: when no known cause matches a failed start,
the cause is the first exception itself as the log prints it (type and message), with
where it was raised (the innermost frame and its code line) and the rank that raised it."""

from __future__ import annotations

from sglang_deploy.core.logs.explain import explain, render_text

TS = "2026-03-01 12:00:05"
VENV = "/opt/venv/lib/python3.11/site-packages"

# a chained traceback of a scheduler while the weights load: the KeyError is the first error
CHAINED = [
    "[2026-03-01 12:00:00 TP0] Load weight begin. avail mem=94.12 GB",
    f"[{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):",
    f'  File "{VENV}/sglang/srt/managers/scheduler.py", line 3118, in run_scheduler_process',
    "    scheduler = Scheduler(",
    "                ^^^^^^^^^^",
    f'  File "{VENV}/sglang/srt/model_executor/model_runner.py", line 812, in load_model',
    "    self.model = get_model(",
    "                 ^^^^^^^^^^",
    f'  File "{VENV}/sglang/srt/models/glm4_moe.py", line 1423, in load_weights',
    "    param = params_dict[name]",
    "            ~~~~~~~~~~~^^^^^^",
    "KeyError: 'model.layers.78.mlp.experts.w13_weight_scale_2'",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    f'  File "{VENV}/sglang/srt/managers/scheduler.py", line 3130, in run_scheduler_process',
    "    raise RuntimeError(f\"init failed: {e}\") from e",
    "RuntimeError: init failed: 'model.layers.78.mlp.experts.w13_weight_scale_2'",
    "",
    f"[{TS}] Received sigquit from a child process. It usually means the child failed.",
]

# torch's per-rank prefix, a bare assert while the process groups are set up
RANK_ASSERT = [
    "[rank3]: Traceback (most recent call last):",
    (f'[rank3]:   File "{VENV}/sglang/srt/model_executor/model_runner.py", line 402, in '
    "init_torch_distributed"),
    "[rank3]:     initialize_model_parallel(",
    (f'[rank3]:   File "{VENV}/sglang/srt/distributed/parallel_state.py", line 1310, in '
    "initialize_model_parallel"),
    "[rank3]:     assert num_experts % expert_model_parallel_size == 0",
    "[rank3]: AssertionError",
]


def test_the_first_exception_of_a_chained_traceback_is_the_cause():
    r = explain(CHAINED)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "loading", "KeyError")
    assert r["summary"] == ("'model.layers.78.mlp.experts.w13_weight_scale_2' (raised in "
                            "sglang/srt/models/glm4_moe.py:1423, in load_weights) on TP0; "
                            "ended by RuntimeError: init failed: 'model.layers.78.mlp.experts."
                            "w13_weight_scale_2' (raised in sglang/srt/managers/scheduler.py:"
                            "3130, in run_scheduler_process) on TP0")
    # `error` is the exception that ended the log; the cause, its root
    assert r["error"]["type"] == "RuntimeError" and r["error"]["rank"] == "TP0"
    assert r["error"]["root"] == {"type": "KeyError",
                                  "message": "'model.layers.78.mlp.experts.w13_weight_scale_2'",
                                  "where": "sglang/srt/models/glm4_moe.py:1423, in load_weights"}
    assert r["relevant_lines"][0] == "KeyError: 'model.layers.78.mlp.experts.w13_weight_scale_2'"
    assert "no catalogued cause" in r["fix"] and "glm4_moe.py:1423" in r["fix"]
    text = render_text(r)
    assert ("cause:       KeyError: 'model.layers.78.mlp.experts.w13_weight_scale_2' (raised in "
            "sglang/srt/models/glm4_moe.py:1423, in load_weights) on TP0") in text


def test_a_bare_assert_of_a_rank_shows_its_code_line():
    r = explain(RANK_ASSERT)
    assert (r["outcome"], r["phase"], r["cause"]) == ("failed", "starting", "AssertionError")
    assert r["summary"] == (
        "(no message) (raised in sglang/srt/distributed/parallel_state.py:1310, in "
        "initialize_model_parallel: `assert num_experts % expert_model_parallel_size == 0`) "
        "on rank3")


def test_warnings_and_the_teardowns_own_message_are_not_the_cause():
    lines = ([(f"[{TS} TP1] UserWarning: TypedStorage is deprecated. It will be removed in the "
              "future and UntypedStorage will be the only storage class.")]
             + [x.replace("TP0", "TP1") for x in CHAINED[1:12]]
             + [(f"[{TS}] RuntimeError: Rank 1 scheduler died during initialization (exit code: "
                "1)")])
    r = explain(lines)
    assert r["cause"] == "KeyError" and r["error"]["rank"] == "TP1"
    assert r["error"]["type"] == "KeyError" and r["error"]["code"] == "param = params_dict[name]"


def test_the_teardown_alone_stays_other():
    r = explain([(f"[{TS}] RuntimeError: Rank 0 scheduler died during initialization (exit "
                 "code: -3).")])
    assert r["cause"] == "other" and r["error"] is None


def test_a_known_cause_keeps_its_name():
    lines = CHAINED[:9] + [("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                           "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB")]
    r = explain(lines)
    assert r["cause"] == "cuda-oom" and r["error"]["type"] == "torch.OutOfMemoryError"
    # its message is in the summary already: only where it was raised is added
    assert r["summary"].endswith("; ended by torch.OutOfMemoryError (raised in "
                                 "sglang/srt/models/glm4_moe.py:1423, in load_weights) on TP0")


def test_an_unknown_exception_while_serving_stays_a_scheduler_exception():
    lines = [f"[{TS}] The server is fired up and ready to roll!",
             f"[{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):",
             f'  File "{VENV}/sglang/srt/managers/scheduler.py", line 999, in event_loop_overlap',
             "    batch_result = self.run_batch(batch)",
             "ValueError: too many values to unpack (expected 2)"]
    r = explain(lines)
    assert (r["phase"], r["cause"]) == ("serving", "scheduler-exception")
    assert r["error"]["type"] == "ValueError"
    assert r["error"]["where"] == "sglang/srt/managers/scheduler.py:999, in event_loop_overlap"
    assert "too many values to unpack" in r["summary"]


def test_the_live_verifier_names_it_too():
    """The deploy's verifier reads the journal with the same tracker: its failure names the
    exception, not a generic cause."""
    from sglang_deploy.core.logs.parse import StartupTracker

    tracker = StartupTracker("0.5.12.post1", expect_autotune=True, cuda_graph=True)
    for n, line in enumerate(CHAINED):
        tracker.feed(line, float(n))
    d = tracker.diagnosis()
    assert d["failed"] and d["cause"] == "KeyError" and d["phase"] == "loading"
    assert "glm4_moe.py:1423, in load_weights" in d["summary"]

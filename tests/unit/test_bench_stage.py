"""bench/stage.py's figures from the rollouts' reports (no testbed): installs saved, the
phases, the same pair on the shared cores in the notes."""

from __future__ import annotations

from bench import stage


def case(total: float, step: float, out: float, stage_s: float | None = None) -> dict:
    hosts = [{"seconds": step, "out_of_router_s": out, "stage_seconds": stage_s}] * 3
    return {"doc": {"seconds": total, "hosts": hosts},
            "load": {"during": {"failed": 0, "requests": 100}}}


def a_run() -> dict:
    return {"config": case(30, 3, 8), "nostage": case(100, 28, 33),
            "staged": case(45, 4, 9, stage_s=16), "nostage_shared": case(38, 6.6, 12),
            "staged_shared": case(35, 3.3, 9, stage_s=7)}


def test_installs_saved_and_the_phases():
    figs = {f.key: f for f in stage.figures([a_run(), a_run()])}
    assert figs["stage_saved"].samples == [55 / 24] * 2  # (100 - 45) / (28 - 4)
    assert "saved 0.91, 0.91 installs" in figs["stage_saved"].notes  # (38 - 35) / 3.3
    assert "the staging run 16.0 s" in figs["stage_total"].notes
    assert "4.0 s staged, of which 0.0 s (its start" in figs["stage_total"].notes
    assert "28.0 s with --no-stage" in figs["stage_total"].notes
    assert figs["stage_out"].samples == [9] * 6 and figs["stage_failed"].samples == [0, 0]


def test_without_the_shared_pair_the_notes_say_nothing_of_it():
    run = a_run()
    del run["staged_shared"], run["nostage_shared"]
    figs = {f.key: f for f in stage.figures([run])}
    assert "without the limit" not in figs["stage_saved"].notes


def test_the_steps_done_while_draining_are_told_apart_from_the_installs():
    run = a_run()
    run["staged"]["doc"]["hosts"] = [dict(h, prepared_while_draining_s=1.25)
                                     for h in run["staged"]["doc"]["hosts"]]
    figs = {f.key: f for f in stage.figures([run])}
    assert "of which 1.2 s (its start, connection and host reads) while it drained" \
        in figs["stage_total"].notes
    assert "done while their hosts drained (--no-stage keeps today's order: drain, then the " \
        "run): 3.8 s" in figs["stage_saved"].notes


def test_a_model_revision_is_timed_against_the_config_only_change_with_the_cold_one_beside():
    run = {**a_run(), "revision": case(40, 4, 9.5), "revision_cold": case(44, 5, 11.5)}
    run["revision_cold"]["load"] = {"during": {"failed": 2, "requests": 90}}
    fig = {f.key: f for f in stage.figures([run])}["stage_revision_out"]
    assert fig.samples == [9.5] * 3 and fig.baseline_samples == [8] * 3
    assert fig.goal_value == 1.2 and fig.goal_kind == "ratio_max"
    assert "warm off (`sglang_model_warm: false`): 11.5 s, 11.5 s, 11.5 s" in fig.notes
    assert "failed requests during both: 2 of 190" in fig.notes
    # runs without the revision rollouts (older results) give no such figure
    assert "stage_revision_out" not in {f.key for f in stage.figures([a_run()])}

"""The watchdog's judgement (core/watchdog.py): wedge, slow-but-progressing, the cap and the
never-act conditions."""

from __future__ import annotations

import pytest

from sglang_deploy.core import watchdog as wd

CFG = wd.Config(mode="restart", probe_failures=3, stall_s=60, journal_silence_s=60,
                max_restarts_per_hour=2)


def run(observations, cfg=CFG, state=None):
    state = state or wd.State()
    verdicts = []
    for obs in observations:
        state, v = wd.judge(state, obs, cfg)
        verdicts.append(v)
    return state, verdicts


def failing(t, busy=4, tokens=100.0, journal_at=None, inv="a"):
    return wd.Observation(at=t, http_up=True, probe_ok=False, probe_error="timed out", busy=busy,
                          tokens=tokens, journal_at=journal_at, invocation=inv)


def test_a_healthy_server_is_healthy():
    obs = [wd.Observation(at=t, http_up=True, probe_ok=True, busy=3, tokens=10.0 * t, invocation="a")
           for t in range(1, 6)]
    _, vs = run(obs)
    assert [v.kind for v in vs] == ["healthy"] * 5


def test_probe_failures_in_a_row_with_a_flat_counter_are_a_wedge():
    _, vs = run([failing(t) for t in (10, 25, 40)])
    assert [v.kind for v in vs] == ["suspect", "suspect", "wedged"]
    assert any("failed 3 time(s)" in e for e in vs[-1].evidence)


def test_one_failure_is_enough_when_the_server_was_stalled():
    ok = wd.Observation(at=0, http_up=True, probe_ok=True, busy=4, tokens=100.0, invocation="a")
    _, vs = run([ok, failing(70)])
    assert vs[-1].wedged
    assert any("stayed at 100 for 70s" in e for e in vs[-1].evidence)


def test_slow_but_progressing_is_never_a_wedge():
    # every probe misses its deadline, but requests keep finishing (the counter rises)
    obs = [failing(t, tokens=100.0 + t) for t in range(0, 1000, 15)]
    _, vs = run(obs)
    assert not any(v.wedged for v in vs)
    assert {v.kind for v in vs[1:]} == {"slow"}


def test_progress_between_failures_resets_the_streak():
    obs = [failing(10), failing(20), failing(30, tokens=101.0), failing(40, tokens=101.0),
           failing(50, tokens=101.0)]
    _, vs = run(obs)
    assert [v.kind for v in vs] == ["suspect", "suspect", "slow", "suspect", "suspect"]


def test_an_idle_server_whose_probe_fails_is_judged_by_the_streak_alone():
    obs = [failing(t, busy=0) for t in (0, 100, 200)]
    _, vs = run(obs)
    assert [v.kind for v in vs] == ["suspect", "suspect", "wedged"]


def test_without_metrics_a_silent_journal_while_requests_wait_counts_as_stalled():
    ok = wd.Observation(at=0, http_up=True, probe_ok=True, busy=2, invocation="a")
    silent = failing(100, busy=2, tokens=None, journal_at=10)
    _, vs = run([ok, silent])
    assert vs[-1].wedged
    assert any("journal silent for 90s while 2 request(s) wait" in e for e in vs[-1].evidence)


def test_a_server_that_does_not_answer_http_is_down_not_wedged():
    down = wd.Observation(at=5, http_up=False, probe_error="ConnectionRefusedError")
    _, vs = run([failing(0), failing(1), down, failing(2)])
    assert [v.kind for v in vs] == ["suspect", "suspect", "down", "suspect"]


def test_a_new_invocation_starts_a_fresh_judgement():
    state, _ = run([failing(0), failing(1)])
    state, v = wd.judge(state, failing(2, inv="b"), CFG)
    assert v.kind == "suspect" and state.fail_streak == 1 and state.invocation == "b"


def test_state_round_trips_through_json():
    state, _ = run([failing(0), failing(1)])
    assert wd.State.from_dict(state.to_dict()) == state


WEDGE = wd.Verdict("wedged", ("x",))


@pytest.mark.parametrize("ctx, words", [
    (wd.Context(lock_busy=True, lock_owner="me@laptop `pyinfra deploy`"), "deploy lock is held"),
    (wd.Context(verified=False), "never verified"),
    (wd.Context(group_nodes=2), "rank 0 of a 2-node group: a group restarts as one"),
    (wd.Context(gpu_fatal="GPU 3: uncorrectable ECC"), "GPU is judged fatal"),
    (wd.Context(restarts=(1000.0, 2000.0)), "restart cap reached"),
])
def test_never_act_conditions_report_instead(ctx, words):
    a = wd.decide(WEDGE, CFG, ctx, now=3000.0)
    assert a.kind == "report" and words in a.reason


def test_a_group_is_never_restarted_by_its_watchdog_whatever_else_holds():
    """Rank 0's watchdog judges the group's server but never restarts it: the group's reason
    comes first (not "never verified" or the cap, which a restart from the controller would
    not cure either way)."""
    for ctx in (wd.Context(group_nodes=3), wd.Context(group_nodes=2, verified=False),
                wd.Context(group_nodes=2, restarts=(2500.0, 2600.0))):
        a = wd.decide(WEDGE, CFG, ctx, now=3000.0)
        assert a.kind == "report" and "group restarts as one" in a.reason, (ctx, a)
    assert wd.decide(wd.Verdict("slow"), CFG, wd.Context(group_nodes=2), 0).kind == "none"


def test_a_wedge_is_restarted_when_nothing_forbids_it():
    assert wd.decide(WEDGE, CFG, wd.Context(restarts=(0.0,)), now=3000.0).kind == "restart"


def test_report_mode_and_off_never_restart():
    assert wd.decide(WEDGE, wd.Config(mode="report"), wd.Context(), 0).kind == "report"
    assert wd.decide(WEDGE, wd.Config(mode="off"), wd.Context(), 0).kind == "none"
    assert wd.decide(wd.Verdict("slow"), CFG, wd.Context(), 0).kind == "none"


def test_the_cap_counts_only_the_last_hour():
    assert wd.capped((0.0, 100.0), now=3000.0, per_hour=2)
    assert not wd.capped((0.0, 100.0), now=3650.0, per_hour=2)
    assert not wd.capped((), now=0.0, per_hour=1)
    assert wd.capped((), now=0.0, per_hour=0)


def test_config_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="expected one of off, report, restart"):
        wd.Config.from_dict({"mode": "reboot"})


def test_metrics_parsing_uses_the_real_series_names():
    text = ('# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\n'
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'
            'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
            'sglang:generation_tokens_total{model_name="m"} 1234.0\n'
            'sglang:generation_tokens_created{model_name="m"} 1.7e9\n')
    assert wd.from_metrics(wd.parse_metrics(text)) == (5, 1234.0)
    assert wd.from_metrics({}) == (None, None)


def test_loads_parsing():
    assert wd.from_loads({"aggregate": {"total_running_reqs": 2, "total_waiting_reqs": 5}}) == 7
    assert wd.from_loads({"loads": [{"num_running_reqs": 1, "num_waiting_reqs": 1}]}) == 2
    assert wd.from_loads({}) is None


def test_summary_line_names_the_last_event_and_the_restarts():
    ev = [{"at": 100.0, "at_iso": "t1", "verdict": "wedged", "action": "restart", "outcome": "ok",
           "evidence": ["probe failed"]},
          {"at": 200.0, "at_iso": "t2", "verdict": "wedged", "action": "report",
           "reason": "restart cap reached", "evidence": []}]
    line = wd.summary_line("h1", ev, now=300.0)
    assert "h1: wedged -> report (restart cap reached) at t2" in line
    assert "1 restart(s) in the last hour" in line
    assert wd.summary_line("h1", [], 0) is None

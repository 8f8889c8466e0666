"""The load test's arithmetic (bench/router_load.py) and its figures (bench/router.py)."""

import pytest

from bench import router_load as rl
from bench.router import figures


@pytest.mark.parametrize("values, q, want", [
    ([1.0], 0.99, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
    ([float(i) for i in range(1, 101)], 0.99, 99.0),
    ([float(i) for i in range(1, 11)], 0.99, 10.0),
])
def test_percentile_nearest_rank(values, q, want):
    assert rl.percentile(values, q) == want


def test_summary_counts_failures_per_phase_and_latency_of_the_successes():
    res = rl.LoadResult([rl.Sample(0, "before", False, 1.0, True), rl.Sample(0, "during", True, 9.0, False, "boom"),
                         rl.Sample(0, "during", False, 2.0, True), rl.Sample(0, "during", True, 4.0, True)])
    s = res.summary()
    assert s["before"] == {"requests": 1, "failed": 0, "p50_s": 1.0, "p99_s": 1.0}
    assert s["during"] == {"requests": 3, "failed": 1, "p50_s": 3.0, "p99_s": 4.0}
    assert s["errors"] == ["boom"]


def test_metric_sum_adds_every_label_set_of_one_metric_only():
    text = ("# HELP smg_router_upstream_send_retries_total x\n"
            "smg_router_upstream_send_retries_total{router_type=\"http\"} 21\n"
            "smg_router_upstream_send_retries_total{router_type=\"grpc\"} 2\n"
            "smg_router_upstream_send_retries_total_other 100\n")
    assert rl.metric_sum(text, "smg_router_upstream_send_retries_total") == 23.0
    assert rl.metric_sum(text, "absent") == 0.0


def test_figures_of_a_load_test():
    summ = {"before": {"requests": 50, "failed": 0, "p50_s": 0.8, "p99_s": 1.6},
            "during": {"requests": 700, "failed": 0, "p50_s": 1.8, "p99_s": 5.0},
            "errors": [], "router_retries": 0}
    off = {**summ, "router_retries": 21}
    hosts = {"h1": {"status": "done", "seconds": 5.0}, "h2": {"status": "done", "seconds": 6.0}}
    slow = {"h1": {"status": "done", "seconds": 30.0}, "h2": {"status": "done", "seconds": 20.0}}
    figs = {f.key: f for f in figures({"drain": {"summary": summ, "hosts": hosts},
                                       "no-drain": {"summary": off, "hosts": slow},
                                       "failed-host-rolled-back": {"summary": summ}})}
    assert figs["router_failed"].samples == [0] and figs["router_failed"].met is True
    assert figs["router_retries"].baseline_samples == [21]
    assert figs["router_p99"].samples == [5.0] and figs["router_p99"].baseline_samples == [1.6]
    assert figs["router_failed_rollback"].met is True
    assert figs["router_step"].samples == [5.0, 6.0] and figs["router_step"].baseline_samples == [30.0, 20.0]

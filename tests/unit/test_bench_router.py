"""bench/router.py: the drain figures from the load test's results (no testbed)."""

from bench import router


def _run(drain_s, out_s, ended, readd, failed=0):
    hosts = {f"h{i}": {"status": "done", "router": "back", "seconds": 3.0, "drain_s": d,
                       "out_of_router_s": o, "drain_router": ended, "readd_wait_s": readd}
             for i, (d, o) in enumerate(zip(drain_s, out_s, strict=True))}
    summary = {"before": {"requests": 10, "failed": 0, "p50_s": 1, "p99_s": 2},
               "during": {"requests": 40, "failed": failed, "p50_s": 1, "p99_s": 2},
               "errors": [], "router_retries": 0}
    return {"summary": summary, "rollout_rc": 0, "hosts": hosts}


def test_the_drain_is_measured_against_the_one_that_waits_for_the_settle_in_the_same_run():
    doc = {"drain": _run([0.4, 0.6, 0.5], [7.0, 7.2, 7.1], "draining", 2.5),
           "drain-removed": _run([5.1, 5.2, 5.3], [8.1, 8.2, 8.3], "removed", None, failed=0)}
    figs = {f.key: f for f in router.figures(doc)}
    drain = figs["router_drain"]
    assert drain.median == 0.5 and drain.baseline_median == 5.2 and drain.met is True
    assert "draining, draining, draining" in drain.notes
    out = figs["router_out"]
    assert out.median == 7.1 and out.baseline_median == 8.2 and "2.5 s" in out.notes
    assert "failed requests during the baseline's rollout: 0 of 40" in drain.notes


def test_without_the_baseline_run_there_is_no_drain_figure():
    figs = {f.key for f in router.figures({"drain": _run([0.4], [7.0], "draining", 2.5)})}
    assert not figs & {"router_drain", "router_out"}

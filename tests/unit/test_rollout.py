"""Rollout planning, verdicts and plan/status records (pure parts)."""

import json

import pytest

from sglang_deploy.shell import plan
from sglang_deploy.commands import rollout
from sglang_deploy.commands import status
from sglang_deploy.commands import common
from sglang_deploy.core.errors import UsageError
from sglang_deploy.commands.rollout import HostResult, batches, outcome, plan_order

HOSTS = ["a", "b", "c", "d"]


def test_order_is_the_inventory_order_with_the_canary_first():
    assert plan_order(HOSTS) == HOSTS
    assert plan_order(HOSTS, canary="c") == ["c", "a", "b", "d"]
    assert plan_order(HOSTS, canary="c", limit=["d", "c"]) == ["c", "d"]


def test_unknown_or_excluded_hosts_are_refused_before_anything_runs():
    with pytest.raises(UsageError, match="not in the inventory: x"):
        plan_order(HOSTS, canary="x")
    with pytest.raises(UsageError, match="excluded"):
        plan_order(HOSTS, canary="a", limit=["b"])


def test_batches_keep_the_canary_alone():
    assert batches(["c", "a", "b", "d"], 2, canary="c") == [["c"], ["a", "b"], ["d"]]
    assert batches(HOSTS, 3) == [["a", "b", "c"], ["d"]]
    with pytest.raises(UsageError):
        batches(HOSTS, 0)


def test_outcome_names_the_halting_host_and_shouts_about_failed_rollbacks():
    ok, text = outcome([HostResult("a", "done"), HostResult("b", "converged")])
    assert ok and "2 host(s) verified" in text
    ok, text = outcome([HostResult("a", "done"), HostResult("b", "rolled-back"), HostResult("c")])
    assert not ok and "halted at b" in text and "1 host(s) untouched" in text
    ok, text = outcome([HostResult("a", "rollback-failed"), HostResult("b")])
    assert not ok and text.startswith("ROLLBACK FAILED on a")


def test_error_excerpt_prefers_the_tool_error_block():
    out = "noise\n--> pyinfra error in x.py: verification failed\n  found: boom\n  fix: do\nmore"
    assert common.host_error(out).startswith("--> pyinfra error")
    assert common.host_error("a\nb") == "a\nb"


def test_status_fields_from_host_state_and_one_poll():
    hs = {"current": "r1", "monotonic_now": 1000.0,
          "releases": {"r1": {"sglang_version": "0.5.12.post1", "patch": {"state": "applied"}}},
          "last_verified": {"verified_at": "2026-12-02T10:00:00+00:00"}}
    serving = {"service": {"ActiveState": "active", "SubState": "running",
                           "ActiveEnterTimestampMonotonic": "400000000"},
               "health": {"status": 200},
               "models": {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}}
    f = plan.status_fields(hs, serving, "r2")
    assert f == {"unit": "active/running", "uptime_s": 600, "release": "r1", "release_wanted": "r2",
                 "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200,
                 "models": ["glm-5"], "last_verified": "2026-12-02T10:00:00+00:00"}
    down = plan.status_fields(hs, {"service": {"ActiveState": "failed", "SubState": "failed"},
                                   "health": {"status": None}}, "r1")
    assert down["unit"] == "failed/failed" and down["uptime_s"] is None and down["health"] is None


def test_status_rows_report_drift_unreachable_and_failed_preflight(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"host": "a", "preflight": "pass", "changes": [],
                                                 "health": 200, "unit": "active/running"}))
    (tmp_path / "b.json").write_text(json.dumps({"host": "b", "preflight": "pass",
                                                 "changes": ["Unit /etc/systemd/system/sglang.service"],
                                                 "health": 200, "unit": "active/running"}))
    (tmp_path / "c.json").write_text(json.dumps({"host": "c", "preflight": "fail", "changes": None,
                                                 "failed": [{"name": "cuda-probe", "message": "cuInit 999", "fix": "x"}]}))
    output = "    [d] Could not connect (timed out)\n"
    rows = {r["host"]: r for r in status.rows_from_plans(["a", "b", "c", "d"], tmp_path, output)}
    assert rows["a"]["in_sync"] is True and rows["a"]["healthy"] is True
    assert rows["b"]["in_sync"] is False and rows["b"]["changes"] == ["Unit /etc/systemd/system/sglang.service"]
    assert rows["c"]["healthy"] is False and "cuInit 999" in rows["c"]["problem"]
    assert rows["d"]["reachable"] is False and "Could not connect" in rows["d"]["problem"]


def test_error_excerpt_finds_the_verify_error_before_pyinfras_last_words():
    out = ("sglang_deploy.core.errors.VerifyError: verification failed: expected the server serves\n"
           "  found:    the server exited in phase `autotune` (status 2/9)\n"
           "  fix:      read the journal\n\n"
           "    [tb2] Unexpected error in Python callback: VerifyError('x',)\n"
           "--> pyinfra error: No hosts remaining!\n")
    text = common.host_error(out, "tb2")
    assert text.startswith("VerifyError: verification failed") and "phase `autotune`" in text
    assert "No hosts remaining" not in text


def test_release_pruning_keeps_the_newest_and_never_a_protected_one():
    from sglang_deploy.shell.releaseops import releases_to_prune

    rel = {"a": {"installed_at": "2026-01-01"}, "b": {"installed_at": "2026-02-01"},
           "c": {"installed_at": "2026-03-01"}, "d": {"installed_at": "2026-04-01"},
           "old": {}}  # unknown age: never deleted
    assert releases_to_prune(rel, keep=3, protected={"d"}) == ["a", "b"]
    assert releases_to_prune(rel, keep=3, protected={"a", "d"}) == ["b", "c"]
    assert releases_to_prune(rel, keep=5, protected=set()) == []


def test_unreachable_hosts_are_named_from_pyinfras_output():
    out = ("    [tb1] Connected\n"
           "    [tb3] Could not connect ([Errno None] Unable to connect to port 22 on 10.213.0.13)\n"
           "--> pyinfra error: Over 0% of hosts failed (33%)\n")
    assert rollout.unreachable(out) == ["tb3"]

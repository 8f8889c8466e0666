"""Rollout planning, verdicts, its decisions from the outcome records, and plan/status records
(pure parts)."""

import json
import time

import pytest

from sglang_deploy.commands import common, rollout, status
from sglang_deploy.commands.progress import HostProgress
from sglang_deploy.commands.rollout import HostResult, batches, plan_order
from sglang_deploy.core import outcome
from sglang_deploy.core.errors import (
    DataError,
    RollbackError,
    RolloutError,
    RouterError,
    RuntimeSetupError,
    UsageError,
    VerifyError,
)
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.service import NO_KNOWN_GOOD
from sglang_deploy.integration import plan

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
    verdict = rollout.outcome
    ok, text = verdict([HostResult("a", "done"), HostResult("b", "converged")])
    assert ok and "2 host(s) verified" in text
    ok, text = verdict([HostResult("a", "done"), HostResult("b", "rolled-back"), HostResult("c")])
    assert not ok and "halted at b" in text and "1 host(s) untouched" in text
    ok, text = verdict([HostResult("a", "rollback-failed"), HostResult("b")])
    assert not ok and text.startswith("ROLLBACK FAILED on a")


def test_error_excerpt_prefers_the_tool_error_block():
    out = "noise\n--> pyinfra error in x.py: verification failed\n  found: boom\n  fix: do\nmore"
    assert common.host_error(out).startswith("--> pyinfra error")
    assert common.host_error("a\nb") == "a\nb"


def test_status_fields_from_host_state_and_one_poll():
    hs = HostState.from_json({
        "current": "r1", "monotonic_now": 1000.0,
        "releases": {"r1": {"sglang_version": "0.5.12.post1", "patch": {"state": "applied"}}},
        "last_verified": {"verified_at": "2026-12-02T10:00:00+00:00"}})
    serving = {"service": {"ActiveState": "active", "SubState": "running",
                           "ActiveEnterTimestampMonotonic": "400000000"},
               "health": {"status": 200},
               "models": {"status": 200, "body": json.dumps({"data": [{"id": "glm-5"}]})}}
    f = plan.status_fields(hs, serving, "r2")
    assert f == {"unit": "active/running", "uptime_s": 600, "release": "r1", "release_wanted": "r2",
                 "sglang_version": "0.5.12.post1", "patch_state": "applied", "health": 200,
                 "models": ["glm-5"], "last_verified": "2026-12-02T10:00:00+00:00",
                 "hardening": None,  # no release smoke ran under the sandbox there yet
                 "model_memory": None,  # no model folder in the read
                 "last_restart": None,  # no restart recorded by the verifier
                 "watchdog": None}  # no watchdog read
    down = plan.status_fields(hs, {"service": {"ActiveState": "failed", "SubState": "failed"},
                                   "health": {"status": None}}, "r1")
    assert down["unit"] == "failed/failed" and down["uptime_s"] is None and down["health"] is None


def test_status_rows_report_drift_unreachable_and_failed_preflight():
    from sglang_deploy.core.journal import Journal

    ran = Journal({
        "a": {"plan": {"host": "a", "preflight": "pass", "changes": [], "health": 200,
                       "unit": "active/running"}},
        "b": {"plan": {"host": "b", "preflight": "pass", "health": 200, "unit": "active/running",
                       "changes": ["Unit /etc/systemd/system/sglang.service"]}},
        "c": {"plan": {"host": "c", "preflight": "fail", "changes": None,
                       "failed": [{"name": "cuda-probe", "message": "cuInit 999", "fix": "x"}]}},
        "d": {"outcome": outcome.record("d", "unreachable", "connect", error=outcome.unreachable_error(
            "Could not connect (timed out)"))},
        "e": {"outcome": outcome.record("e", "failed", "preflight", error=outcome.error_of(
            RuntimeSetupError(what="the host-state read to print JSON", found="not found")))}})
    rows = {r["host"]: r for r in status.rows_from_plans(["a", "b", "c", "d", "e", "f"], ran,
                                                         fallback="--> pyinfra error: boom")}
    assert rows["a"]["in_sync"] is True and rows["a"]["healthy"] is True
    assert rows["b"]["in_sync"] is False and rows["b"]["changes"] == ["Unit /etc/systemd/system/sglang.service"]
    assert rows["c"]["healthy"] is False and "cuInit 999" in rows["c"]["problem"]
    assert rows["d"]["reachable"] is False and rows["d"]["problem"] == "Could not connect (timed out)"
    assert rows["e"]["reachable"] is None and rows["e"]["healthy"] is False
    assert rows["e"]["problem"].startswith("runtime setup failed: expected the host-state read")
    assert rows["f"]["reachable"] is None and rows["f"]["problem"].startswith("no outcome record")
    assert rows["f"]["problem"].endswith("\n--> pyinfra error: boom")  # pyinfra's words, shown only


def test_error_excerpt_finds_the_verify_error_before_pyinfras_last_words():
    out = ("sglang_deploy.core.errors.VerifyError: verification failed: expected the server serves\n"
           "  found:    the server exited in phase `autotune` (status 2/9)\n"
           "  fix:      read the journal\n\n"
           "    [tb2] Unexpected error in Python callback: VerifyError('x',)\n"
           "--> pyinfra error: No hosts remaining!\n")
    text = common.host_error(out)
    assert text.startswith("VerifyError: verification failed") and "phase `autotune`" in text
    assert "No hosts remaining" not in text


def test_release_pruning_keeps_the_newest_and_never_a_protected_one():
    from sglang_deploy.hostops.releaseops import releases_to_prune

    rel = {"a": {"installed_at": "2026-01-01"}, "b": {"installed_at": "2026-02-01"},
           "c": {"installed_at": "2026-03-01"}, "d": {"installed_at": "2026-04-01"},
           "old": {}}  # unknown age: never deleted
    assert releases_to_prune(rel, keep=3, protected={"d"}) == ["a", "b"]
    assert releases_to_prune(rel, keep=3, protected={"a", "d"}) == ["b", "c"]
    assert releases_to_prune(rel, keep=5, protected=set()) == []



# ------------------------------------------------------------------ decisions from the records

def rec(host, kind, stage="verify", **kw):
    return outcome.decide(host, outcome.record(host, kind, stage, **kw))


VERIFIED = {"release": "r2", "sglang_version": "0.5.12.post1", "time_to_ready_s": 40.0}


def test_the_reachability_check_passes_only_hosts_whose_run_passed():
    got = {"a": rec("a", "passed", "connect"),
           "b": rec("b", "unreachable", "connect", error=outcome.unreachable_error("timed out")),
           "c": rec("c", "failed", "data", error=outcome.error_of(DataError(key="k", what="x"))),
           "d": rec("d", "interrupted", "connect"), "e": outcome.decide("e", None)}
    assert rollout.answered(got) == ["b", "c", "d", "e"]
    assert rollout.failure_text(got["b"]) == "did not answer over SSH: timed out"


def test_a_deployed_host_is_done_or_converged_only_when_verified_in_this_run():
    assert rollout.after_deploy(rec("a", "passed", action="restarted", summary=VERIFIED)) == (
        "done", "restarted; sglang 0.5.12.post1 release r2", 40.0)
    status, message, _ = rollout.after_deploy(rec("a", "passed", action="converged", summary=VERIFIED))
    assert status == "converged" and message.startswith("converged;")
    assert rollout.after_deploy(rec("a", "passed", "router", action="unchanged"))[0] == "failed"


def test_a_failed_deploy_carries_the_hosts_own_error():
    err = outcome.error_of(VerifyError(what="the server to serve", found="exited in phase `autotune`"))
    status, message, ready = rollout.after_deploy(rec("b", "failed", phase="execute", error=err))
    assert (status, ready) == ("failed", None)
    assert message.startswith("verification failed: expected the server to serve") and "autotune" in message
    status, message, _ = rollout.after_deploy(rec("c", "interrupted", "service",
                                                   note="the run stopped when b failed"))
    assert status == "failed" and message.startswith("no result: the run stopped when b failed")
    assert rollout.after_deploy(outcome.decide("d", None))[0] == "failed"


def test_a_rollback_is_judged_by_its_record():
    assert rollout.after_rollback(rec("b", "passed", action="rolled-back", summary={"release": "r1"})) == (
        "rolled-back", "rolled back to release r1, restarted and verified serving")
    status, line = rollout.after_rollback(rec("b", "passed", action="unchanged", summary={"release": "r1"}))
    assert status == "failed" and line.startswith("still on its known-good release r1")
    assert rollout.verified_after_rollback(HostResult("b", status, rollback="unchanged"))
    assert not rollout.verified_after_rollback(HostResult("b", "failed"))
    never = RollbackError(what="a known-good configuration", found="none",
                          details={"reason": NO_KNOWN_GOOD})
    status, line = rollout.after_rollback(rec("b", "failed", "rollback", error=outcome.error_of(never)))
    assert status == "failed" and line.startswith("nothing to roll back to")
    broken = RollbackError(what="the known-good release r1 installed", found="its venv is missing")
    status, line = rollout.after_rollback(rec("b", "failed", "rollback", error=outcome.error_of(broken)))
    assert status == "rollback-failed" and "its venv is missing" in line
    status, line = rollout.after_rollback(outcome.decide("b", None))
    assert status == "rollback-failed" and line.startswith("ROLLBACK FAILED: no outcome record")


def test_the_rollout_reads_the_records_not_pyinfras_words(tmp_path, monkeypatch):
    """A deploy batch and its rollback, pyinfra's run faked: each run writes records into the
    journal the rollout names; its printed text says the opposite and is not read."""
    import io

    from sglang_deploy.controller import runner
    from sglang_deploy.integration import journal

    runs = []

    def fake(inventory, deploy_file, *, limit=(), spec=None, on_line=None, **kw):
        put = journal.Writer(spec.journal).put
        runs.append((deploy_file, list(limit)))
        if deploy_file == "deploy.py":
            put("a", "outcome", outcome.record(
                "a", "passed", "verify", action="restarted", summary=VERIFIED))
            put("b", "outcome", outcome.record("b", "failed", "verify", error=outcome.error_of(
                VerifyError(what="the server to serve", found="exited in phase `autotune`"))))
        else:
            put("b", "outcome", outcome.record(
                "b", "passed", "rollback", action="rolled-back", summary={"release": "r1"}))
        text = "    [a] Could not connect\n    Grand total   -\nnever passed verification\n"
        return runner.Run(argv=[], rc=1 if deploy_file == "deploy.py" else 0, output=text, seconds=2.0)

    monkeypatch.setattr(runner, "run_pyinfra", fake)
    monkeypatch.setattr(runner, "start_pyinfra", started(fake))
    r = rollout.Rollout(inventory="inv.py", out=io.StringIO(),
                        progress=HostProgress(out=io.StringIO()))
    results = {h: HostResult(h) for h in ("a", "b", "c")}
    assert r.drain_and_deploy(1, [], ["a", "b"], results, tmp_path) is False
    assert (results["a"].status, results["a"].action, results["a"].restart_to_ready_s) == ("done", "restarted", 40.0)
    assert results["b"].status == "failed" and "phase `autotune`" in results["b"].message
    r.rollback(["a", "b"], results, tmp_path)
    assert runs == [("deploy.py", ["a", "b"]), ("rollback.py", ["b"])]
    assert results["b"].status == "rolled-back" and results["b"].message.endswith("verified serving")
    assert results["b"].rollback == "rolled-back" and rollout.verified_after_rollback(results["b"])
    assert results["c"].status == "untouched"


def test_the_dry_rollout_prints_each_hosts_plan_from_the_runs_journal(tmp_path, monkeypatch):
    """`rollout --dry`: one plan run (its run spec's mode `plan`); each host's plan, or its outcome
    record when it has none, comes from the run's journal."""
    import io

    from sglang_deploy.controller import runner
    from sglang_deploy.integration import journal

    asked = {}

    def fake(inventory, deploy_file, *, limit=(), spec=None, dry=False, **kw):
        asked.update(spec=spec, dry=dry)
        put = journal.Writer(spec.journal).put
        put("a", "plan", {"host": "a", "preflight": "pass", "changes": []})
        put("b", "plan", {"host": "b", "preflight": "pass", "changes": ["Restart sglang"]})
        why = {"restart": True, "why": "flags changed: tp-size 8 -> 4",
               "reasons": [{"name": "unit", "text": "flags changed: tp-size 8 -> 4"}]}
        put("b", "outcome", outcome.record("b", "passed", "verify", dry=True, restart=why))
        put("c", "outcome", outcome.record("c", "unreachable", "connect",
                                           error=outcome.unreachable_error("timed out")))
        return runner.Run(argv=[], rc=1, output="", seconds=1.0)

    monkeypatch.setattr(runner, "run_pyinfra", fake)
    out, doc = io.StringIO(), io.StringIO()
    r = rollout.Rollout(inventory="inv.py", out=out, json_out=doc,
                        progress=HostProgress(out=io.StringIO()))
    assert r.dry_run(["a", "b", "c"], tmp_path) == common.EXIT_FAILED
    assert asked["dry"] and asked["spec"].planning
    hosts = {h["host"]: h for h in json.loads(doc.getvalue())["hosts"]}
    assert hosts["a"] == {"host": "a", "ok": True, "error": None, "changes": [],
                          "restart": None}
    assert hosts["b"]["changes"] == ["Restart sglang"]
    # the restart decision and its reasons, from the host's outcome record
    assert hosts["b"]["restart"]["why"] == "flags changed: tp-size 8 -> 4"
    assert not hosts["c"]["ok"] and hosts["c"]["error"] == "did not answer over SSH: timed out"
    text = out.getvalue()
    assert "  a: no change" in text and "      - Restart sglang" in text
    assert "      would restart: flags changed: tp-size 8 -> 4" in text
    assert "  c: no plan (unreachable, or its data is invalid)" in text


# ------------------------------------------------------------------ staging before the drain

def test_staging_is_judged_by_its_record():
    assert rollout.after_staging(rec("a", "passed", "service")) is None
    err = outcome.error_of(VerifyError(what="`import sglang` works", found="No module named 'x'"))
    why = rollout.after_staging(rec("b", "failed", "service", error=err))
    assert why.startswith("staging failed (nothing drained, still serving its release)")
    assert "No module named 'x'" in why
    assert rollout.after_staging(outcome.decide("c", None)).startswith("staging failed")


def started(fake, calls=None):
    """pyinfra's start faked from a fake run: the run happens when the rollout waits for it
    (CALLS: when it was started and when waited for)."""
    def start(inventory, deploy_file, **kw):
        if calls is not None:
            calls.append(("start", list(kw.get("limit", ()))))

        class Running:
            started = time.time()

            def finish(self, on_line=None):
                if calls is not None:
                    calls.append(("finish", list(kw.get("limit", ()))))
                return fake(inventory, deploy_file, on_line=on_line, **kw)
        return Running()
    return start


class FakeRouter:
    def __init__(self, names, fails=(), calls=None, strays=()):
        self.host = "router-1"
        self.workers = {n: f"http://{n}:30000" for n in names}
        # hosts the router lists that are no workers of it (a group's node of rank >= 1)
        self.others = {n: (f"http://{n}:30000", "node 1 of group g, not a router worker")
                       for n in strays}
        self.calls = [] if calls is None else calls
        self.fails = set(fails)
        self.drain_timeout_s = 60.0

    def strays(self, names):
        return [n for n in names if n in self.others]

    def drain(self, name, say):
        from sglang_deploy.core.router import DrainWatch

        self.calls.append(("drain", name))
        if name in self.fails:
            raise RouterError(what=f"{name} drained", found="router in-flight 3 at the deadline")
        url = self.workers[name] if name in self.workers else self.others[name][0]
        return DrainWatch(url=url, worker_id=name, router_load=0, worker_reqs=0,
                          router_state="draining", drained_s=0.25)

    def put_back(self, name, say):
        from sglang_deploy.controller.routerctl import PutBack

        self.calls.append(("put_back", name))
        return PutBack(steps=["wait-removal", "add", "verify"], removal_wait_s=1.5, tries=1)


def fake_runs(monkeypatch, stage_fails=(), unreachable=(), stopped=(), calls=None):
    """pyinfra faked: the staging run fails on STAGE_FAILS and does not reach UNREACHABLE;
    STOPPED: left unfinished by the run's stop; every deploy verifies, unless its gate
    (``stages/rollgate.py``) stops it. CALLS: when each batch run started and was waited for."""
    from sglang_deploy.controller import runner
    from sglang_deploy.integration import journal
    from sglang_deploy.stages import rollgate

    runs = []

    def fake(inventory, deploy_file, *, limit=(), spec=None, on_line=None, **kw):
        put = journal.Writer(spec.journal).put
        if spec.gate is not None:  # the real run waits there before any change
            try:
                rollgate.wait(limit[0], spec.gate)
            except RolloutError as exc:
                runs.append((deploy_file, list(limit), "stopped at its gate", exc.found))
                return runner.Run(argv=[], rc=1, output=str(exc), seconds=0.5)
        runs.append((deploy_file, list(limit), spec.mode))
        for h in limit:
            if spec.stage_only and h in stopped:
                rec_ = outcome.record(h, "interrupted", "runtime",
                                      note="the run stopped when c failed, before this host finished")
            elif spec.stage_only and h in unreachable:
                rec_ = outcome.record(h, "unreachable", "connect",
                                      error=outcome.unreachable_error("timed out"))
            elif spec.stage_only and h in stage_fails:
                rec_ = outcome.record(h, "failed", "service", error=outcome.error_of(
                    VerifyError(what="`import sglang` works", found="No module named 'x'")))
            elif spec.stage_only or deploy_file != "deploy.py":
                rec_ = outcome.record(h, "passed", "service")
            else:
                rec_ = outcome.record(h, "passed", "verify", action="restarted", summary=VERIFIED)
            put(h, "outcome", rec_)
        return runner.Run(argv=[], rc=0, output="", seconds=2.0)

    monkeypatch.setattr(runner, "run_pyinfra", fake)
    monkeypatch.setattr(runner, "start_pyinfra", started(fake, calls))
    return runs


def a_rollout(**kw):
    import io

    return rollout.Rollout(inventory="inv.py", out=io.StringIO(),
                           progress=HostProgress(out=io.StringIO()), **kw)


def test_a_host_that_fails_staging_stops_the_rollout_before_any_drain(tmp_path, monkeypatch):
    runs = fake_runs(monkeypatch, stage_fails={"b"})
    r, front = a_rollout(), FakeRouter(["a", "b", "c"])
    results = {h: HostResult(h) for h in ("a", "b", "c")}
    verdict = r.stage_all(["a", "b", "c"], results, tmp_path)
    assert verdict.startswith("rollout stopped before any drain: staging failed on b")
    assert runs == [("deploy.py", ["a", "b", "c"], "stage")]  # one run, all hosts at once
    assert results["b"].status == "failed" and "No module named 'x'" in results["b"].message
    assert results["a"].status == "untouched" and results["a"].message.startswith("staged, not")
    assert front.calls == [] and all(x.router is None for x in results.values())


def test_the_staging_run_is_also_the_check_that_every_host_answers(tmp_path, monkeypatch):
    runs = fake_runs(monkeypatch, unreachable={"c"})
    r = a_rollout()
    results = {h: HostResult(h) for h in ("a", "b", "c")}
    verdict = r.stage_all(["a", "b", "c"], results, tmp_path)
    assert verdict.startswith("rollout stopped before any drain: c did not answer over SSH; "
                              "staging failed on c")
    assert "did not answer over SSH: timed out" in results["c"].message
    assert [x.status for x in results.values()] == ["untouched", "untouched", "failed"]
    assert runs == [("deploy.py", ["a", "b", "c"], "stage")]  # no separate `exec` run


def test_hosts_the_staging_run_stopped_at_another_failure_are_left_untouched(tmp_path,
                                                                             monkeypatch):
    fake_runs(monkeypatch, unreachable={"c"}, stopped={"a"})
    r = a_rollout()
    results = {h: HostResult(h) for h in ("a", "b", "c")}
    verdict = r.stage_all(["a", "b", "c"], results, tmp_path)
    assert "staging failed on c;" in verdict
    assert results["a"].status == "untouched"
    assert results["a"].message.startswith("not staged, not drained: ")
    assert "the run stopped when c failed" in results["a"].message
    assert results["b"].message.startswith("staged, not drained")


def test_after_staging_each_batch_only_rolls_and_trusts_the_staging_record(tmp_path, monkeypatch):
    runs = fake_runs(monkeypatch)
    r, front = a_rollout(), FakeRouter(["a", "b"])
    results = {h: HostResult(h) for h in ("a", "b")}
    assert r.stage_all(["a", "b"], results, tmp_path) is None
    r.roll([front], [["a"], ["b"]], results, tmp_path)
    assert runs[1:] == [("deploy.py", ["a"], "roll"), ("deploy.py", ["b"], "roll")]
    assert front.calls == [("drain", "a"), ("put_back", "a"), ("drain", "b"), ("put_back", "b")]
    assert all(x.status == "done" and x.router == "back" and x.out_of_router_s is not None
               and x.stage_seconds == 2.0 for x in results.values())
    # what the drain and the put back saw is in the report: the drain ended while the router
    # still held the worker, the put back waited for the router to forget it
    assert [(x.drain_s, x.drain_router, x.readd_wait_s) for x in results.values()] == \
        [(0.25, "draining", 1.5)] * 2


def test_no_stage_rolls_without_the_staging_record(tmp_path, monkeypatch):
    runs = fake_runs(monkeypatch)
    r = a_rollout(stage=False)
    results = {"a": HostResult("a")}
    r.roll([], [["a"]], results, tmp_path)
    assert runs == [("deploy.py", ["a"], "deploy")]
    assert results["a"].status == "done" and results["a"].out_of_router_s is None


def test_staged_each_batch_run_starts_with_its_drain_and_goes_on_once_drained(tmp_path,
                                                                             monkeypatch):
    """Staged, with a router: the batch's deploy.py run is started before the drain (its
    start, connections and reads overlap it) and its changes come after: the fake run waits
    at its gate as the real one does, and goes on only once the gate says drained."""
    from sglang_deploy.stages import rollgate

    calls = []
    runs = fake_runs(monkeypatch, calls=calls)
    r, front = a_rollout(), FakeRouter(["a", "b"], calls=calls)
    results = {h: HostResult(h) for h in ("a", "b")}
    r.roll([front], [["a"], ["b"]], results, tmp_path)
    assert calls == [("start", ["a"]), ("drain", "a"), ("finish", ["a"]), ("put_back", "a"),
                     ("start", ["b"]), ("drain", "b"), ("finish", ["b"]), ("put_back", "b")]
    assert [x[:2] for x in runs] == [("deploy.py", ["a"]), ("deploy.py", ["b"])]
    assert rollgate.verdict((tmp_path / "batch2.gate").read_text()) == ("go", "")
    assert all(x.status == "done" and x.router == "back" and x.prepared_while_draining_s is not None
               for x in results.values())


def test_a_failed_drain_stops_the_batch_run_at_its_gate(tmp_path, monkeypatch):
    """The drain of b fails: its run, already started, is stopped at its gate (nothing
    changed), b is put back still serving and no later batch starts."""
    calls = []
    runs = fake_runs(monkeypatch, calls=calls)
    r, front = a_rollout(), FakeRouter(["a", "b", "c"], fails={"b"}, calls=calls)
    results = {h: HostResult(h) for h in ("a", "b", "c")}
    r.roll([front], [["a"], ["b"], ["c"]], results, tmp_path)
    assert runs[1] == ("deploy.py", ["b"], "stopped at its gate",
                       "the rollout stopped this batch: the drain of b failed")
    assert calls[4:] == [("start", ["b"]), ("drain", "b"), ("finish", ["b"]), ("put_back", "b")]
    assert results["b"].status == "failed"
    assert results["b"].message.startswith("not restarted: drain failed")
    assert results["b"].seconds is None and results["c"].status == "untouched"
    assert "stopped this batch" in (tmp_path / "batch2-deploy.log").read_text()


def test_no_stage_starts_each_batch_run_after_its_drain(tmp_path, monkeypatch):
    """--no-stage keeps today's order: drain, then the run (no gate)."""
    calls = []
    runs = fake_runs(monkeypatch, calls=calls)
    r, front = a_rollout(stage=False), FakeRouter(["a"], calls=calls)
    results = {"a": HostResult("a")}
    r.roll([front], [["a"]], results, tmp_path)
    assert calls == [("drain", "a"), ("start", ["a"]), ("finish", ["a"]), ("put_back", "a")]
    assert runs == [("deploy.py", ["a"], "deploy")]
    assert results["a"].prepared_while_draining_s is None


def test_the_rollouts_report_says_why_each_host_restarted(tmp_path):
    """Each host's restart decision (its outcome record's ``restart``) is in the report
    (``rollout.json``, ``--json``) and said under the table."""
    import io

    out, doc = io.StringIO(), io.StringIO()
    r = rollout.Rollout(inventory="inv.py", out=out, json_out=doc,
                        progress=HostProgress(out=io.StringIO()))
    why = {"restart": True, "why": "flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…",
           "reasons": [{"name": "unit", "text": "flags changed: tp-size 8 -> 4"}]}
    results = {"a": HostResult("a", "done", restart=why),
               "b": HostResult("b", "converged", restart={"restart": False, "why": "",
                                                          "reasons": []})}
    r.progress.start(["a", "b"])
    assert r.finish(results, tmp_path, None, 0.0) == common.EXIT_OK
    hosts = {h["host"]: h for h in json.loads(doc.getvalue())["hosts"]}
    assert hosts["a"]["restart"] == why and not hosts["b"]["restart"]["restart"]
    assert json.loads((tmp_path / "rollout.json").read_text())["hosts"][0]["restart"] == why
    text = out.getvalue()
    assert "a: restarted for: flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…" in text
    assert "b: restarted for" not in text


def test_each_batch_run_names_its_journal_its_reports_and_its_gate_in_its_spec(tmp_path,
                                                                             monkeypatch):
    """A staged batch's deploy.py run is told everything by its run spec (core/runspec.py):
    a rolling run, the batch's journal and report folder in the rollout's folder, and the
    gate this rollout's process opens."""
    import os

    from sglang_deploy.controller import runner

    fake_runs(monkeypatch)
    specs, faked = [], runner.start_pyinfra

    def start(*args, **kw):
        specs.append(kw["spec"])
        return faked(*args, **kw)

    monkeypatch.setattr(runner, "start_pyinfra", start)
    r, front = a_rollout(), FakeRouter(["a", "b"])
    results = {h: HostResult(h) for h in ("a", "b")}
    r.roll([front], [["a"], ["b"]], results, tmp_path)
    assert [(s.mode, s.journal, s.reports, s.gate.path, s.gate.pid) for s in specs] == [
        ("roll", str(tmp_path / f"batch{i}.journal.json"), str(tmp_path / f"batch{i}-reports"),
         str(tmp_path / f"batch{i}.gate"), os.getpid()) for i in (1, 2)]

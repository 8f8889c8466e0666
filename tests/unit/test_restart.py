"""The one restart decision (``core.restart``): from a host's typed facts and what the run
wants, the actions and their reasons, in words an operator reads (``flags changed: tp-size 8
-> 4; release d5e0… -> 7a1c…``); and where the reasons are kept and shown: the outcome record,
``last-verified.json``'s ``last_restart`` (``status``, the reports), the rollout's report."""

from __future__ import annotations

import io

import pytest
import runobj
from pyinfra.api import State
from pyinfra.context import ctx_state

from sglang_deploy.commands import status
from sglang_deploy.core import outcome, restart
from sglang_deploy.core.hoststate import HostState
from sglang_deploy.core.restart import Facts, Wanted
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.integration import journal, outcomes, plan

OLD, NEW = "d5e0ed013b590921", "7a1c0c9a23b2d611"
UNIT, SECRETS = "[Service]\nExecStart=x\n", "API_KEY=s3cret-value\n"
US, SS = restart.sha256_text(UNIT), restart.sha256_text(SECRETS)


def _argv(release: str, tp: int, *extra: str) -> tuple[str, ...]:
    return (f"/opt/sglang/releases/{release}/venv/bin/python", "/opt/sglang/tools/launch.py",
            "python", "-m", "sglang.launch_server", "--model-path", "/srv/models/m",
            "--port", "30000", "--tp-size", str(tp), *extra)


def _exec_start(argv) -> str:
    """``systemctl show -p ExecStart``'s value for ARGV."""
    return (f"{{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; "
            "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")


SERVING = Facts(unit_sha256=US, secrets_sha256=SS, active=True, up=True, serving=True,
                started=True, current=OLD, exec_start=_exec_start(_argv(OLD, 8)))


def test_a_converged_serving_host_has_no_reason():
    d = restart.decide(SERVING, Wanted(UNIT, SECRETS, OLD, argv=_argv(OLD, 8)))
    assert d.reasons == () and not d.start and d.action == restart.NONE and not d.retest


def test_the_unit_reason_says_which_flags_changed_and_the_release():
    d = restart.decide(SERVING, Wanted("[Service]\nExecStart=y\n", SECRETS, NEW,
                                       argv=_argv(NEW, 4), p2p_skipped=True))
    assert d.names == ["unit"] and d.triggers == ["unit"]
    assert d.why() == "flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…"
    assert d.retest  # the copies were skipped while it served: retested before the restart
    # the release venv installed by this run: its own reason says the release
    d = restart.decide(SERVING, Wanted("[Service]\nExecStart=y\n", SECRETS, NEW,
                                       argv=_argv(NEW, 4), changing=("release", "patch")))
    assert d.names == ["unit", "release", "patch"]
    assert d.why() == ("flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…; "
                       "autotune patch applied")


def test_flags_added_removed_and_many():
    old, new = ["--a", "1", "--b", "--c", "x"], ["--a", "2", "--c", "x", "--d", "v"]
    assert restart.flag_changes(old, new) == ["a 1 -> 2", "-b", "+d v"]
    many_old = [w for i in range(6) for w in (f"--f{i}", "1")]
    many_new = [w for i in range(6) for w in (f"--f{i}", "2")]
    assert restart.flag_changes(many_old, many_new)[-1] == "2 more"
    assert restart.exec_argv(None) is None and restart.exec_argv("{ path=/x ; }") is None
    assert restart.exec_argv(_exec_start(_argv(OLD, 8)))[-1] == "8"


def test_without_the_loaded_command_the_unit_reason_says_so_and_secrets_never_their_values():
    facts = Facts(unit_sha256="old", secrets_sha256="old", active=True, up=True, current=OLD)
    d = restart.decide(facts, Wanted(UNIT, SECRETS, OLD))
    assert d.names == ["unit", "secrets"] and d.why() == "unit changed; secrets changed"
    assert "s3cret" not in str(restart.record(d))
    first = restart.decide(Facts(), Wanted(UNIT, SECRETS, NEW, changing=("release",)))
    assert first.names == ["unit", "secrets", "release", "not running"] and first.start
    assert first.why() == "unit new; secrets new; release none -> 7a1c…; not running"


@pytest.mark.parametrize("serves, changing, action, names", [
    (True, (), restart.VERIFY, []),                       # it serves: verified as it runs
    (False, (), restart.RESTART, [restart.UNVERIFIED]),   # it does not: restarted
    (True, ("model",), restart.NONE, ["model"]),          # restarted anyway, verified after
    (False, ("model",), restart.RESTART, ["model"]),
])
def test_a_running_server_no_deploy_verified(serves, changing, action, names):
    facts = Facts(unit_sha256=US, secrets_sha256=SS, active=True, up=True, started=True,
                  unverified=True, current=OLD)
    assert restart.needs_poll(facts) and not restart.needs_poll(facts, group=True)
    d = restart.decide(facts, Wanted(UNIT, SECRETS, OLD, changing=changing), serves=serves)
    assert d.action == action and d.names == names


def test_a_crash_looping_unit_is_started_after_the_retest():
    loop = Facts(unit_sha256=US, secrets_sha256=SS, up=True, current=OLD)  # activating
    d = restart.decide(loop, Wanted(UNIT, SECRETS, OLD, p2p_skipped=True))
    assert d.start and d.names == [restart.NOT_RUNNING] and d.triggers == [] and d.retest
    assert not restart.needs_poll(loop)


def test_the_facts_of_a_host_state():
    hs = HostState.from_json({
        "service": {"ActiveState": "active", "SubState": "running", "InvocationID": "i2",
                    "ExecStart": _exec_start(_argv(OLD, 8))},
        "last_verified": {"invocation": "i1"}, "current": OLD, "secrets_sha256": SS,
        "paths": {"/etc/systemd/system/sglang.service": {"kind": "file", "sha256": US}}})
    facts = Facts.of(hs, "/etc/systemd/system/sglang.service")
    assert facts == Facts(unit_sha256=US, secrets_sha256=SS, active=True, up=True,
                          serving=True, started=True, unverified=True, current=OLD,
                          exec_start=_exec_start(_argv(OLD, 8)))


def test_a_group_restarts_as_one_and_each_node_says_why():
    ok = Facts(unit_sha256=US, secrets_sha256=SS, active=True, up=True, current=OLD)
    want = Wanted(UNIT, SECRETS, OLD, p2p_skipped=True)
    gd = restart.decide_group(["n0", "n1"], {"n0": ok, "n1": ok},
                              {"n0": want, "n1": Wanted("other", SECRETS, OLD)})
    assert gd.restart and gd.own("n0") == () and gd.own("n1") == ("unit",)
    assert restart.record(gd, "n0") == {
        "why": "peer changed: n1 (unit changed)",
        "reasons": [{"name": restart.PEER, "text": "peer changed: n1 (unit changed)"}]}
    assert restart.record(gd, "n1")["why"] == "unit changed"
    assert gd.why() == "n1: unit changed"


def test_the_last_restart_is_kept_until_the_next_one():
    decided = {"why": "secrets changed", "reasons": [{"name": "secrets", "text": "x"}]}
    old = {"at": "2026-12-01T10:00:00+00:00", "action": "started", "why": "unit new"}
    assert restart.last_restart("restarted", decided, old) == {
        "action": "restarted", "why": "secrets changed", "reasons": decided["reasons"]}
    assert restart.last_restart("converged", decided, old) == old
    assert restart.last_restart("unchanged", decided, None) is None
    assert restart.last_restart_text(old) == "2026-12-01 10:00 UTC started: unit new"
    rb = restart.rollback_reason(OLD, ("unit", "current"))
    assert rb.text == "rollback to the known-good release d5e0… (unit, current)"


def test_status_shows_the_last_restart_when_and_why():
    entry = {"at": "2026-12-05T18:20:00+00:00", "action": "restarted",
             "why": "flags changed: tp-size 8 -> 4; release d5e0… -> 7a1c…",
             "reasons": [{"name": "unit", "text": "flags changed: tp-size 8 -> 4"}]}
    hs = HostState.from_json({"last_verified": {"verified_at": "x", "last_restart": entry}})
    fields = plan.status_fields(hs, None, NEW)
    assert fields["last_restart"]["why"] == entry["why"]
    assert fields["last_restart"]["reasons"] == entry["reasons"]
    assert plan.status_fields(HostState.from_json({}), None, NEW)["last_restart"] is None
    out = io.StringIO()
    status.render_last_restart([{"host": "fx1", **fields}, {"host": "fx2"}], out)
    assert out.getvalue() == ("fx1: last restart: 2026-12-05 18:20 UTC restarted: flags "
                              "changed: tp-size 8 -> 4; release d5e0… -> 7a1c…\n")


def test_the_outcome_record_carries_the_decision(tmp_path):
    """The service stage's decision (``outcomes.decided``) is in every record the host gets
    from then on, and the commands read it back (``HostOutcome.restart``)."""
    path = tmp_path / "journal.json"
    state = State()
    rec = runobj.start(state, RunSpec(journal=str(path)), checked=False).recorder
    with ctx_state.use(state):
        rec.enter("fx1", "service")
        assert journal.read(path).outcome("fx1").restart is None
        outcomes.decided("fx1", {"why": "unit changed", "reasons": []}, True)
        rec.enter("fx1", "verify")
    got = journal.read(path).outcome("fx1")
    assert got.restart == {"restart": True, "why": "unit changed", "reasons": []}
    assert outcome.record("h", outcome.PASSED, "verify")["restart"] is None


def test_verbose_prints_the_decision_before_the_restart(caplog):
    """``-v`` (pyinfra's ``print_noop_info``) prints the decision and why while the run is
    prepared, before anything restarts; without it, nothing."""
    from pyinfra.api import Config, Inventory
    from pyinfra.context import ctx_host

    from sglang_deploy.stages import restarts

    inventory = Inventory(([("fx1", {})], {}))
    state = State(inventory, Config())
    with ctx_state.use(state), ctx_host.use(inventory.get_host("fx1")), \
            caplog.at_level("INFO", logger="pyinfra"):
        restarts.say("flags changed: tp-size 8 -> 4", True)
        assert "restart: flags changed" not in caplog.text
        state.print_noop_info = True
        restarts.say("flags changed: tp-size 8 -> 4", True)
        restarts.say("", False)
    assert caplog.text.count("restart: flags changed: tp-size 8 -> 4") == 1


def test_a_unit_file_written_but_never_loaded_restarts_the_server_after_a_reload():
    """An earlier run wrote the unit and ended before its daemon-reload (systemd's
    NeedDaemonReload=yes): the file on disk equals this run's, yet the server runs the old
    command; it is restarted (no operation of this run changes the unit to trigger it)."""
    import dataclasses

    stale = dataclasses.replace(SERVING, stale_load=True)
    wanted = Wanted(UNIT, SECRETS, OLD, argv=_argv(OLD, 8, "--host", "10.0.0.3"))
    d = restart.decide(stale, wanted)
    assert d.names == ["unit"] and d.action == restart.RESTART
    assert d.why() == ("flags changed: +host 10.0.0.3 (not loaded by systemd yet: "
                       "daemon-reload pending)")
    # the same host without the pending reload: converged, nothing
    assert restart.decide(SERVING, Wanted(UNIT, SECRETS, OLD, argv=_argv(OLD, 8))).reasons == ()
    # a stopped unit is started (after the reload), not restarted
    stopped = dataclasses.replace(stale, active=False, up=False, serving=False, started=False)
    d = restart.decide(stopped, wanted)
    assert d.start and d.action == restart.NONE and d.names == ["not running"]


def test_the_pending_reload_is_read_from_systemctl_show():
    hs = HostState.from_json({"service": {"ActiveState": "active", "NeedDaemonReload": "yes"}})
    assert hs.service.need_daemon_reload
    assert not HostState.from_json({"service": {"ActiveState": "active",
                                                "NeedDaemonReload": "no"}}).service.need_daemon_reload

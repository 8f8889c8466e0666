"""One run spec, one run object (core/runspec.py, integration/integration.py, controller/runner.py): what
a command asks of the pyinfra run it starts travels as one file named by one argument, is
read once when pyinfra's State starts, and is found on the run's one run object; nothing of
it travels in the environment."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import stagecase
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from sglang_deploy.controller import runner
from sglang_deploy.core import runspec
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.runspec import DATA_KEY, Gate, RunSpec
from sglang_deploy.integration import integration
from sglang_deploy.integration.inputerror import InputError
from sglang_deploy.integration.integration import PyinfraIntegration

REPO = Path(__file__).resolve().parents[2]
#: the environment channels the run spec replaced: set, they change nothing
OLD_CHANNELS = ("SGLANG_DEPLOY_JOURNAL", "SGLANG_DEPLOY_PLAN", "SGLANG_DEPLOY_STAGE_ONLY",
                "SGLANG_DEPLOY_STAGED", "SGLANG_DEPLOY_ROLL_GATE", "SGLANG_DEPLOY_ROLL_GATE_PID",
                "SGLANG_DEPLOY_ROLL_GATE_S", "SGLANG_DEPLOY_REPORTS", "SGLANG_DEPLOY_BENCH_RUN",
                "SGLANG_DEPLOY_PARTIAL_GROUP")


# ------------------------------------------------------------------ the spec (pure)
def test_every_field_round_trips_through_its_json():
    full = RunSpec(mode=runspec.ROLL, gate=Gate(path="/r/batch1.gate", pid=4242, deadline_s=12.5),
                   journal="/r/batch1.journal.json", reports="/r/batch1-reports",
                   bench_run="b1", partial_group=True, verbosity=2)
    for spec in (RunSpec(), full, RunSpec(mode=runspec.PLAN, journal="j.json"),
                 RunSpec(mode=runspec.STAGE)):
        assert runspec.from_json(spec.to_json()) == spec
    assert json.loads(RunSpec().to_json()) == {
        "mode": "deploy", "gate": None, "journal": None, "reports": None, "bench_run": None,
        "partial_group": False, "verbosity": 0}


def test_the_modes_say_what_the_run_does():
    assert [(m, RunSpec(mode=m).planning, RunSpec(mode=m).stage_only,
             RunSpec(mode=m).trusts_staging) for m in runspec.MODES] == [
        ("deploy", False, False, False), ("plan", True, False, False),
        ("stage", False, True, False), ("roll", False, False, True)]


def test_a_spec_is_frozen():
    with pytest.raises(AttributeError):
        RunSpec().mode = runspec.PLAN  # type: ignore[misc]


@pytest.mark.parametrize(("doc", "found", "fix"), [
    ({"mode": "dry"}, "'dry'", "write `mode` as one of deploy, plan, stage, roll"),
    ({"mode": "plan", "gate": {"path": "/g"}}, "'path': '/g'",
     "drop the gate, or make the run a deploy"),
    ({"mode": "stage", "gate": {"path": "/g"}}, "'/g'", "drop the gate"),
    ({"gate": {"path": "/g", "deadline_s": 0}}, "0", "a number of seconds > 0"),
    ({"gate": {"path": "/g", "pid": -1}}, "-1", "the rollout's process id"),
    ({"gate": {"path": ""}}, "''", "the gate file's path"),
    ({"gate": {"pid": 1}}, "{'pid': 1}", "an object with path"),
    ({"gate": "/g"}, "'/g'", "an object with path"),
    ({"verbosity": -1}, "-1", "a count >= 0"),
    ({"verbosity": True}, "True", "a count >= 0"),
    ({"partial_group": "yes"}, "'yes'", "true or false"),
    ({"journal": ""}, "''", "a non-empty string or null"),
    ({"reports": 3}, "3", "a non-empty string or null"),
    ({"plan": True}, "unknown key(s): plan", "remove them"),
])
def test_a_bad_spec_is_refused_with_what_was_found_and_the_fix(doc, found, fix):
    with pytest.raises(UsageError) as exc:
        runspec.from_json(json.dumps(doc), "the spec x.json")
    assert found in exc.value.found and fix in exc.value.fix, exc.value
    assert exc.value.exit_status == 2


def test_text_that_is_no_json_object_is_refused():
    for text, found in (("{", "not JSON"), ("[]", "list")):
        with pytest.raises(UsageError) as exc:
            runspec.from_json(text, "the spec x.json")
        assert "the spec x.json" in exc.value.what and found in exc.value.found


# ------------------------------------------------------------------ the runner writes it
@pytest.fixture
def fake_pyinfra(tmp_path, monkeypatch):
    """A pyinfra that prints its argv and the run spec's file it was named (JSON lines)."""
    script = tmp_path / "pyinfra"
    script.write_text(f"#!{sys.executable}\n" + """
import json, os, stat, sys
path = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("_sglang_deploy_run="))
print(json.dumps({"argv": sys.argv[1:], "spec": json.load(open(path)),
                  "mode": oct(stat.S_IMODE(os.stat(path).st_mode)), "path": path,
                  "env": sorted(k for k in os.environ if k.startswith("SGLANG_DEPLOY_"))}))
""")
    script.chmod(0o755)
    monkeypatch.setattr(runner, "pyinfra_bin", lambda: str(script))
    return script


def test_the_runner_names_the_spec_by_one_argument_and_removes_its_file(fake_pyinfra, tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv(runner.VERBOSITY_ENV, raising=False)
    spec = RunSpec(mode=runspec.PLAN, journal=str(tmp_path / "j.json"))
    with runner.verbose(2):  # the CLI's -vv: in the argv and in the spec
        run = runner.run_pyinfra("inv.py", "deploy.py", limit=["a"], data=["k=v"], dry=True,
                                 spec=spec, cwd=tmp_path)
    assert run.ok, run.output
    seen = json.loads(run.output)
    path = seen["path"]
    assert seen["argv"] == ["-y", "-vv", "--limit", "a", "--data", "k=v",
                            "--data", f"{DATA_KEY}={path}", "--dry", "inv.py", "deploy.py"]
    assert runspec.from_json(json.dumps(seen["spec"])) == RunSpec(
        mode=runspec.PLAN, journal=str(tmp_path / "j.json"), verbosity=2)
    assert seen["mode"] == "0o600"  # only the controller's user reads it
    assert not Path(path).exists()  # removed once the run ended


def test_a_run_without_a_spec_gets_the_default_one(fake_pyinfra, tmp_path, monkeypatch):
    monkeypatch.delenv(runner.VERBOSITY_ENV, raising=False)
    seen = json.loads(runner.run_pyinfra("inv.py", ["exec", "--", "true"], cwd=tmp_path).output)
    assert seen["spec"] == json.loads(RunSpec().to_json())
    assert seen["argv"][-4:] == ["inv.py", "exec", "--", "true"]


# ------------------------------------------------------------------ read once, at State.init
def bare_integration() -> PyinfraIntegration:
    """The integration with this project's run object (``hooks.begin``), no data check."""
    from sglang_deploy.controller import routing
    from sglang_deploy.integration import hooks

    return PyinfraIntegration(handlers=lambda release, run: [release], begin=hooks.begin,
                              select=lambda inventory, limit: limit,
                              check=lambda run: routing.fleet_of(run.inventory, {}))


def test_the_spec_is_read_once_at_init_and_is_no_hosts_data(tmp_path):
    spec = RunSpec(mode=runspec.STAGE, journal=str(tmp_path / "j.json"), partial_group=True)
    path = tmp_path / "run.json"
    path.write_text(spec.to_json())
    state = State()
    bare_integration().install(state)
    inventory = Inventory((["h1", "h2"], {}), override_data={DATA_KEY: str(path), "k": 1})
    state.init(inventory, Config())
    path.unlink()  # read once: the run no longer needs the file
    run = integration.run_of(state)
    assert (run.spec, run.dry) == (spec, False)
    assert run.journal.path == tmp_path / "j.json"  # the spec's journal
    with ctx_state.use(state):
        assert integration.this_run().spec.stage_only
    for host in inventory:
        assert host.data.get(DATA_KEY) is None and host.data.get("k") == 1


def test_the_spec_given_by_hand_as_json_is_read_too():
    """pyinfra parses `--data KEY={...}` into an object: the spec itself, by hand."""
    state = State()
    bare_integration().install(state)
    state.init(Inventory((["h1"], {}), override_data={DATA_KEY: {"partial_group": True}}),
               Config())
    assert integration.run_of(state).spec == RunSpec(partial_group=True)


def test_without_the_argument_the_run_is_a_deploy_whatever_the_environment(monkeypatch):
    for name in OLD_CHANNELS:
        monkeypatch.setenv(name, "1")
    state = State()
    bare_integration().install(state)
    state.init(Inventory((["h1"], {})), Config())
    run = integration.run_of(state)
    assert (run.spec, run.dry) == (RunSpec(), False)


@pytest.mark.parametrize("value", ["missing.json", "bad.json", 7])
def test_a_spec_that_cannot_be_read_ends_the_run_as_an_input_error(tmp_path, value):
    (tmp_path / "bad.json").write_text('{"mode": "dry"}')
    if isinstance(value, str):
        value = str(tmp_path / value)
    state = State()
    bare_integration().install(state)
    with pytest.raises(InputError) as exc:
        state.init(Inventory((["h1"], {}), override_data={DATA_KEY: value}), Config())
    assert exc.value.exit_code == 2 and "fix:" in str(exc.value.error)
    assert not integration.is_checked(state)


def test_looking_up_the_run_object_where_none_is_attached_raises():
    state = State()
    with pytest.raises(UsageError) as exc:
        integration.run_of(state)
    assert "no run object" in exc.value.found and "config.py" in exc.value.fix
    with ctx_state.use(state), pytest.raises(UsageError):
        integration.this_run()
    from sglang_deploy.integration import plan
    from sglang_deploy.stages import staging

    with ctx_state.use(state):  # every reader of the run's modes asks it: none guesses
        for reader in (plan.planning, plan.read_only, staging.stage_only,
                       staging.trusts_record):
            with pytest.raises(UsageError):
                reader()


def test_a_plan_run_reports_every_host_and_takes_no_deploy_lock():
    """The plan mode of the spec (no longer config.py's environment): FAIL_PERCENT off, no
    deploy lock among the handlers."""
    from sglang_deploy.integration import hooks

    for spec, fail_percent, locked in ((RunSpec(), 0, True),
                                       (RunSpec(mode=runspec.PLAN), None, False)):
        state = State()
        config = Config()
        config.FAIL_PERCENT = 0  # config.py's
        state.init(Inventory((["h1"], {})), config)
        run = integration.RunStart(state, state.inventory, None, None, dry=False, spec=spec)
        hooks.begin(run)
        assert state.config.FAIL_PERCENT == fail_percent
        kinds = {type(h) for h in hooks.handlers(integration.ReleaseRun(), run)}
        assert (hooks.HoldDeployLock in kinds) is locked


# ------------------------------------------------------------------ no environment channel
SOME_CASES = ["converged", "new_release", "new_release_staged", "roll_gate_drained",
              "serving_drift_dry", "allreduce_group", "crash_loop"]


@pytest.mark.parametrize("name", SOME_CASES)
def test_a_run_with_the_old_variables_set_behaves_as_without_them(name, tmp_path, monkeypatch):
    """Each old channel set to what would change the run (a plan, staging, a gate that stops
    it, another journal): the stages add exactly the case's expected operations."""
    stop = tmp_path / "old.gate"
    stop.write_text("stop: the old channel was read\n")
    values = {"SGLANG_DEPLOY_JOURNAL": str(tmp_path / "old.json"),
              "SGLANG_DEPLOY_ROLL_GATE": str(stop), "SGLANG_DEPLOY_ROLL_GATE_PID": "1",
              "SGLANG_DEPLOY_ROLL_GATE_S": "0.01", "SGLANG_DEPLOY_REPORTS": str(tmp_path)}
    for channel in OLD_CHANNELS:
        monkeypatch.setenv(channel, values.get(channel, "1"))
    case = stagecase.load(stagecase.CASES / f"{name}.json")
    cwd = tmp_path / "run"
    cwd.mkdir()
    assert stagecase.run_case(case, cwd, monkeypatch) == case["expected"]
    assert not (tmp_path / "old.json").exists()


def test_no_module_reads_a_run_mode_from_the_environment():
    """The package, the deploy files and config.py name no old channel (the cache folders
    are user settings; the CLI's -v count is the one channel left: runner.VERBOSITY_ENV)."""
    files = [*sorted((REPO / "sglang_deploy").rglob("*.py")),
             *sorted(REPO.glob("*.py"))]
    found = [f"{p.relative_to(REPO)}: {name}" for p in files for name in OLD_CHANNELS
             if f'"{name}"' in p.read_text()]
    assert found == []
    assert runner.VERBOSITY_ENV == "SGLANG_DEPLOY_PYINFRA_VERBOSITY"


def test_stat_of_a_written_spec_is_the_users_only(tmp_path):
    path = runner.write_spec(RunSpec(journal="j"))
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert runspec.from_json(path.read_text()) == RunSpec(journal="j")
    finally:
        path.unlink()

"""One run object per pyinfra run (``integration.ThisRun``, issue 39 item 2): the spec, the
journal, the outcome recorder, the Fleet, the groups' runs and the hosts' reads all come from
it; it is attached once when the State starts and released when the run ends; a lookup
where none is attached raises, naming the fix, and nothing makes a part by default."""

from __future__ import annotations

import pytest
import runobj
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from sglang_deploy.controller import routing
from sglang_deploy.core import group
from sglang_deploy.core import journal as shape
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.runspec import DATA_KEY, PLAN
from sglang_deploy.hostops import facts
from sglang_deploy.integration import hooks, integration, journal, outcomes, plan
from sglang_deploy.integration.integration import PyinfraIntegration
from sglang_deploy.integration.pyinfraerror import ToolError
from sglang_deploy.stages import staging
from sglang_deploy.stages.group import groupops

G = group.Group("g1", (group.Node("h1", 0), group.Node("h2", 1)), "10.0.0.10", 50000)


class Answers:
    """A Host's facts, answered and counted (no connection)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def get_fact(self, state, host, cls, args=None, kwargs=None, **_):
        self.asked.append((host.name, cls.__name__))
        return f"{cls.__name__} of {host.name}"


def _integration() -> PyinfraIntegration:
    """This project's integration (its run object, its handlers), with a check that gives
    the Fleet of the inventory without reading lock files."""
    return PyinfraIntegration(handlers=hooks.handlers, begin=hooks.begin,
                              select=lambda inventory, limit: limit,
                              check=lambda start: routing.fleet_of(start.inventory, {}))


def _started(tmp_path, spec: dict | None = None) -> State:
    """A State started as pyinfra's CLI starts it with config.py: the integration installed,
    ``State.init`` run (the run's spec given by hand, its journal in TMP_PATH)."""
    state = State()
    _integration().install(state)
    given = {"journal": str(tmp_path / "j.json"), **(spec or {})}
    state.init(Inventory((["h1", "h2"], {}), override_data={DATA_KEY: given}), Config())
    return state


def _ours(state) -> set[str]:
    return {name for name in vars(state) if "sglang" in name}


# ------------------------------------------------------------------ every part from the one object
def test_every_part_of_the_run_comes_from_its_one_run_object(tmp_path, monkeypatch):
    answers = Answers()
    monkeypatch.setattr("pyinfra.api.host.get_fact", answers.get_fact)
    state = _started(tmp_path, {"mode": PLAN})
    run = integration.run_of(state)
    # one attribute of ours for the run (and the mark of the installed integration)
    assert _ours(state) == {integration.RUN_ATTR, integration.INSTALLED_ATTR}
    h1 = state.inventory.get_host("h1")
    with ctx_state.use(state), ctx_host.use(h1):
        assert integration.this_run() is run
        assert (run.spec.mode, run.dry, run.read_only) == (PLAN, False, True)
        assert plan.planning() and plan.read_only()  # the modes: its spec
        assert journal.current() is run.journal and run.journal.path == tmp_path / "j.json"
        assert outcomes.recorder() is run.recorder and run.recorder.journal is run.journal
        assert state.callback_handlers[-1] is run.recorder  # the run's last handler
        assert groupops.run_of(state, G) is run.groups.of(G)
        assert integration.run_of(state).fleet is run.fleet and run.is_checked
        assert run.fleet.inventory is state.inventory
        first = facts.read_host_state(h1, facts.ServiceStatus, service="sglang")
        assert facts.read_host_state(h1, facts.ServiceStatus, service="sglang") is first
        assert list(run.reads.of("h1").values()) == [({"service": "sglang"}, first)]
        assert run.reads.of("h2") == {}  # per host
        # what the run's code records goes through the run object's journal and recorder
        journal.record("h1", shape.REPORT, {"host": "h1", "action": "unchanged"})
        outcomes.failed("h2", RuntimeError("boom"), "verify")
    assert answers.asked == [("h1", "ServiceStatus")]  # one read, kept in the run
    ran = journal.read(tmp_path / "j.json")
    assert ran.report("h1") == {"host": "h1", "action": "unchanged"}
    assert ran.outcome("h2").kind == "failed"


def test_two_runs_share_no_part(tmp_path):
    a, b = _started(tmp_path / "a"), _started(tmp_path / "b")
    ra, rb = integration.run_of(a), integration.run_of(b)
    for part in ("journal", "recorder", "groups", "reads", "fleet"):
        assert getattr(ra, part) is not getattr(rb, part), part
    assert groupops.run_of(a, G) is not groupops.run_of(b, G)


# ------------------------------------------------------------------ a lookup without it raises
def _readers(state):
    host = Inventory((["h1"], {})).get_host("h1")
    host.state = state
    return {
        "this_run": integration.this_run,
        "run_of": lambda: integration.run_of(state),
        "the journal": journal.current,
        "a journal record": lambda: journal.record("h1", shape.REPORT, {"host": "h1"}),
        "the recorder": outcomes.recorder,
        "an outcome": lambda: outcomes.failed("h1", RuntimeError("x"), "verify"),
        "a noted error": lambda: outcomes.note_error("h1", RuntimeError("x")),
        "a group's run": lambda: groupops.run_of(state, G),
        "a host's read": lambda: facts.read_host_state(host, facts.ServiceStatus,
                                                       service="sglang"),
        "what a read knows": lambda: facts.known_state(host, root="/opt/sglang"),
        "the plan mode": plan.planning,
        "read only": plan.read_only,
        "stage only": staging.stage_only,
    }


@pytest.mark.parametrize("reader", list(_readers(None)))
def test_a_lookup_without_a_run_object_raises_naming_the_fix(reader):
    """A State that did not start through config.py (a deploy file run from elsewhere, a
    State driven by hand): every part's lookup raises; none is made by default."""
    state = State(Inventory((["h1"], {})), Config())
    with ctx_state.use(state), pytest.raises(UsageError) as exc:
        _readers(state)[reader]()
    assert "no run object" in exc.value.found
    assert "config.py" in exc.value.fix and "attach_run" in exc.value.fix
    assert _ours(state) == set()  # and nothing was attached by the lookup


def test_a_stage_without_a_run_object_is_a_pyinfra_error_not_a_traceback():
    @outcomes.stage("verify")
    def verify():
        raise AssertionError("never runs without its run")

    with ctx_state.use(State()), pytest.raises(ToolError) as exc:
        verify()
    assert "no run object" in str(exc.value)


def test_the_fleet_is_the_checks_given_once(tmp_path):
    state = State(Inventory((["h1"], {})), Config())
    run = runobj.start(state, checked=False, cwd=tmp_path)
    assert not integration.is_checked(state)
    with pytest.raises(UsageError) as exc:
        run.fleet  # noqa: B018 - asked for before the check
    assert "before that check ended" in exc.value.found and "checked" in exc.value.fix
    fleet = routing.fleet_of(state.inventory)
    run.checked(fleet)
    assert run.fleet is fleet and integration.is_checked(state)
    with pytest.raises(RuntimeError):  # never replaced
        run.checked(routing.fleet_of(state.inventory))
    assert run.fleet is fleet


# ------------------------------------------------------------------ nothing outlives the run
def test_nothing_of_the_run_outlives_it(tmp_path):
    state = _started(tmp_path)
    run = integration.run_of(state)
    hosts = list(state.inventory)
    for h in hosts:
        state.trigger_callbacks("host_connect", h)
    state.current_stage = StateStage.Disconnect
    for h in hosts:
        assert integration.run_of(state) is run  # until the last host disconnected
        state.trigger_callbacks("host_disconnect", h)
    assert _ours(state) == {integration.INSTALLED_ATTR}
    assert not integration.is_checked(state)
    for name, reader in _readers(state).items():
        with ctx_state.use(state), pytest.raises(UsageError):
            reader()
            pytest.fail(f"{name} outlived the run")
    # the recorder wrote the last host's record with its own journal
    ran = journal.read(tmp_path / "j.json")
    assert [ran.outcome(h.name).kind for h in hosts] == ["passed", "passed"]


def test_a_state_gets_one_run_object_at_a_time(tmp_path):
    state = State(Inventory((["h1"], {})), Config())
    run = runobj.start(state, cwd=tmp_path)
    with pytest.raises(RuntimeError):
        runobj.start(state, cwd=tmp_path)
    assert integration.run_of(state) is run
    integration.release_run(state)
    assert runobj.start(state, cwd=tmp_path) is not run  # the next run: a new one

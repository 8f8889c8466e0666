"""The one object that does everything done to pyinfra (integration/integration.py): checked against
the pinned pyinfra, loud when pyinfra changes under it, idempotent, and the run object
it attaches to a run's State and releases at its end."""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import gevent
import pyinfra
import pyinfra_internals
import pyinfrascan
import pytest
import runobj
from pyinfra import logger
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.context import ctx_state

from sglang_deploy.controller import routing
from sglang_deploy.core.errors import UsageError
from sglang_deploy.core.runspec import DATA_KEY
from sglang_deploy.integration import hooks, integration, journal, outcomes
from sglang_deploy.integration.integration import PyinfraIntegration, RunStart
from sglang_deploy.integration.pyinfraerror import ToolError

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ the pin, loudly
def test_the_installed_pyinfra_is_the_pin_of_pyproject_uv_lock_and_the_speedups():
    pinned = re.search(r'"pyinfra==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    locked = [p["version"] for p in lock["package"] if p["name"] == "pyinfra"]
    found = {"pyproject.toml": pinned, "uv.lock": locked[0], "installed": version("pyinfra"),
             "pyinfra.__version__": pyinfra.__version__}
    assert set(found.values()) == {integration.PYINFRA_VERSION}, (
        f"pyinfra moved under the speed-ups (integration.PYINFRA_VERSION is "
        f"{integration.PYINFRA_VERSION}): {found}; recheck each of integration.SPEEDUPS "
        "against the new pyinfra (tests/unit/test_pyinfrafast.py), then move the pin")


def source_sha256(qualified: str) -> str:
    """The first 16 hex digits of the sha256 of MODULE.FUNCTION's source, read from the
    module's file (not from the module, whose name may be replaced)."""
    module_name, name = qualified.rsplit(".", 1)
    path = importlib.import_module(module_name).__file__
    text = Path(path).read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return hashlib.sha256(ast.get_source_segment(text, node).encode()).hexdigest()[:16]
    return "missing"


@pytest.mark.parametrize("speedup", integration.SPEEDUPS, ids=lambda r: r.name)
def test_each_replaced_function_and_its_callers_are_the_source_checked(speedup):
    checked = {speedup.original: speedup.sha256, **dict(speedup.callers)}
    now = {name: source_sha256(name) for name in checked}
    assert now == checked, (
        f"pyinfra's source moved under the speed-up `{speedup.name}` "
        f"(integration/pyinfrafast.py): {now} (checked: {checked}); a replaced function that "
        "changed must be rechecked, a caller that changed may no longer look the name up")
    for module in speedup.where:
        assert speedup.name in vars(importlib.import_module(module)), (module, speedup.name)


def test_pyinfra_still_has_what_the_hooks_rewrite_and_wrap():
    import inspect

    site = Path(pyinfra.__file__).parent
    assert "Unexpected error in Python callback: " in (site / "api/operations.py").read_text()
    cli = (site.parent / "pyinfra_cli" / "cli.py").read_text()
    assert 'No host matches found for {option_name} pattern' in cli
    assert "initial_limit" in inspect.signature(State.init).parameters
    assert isinstance(gevent.get_hub().NOT_ERROR, tuple)


# ------------------------------------------------------------------ the speed-ups' install
@pytest.fixture
def stand_ins(monkeypatch):
    """pyinfra's functions replaced by stand-ins (pyinfra's own restored after the test)."""
    places = integration._places()
    for module, name, _ in places:
        monkeypatch.setattr(module, name, lambda *a: None)
    return [(module, name, getattr(module, name)) for module, name, _ in places]


def test_speedups_go_in_for_the_pinned_version_only(stand_ins):
    assert integration.install_speedups("0.0") is False
    assert all(getattr(m, n) is f for m, n, f in stand_ins)
    assert integration.install_speedups(integration.PYINFRA_VERSION) is True
    assert [getattr(m, n) for m, n, _ in stand_ins] == [
        by for _, _, by in integration._places()]
    assert integration.install_speedups("0.0") is True  # in place: nothing to do


def test_another_pyinfra_is_warned_about_once_and_left_as_it_is(stand_ins, monkeypatch, capsys):
    monkeypatch.setattr(integration, "installed_version", lambda: "3.11.0")
    state = State()
    hooks.INTEGRATION.install(state)
    hooks.INTEGRATION.install(state)  # the same run: nothing again
    err = capsys.readouterr().err
    assert err.count("warning: pyinfra 3.11.0 is installed") == 1, err
    assert "speed-ups of pyinfra (integration/pyinfrafast.py) are off" in err
    assert all(getattr(m, n) is f for m, n, f in stand_ins)


def test_install_is_idempotent():
    state = State()
    hooks.install(state)
    init = state.init
    hooks.install(state)
    assert state.init is init  # wrapped once
    assert [type(f) for f in logger.filters].count(integration.NoLimitWarnings) == 1
    assert [type(f) for f in logger.filters].count(
        integration.TypedErrorsWithoutTraceback) == 1
    assert gevent.get_hub().NOT_ERROR.count(ToolError) == 1


# ------------------------------------------------------------------ the run object
class Seen(BaseStateCallback):
    pass


def recording(seen: list, check=None) -> PyinfraIntegration:
    """An integration whose begin and check say when they ran (into SEEN)."""

    def begin(start: RunStart) -> integration.ThisRun:
        seen.append(("begin", start.spec.journal, start.dry))
        return hooks.new_run(start.spec, dry=start.dry, cwd=start.cwd, state=start.state)

    def fleet(start: RunStart):
        seen.append(("check", integration.run_of(start.state).is_checked))
        return routing.fleet_of(start.inventory, {})

    return PyinfraIntegration(handlers=lambda release, start: [release, Seen()], begin=begin,
                              select=lambda inventory, limit: limit, check=check or fleet)


def _inventory(tmp_path, hosts=("h1", "h2")) -> Inventory:
    """HOSTS, their run's journal in TMP_PATH (the spec given by hand, as JSON)."""
    return Inventory((list(hosts), {}),
                     override_data={DATA_KEY: {"journal": str(tmp_path / "j.json")}})


def test_the_run_object_is_attached_once_at_init_checked_and_released_with_the_last_host(
        tmp_path):
    seen: list = []
    state = State()
    recording(seen).install(state)
    assert not integration.is_checked(state)
    inventory = _inventory(tmp_path)
    state.init(inventory, Config())
    run = integration.run_of(state)
    assert seen == [("begin", str(tmp_path / "j.json"), False), ("check", False)]
    assert run.is_checked and integration.is_checked(state)
    assert run.fleet.inventory is inventory
    kinds = [type(h) for h in state.callback_handlers]  # the handlers, then the recorder
    assert kinds[-3:] == [integration.ReleaseRun, Seen, outcomes.Recorder]
    assert state.callback_handlers[-1] is run.recorder
    h1, h2 = inventory.get_host("h1"), inventory.get_host("h2")
    for host in (h1, h2):
        state.trigger_callbacks("host_connect", host)
    state.current_stage = StateStage.Disconnect  # the run ended: pyinfra disconnects
    state.trigger_callbacks("host_disconnect", h1)
    assert integration.run_of(state) is run  # h2 is still connected
    state.trigger_callbacks("host_disconnect", h2)
    assert not integration.is_checked(state)
    with pytest.raises(UsageError):  # released: nothing of the run outlives it
        integration.run_of(state)
    # the recorder kept its own journal for the last host's record
    assert journal.read(tmp_path / "j.json").outcome("h2").kind == "passed"


def test_a_failed_check_leaves_the_run_unchecked_and_is_an_input_error(tmp_path):
    from sglang_deploy.core.errors import DataError
    from sglang_deploy.integration.inputerror import InputError

    def refuse(run):
        raise DataError(key="k", what="a good key", found="a bad one", fix="fix it")

    seen: list = []
    state = State()
    recording(seen, check=refuse).install(state)
    with pytest.raises(InputError):
        state.init(_inventory(tmp_path, ["h1"]), Config())
    assert [s[0] for s in seen] == ["begin"]
    assert not integration.is_checked(state) and not integration.run_of(state).is_checked
    with pytest.raises(UsageError) as exc:  # its Fleet is the check's: none was given
        integration.run_of(state).fleet  # noqa: B018
    assert "before that check ended" in exc.value.found


def test_a_deploy_file_runs_only_on_a_checked_run(tmp_path):
    state = State(Inventory((["h1"], {})), Config())
    with ctx_state.use(state):
        for attach in (lambda: None,  # no run object
                       lambda: runobj.start(state, checked=False, cwd=tmp_path)):
            attach()
            with pytest.raises(ToolError) as err:
                hooks.require_checked(str(REPO / "deploy.py"))
            assert "config.py was not loaded" in str(err.value)
        integration.run_of(state).checked(routing.fleet_of(state.inventory))
        hooks.require_checked(str(REPO / "deploy.py"))


# ------------------------------------------------------------------ pyinfra's internals, listed
def test_every_use_of_pyinfra_is_public_or_listed():
    """The package touches nothing of pyinfra that is neither its public API nor listed in
    ``pyinfra_internals.INTERNALS`` (with why): a new private use fails here."""
    unlisted = {key: files for key, files in pyinfrascan.scan().items()
                if not pyinfra_internals.is_public(key) and key not in pyinfra_internals.listed()}
    assert not unlisted, (
        f"pyinfra internals used and not listed: {unlisted}; use pyinfra's public API, or add "
        "an Internal to tests/unit/pyinfra_internals.py (why, its shape, how to drop it)")


def test_every_listed_internal_is_still_used_and_none_is_public():
    found = pyinfrascan.scan()
    stale = [key for key in pyinfra_internals.listed() if key not in found]
    assert not stale, f"listed but no longer used (drop them from INTERNALS): {stale}"
    public = [key for key in pyinfra_internals.listed() if pyinfra_internals.is_public(key)]
    assert not public, public


@pytest.mark.parametrize("internal", pyinfra_internals.INTERNALS, ids=lambda i: i.what[:40])
def test_each_internal_still_has_the_shape_used(internal):
    assert internal.reason and internal.without
    internal.shape()


SOURCE = '''
from pyinfra import host, state
from pyinfra.api.util import get_kwargs_str
from pyinfra.operations import server

def op(tokens):
    state = {"a": 1}           # a dict of ours: not pyinfra's State
    state.get("a")
    host.name                  # public
    server.shell._inner        # a nested operation
    host.current_op_hash       # pyinfra's bookkeeping
    getattr(host.connector, "client", None)
'''


def test_the_scan_finds_private_uses_and_leaves_public_ones():
    keys = set(pyinfrascan.uses_in(ast.parse(SOURCE)))
    private = {k for k in keys if not pyinfra_internals.is_public(k)}
    assert private == {"pyinfra.api.util.get_kwargs_str", "pyinfra.operations.server.shell._inner",
                       "Host.current_op_hash", "Host.connector", "SSHConnector.client"}, private
    assert {"Host.name", "pyinfra.operations.server"} <= keys - private
    assert not any(k.startswith("State.") for k in keys)  # state.get: a dict's, not State's


def test_a_shape_that_moved_fails_naming_it():
    moved = pyinfra_internals._signature_has("pyinfra.api.state.State.init", "no_such_param")
    with pytest.raises(AssertionError, match="no_such_param"):
        moved()
    gone = pyinfra_internals._has("pyinfra.api.state.State", "no_such_member", instance=True)
    with pytest.raises(AssertionError, match="no_such_member"):
        gone()

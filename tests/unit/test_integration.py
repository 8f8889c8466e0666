"""The one object that does everything done to pyinfra (integration/integration.py): checked against
the pinned pyinfra, loud when pyinfra changes under it, idempotent, and the per-run objects
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
from pyinfra import logger
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from sglang_deploy.integration import hooks, integration
from sglang_deploy.integration.integration import PerRun, PyinfraIntegration, RunStart
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


# ------------------------------------------------------------------ per-run objects
class Seen(BaseStateCallback):
    pass


def recording(seen: list) -> PyinfraIntegration:
    def attach(name: str, handler=None):
        def do(run: RunStart):
            seen.append((name, run.settings, run.dry))
            setattr(run.state, name, True)
            return handler
        return do

    per_run = (PerRun("early", attach("early", Seen()), checked=False),
               PerRun("late", attach("late"), release=lambda state: seen.append(("released",))))
    return PyinfraIntegration(handlers=lambda release, run: [release], per_run=per_run,
                              select=lambda inventory, limit: limit,
                              check=lambda run: {h.name: f"settings of {h.name}"
                                                 for h in run.inventory})


def test_per_run_objects_are_attached_at_init_and_released_with_the_last_host():
    seen: list = []
    state = State()
    recording(seen).install(state)
    assert not integration.is_checked(state)
    inventory = Inventory((["h1", "h2"], {}))
    state.init(inventory, Config())
    assert seen == [("early", None, False),
                    ("late", {"h1": "settings of h1", "h2": "settings of h2"}, False)]
    assert state.early and state.late and integration.is_checked(state)
    kinds = [type(h) for h in state.callback_handlers]
    assert kinds[-2:] == [integration.ReleasePerRun, Seen]  # the handlers, then the per-run one
    h1, h2 = inventory.get_host("h1"), inventory.get_host("h2")
    for host in (h1, h2):
        state.trigger_callbacks("host_connect", host)
    state.trigger_callbacks("host_disconnect", h1)
    assert ("released",) not in seen
    state.trigger_callbacks("host_disconnect", h2)
    assert seen[-1] == ("released",)


def test_a_failed_check_leaves_the_state_unchecked_and_is_an_input_error():
    from sglang_deploy.core.errors import DataError
    from sglang_deploy.integration.inputerror import InputError

    def refuse(run):
        raise DataError(key="k", what="a good key", found="a bad one", fix="fix it")

    seen: list = []
    base = recording(seen)
    state = State()
    PyinfraIntegration(base.handlers, base.per_run, base.select, refuse).install(state)
    with pytest.raises(InputError):
        state.init(Inventory((["h1"], {})), Config())
    assert [s[0] for s in seen] == ["early"]  # never the objects that need the check
    assert not integration.is_checked(state)


def test_a_deploy_file_runs_only_on_a_checked_state():
    state = State()
    with ctx_state.use(state):
        with pytest.raises(ToolError) as err:
            hooks.require_checked(str(REPO / "deploy.py"))
        assert "config.py was not loaded" in str(err.value)
        setattr(state, integration.CHECKED_ATTR, True)
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

"""An explicit run object for a test that drives the stages, the operations or the facts on a
pyinfra State of its own (no ``config.py``, no ``State.init`` of the hooks): made as a run's
start makes it (``hooks.new_run``) and attached to the State (``integration.attach_run``).
A lookup of the run object, or of one of its parts, where none is attached raises; nothing
makes one for a test that forgot it.
"""

from __future__ import annotations

import atexit
import tempfile
from pathlib import Path

from sglang_deploy.controller import routing
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.integration import hooks, integration

_folder: tempfile.TemporaryDirectory | None = None


def _scratch() -> Path:
    """A folder of this test process for the journals of runs that name none (removed at
    exit): a test's run never writes into the project's folder."""
    global _folder
    if _folder is None:
        _folder = tempfile.TemporaryDirectory(prefix="sglang-deploy-run-")
        atexit.register(_folder.cleanup)
    return Path(_folder.name)


def start(state, spec: RunSpec | None = None, dry: bool = False, fleet=None,
          checked: bool = True, cwd=None) -> integration.ThisRun:
    """Attach a run object to STATE (SPEC: a deploy when None; DRY: pyinfra's ``--dry``) and,
    when CHECKED, give it FLEET (default: the Fleet of STATE's inventory) as the data check
    does. Its journal is SPEC's, else one under CWD (default: a scratch folder)."""
    spec = spec or RunSpec()
    if spec.journal is None and cwd is None:
        cwd = tempfile.mkdtemp(dir=_scratch())
    run = integration.attach_run(state, hooks.new_run(spec, dry=dry, cwd=cwd, state=state))
    if checked:
        run.checked(fleet if fleet is not None else routing.fleet_of(state.inventory))
    return run


def bare_state(spec: RunSpec | None = None, dry: bool = False):
    """A stand-in for a pyinfra State that holds only its run object (not checked: no
    Fleet), for a fake Host whose reads are kept in its run (``facts.read_host_state``)."""
    from types import SimpleNamespace

    state = SimpleNamespace()
    start(state, spec, dry=dry, checked=False)
    return state

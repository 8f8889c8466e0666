"""Everything this project does to pyinfra, in one object: ``PyinfraIntegration``.

``config.py`` calls ``hooks.install(state)``, which is ``hooks.INTEGRATION.install(state)``;
nothing else in the package changes pyinfra. ``install`` is idempotent (a second call on the
same State does nothing; the process-wide parts are checked before they are applied). What it
does, each with what it replaces, why, and how to remove it:

1. **Speed-ups** (``pyinfrafast``; pinned pyinfra only, ``PYINFRA_VERSION``): three of
   pyinfra's functions are replaced, in every module that looks them up (``SPEEDUPS``), by
   functions that return the same values. Why: they halve the controller's CPU on a no-op
   deploy: 59 ms per host with them, 121 ms without (32 hosts; 16 hosts: 90 vs 154 ms;
   docs/performance.md, "pyinfrafast removed vs kept"). Round trips and bytes are the same
   either way. docs/design.md, "What is done to pyinfra", words each as an upstream issue.
   On any other pyinfra version they are left out and ``install`` says so once on stderr
   (``speedups_off_warning``); ``tests/unit/test_integration.py`` fails when the installed
   pyinfra is not the pin of pyproject.toml and uv.lock, or when the source of a replaced
   function or of one of its callers differs from what was checked (``Replacement``).
   Remove: delete ``install_speedups()`` from ``install`` (and pyinfrafast.py).
2. **State.init wrapped** (``_wrap_init``): as soon as pyinfra has the inventory, and before
   ``connect_all``, the run's spec is read (``read_spec``), the run object (``ThisRun``: the
   spec, ``--dry``, the journal, the outcome recorder, the groups' runs, the hosts' reads)
   is made (``begin``) and attached to the State, the run's callback handlers are added
   (the recorder last; ``ReleaseRun`` drops the run object once the last connected host
   disconnected), every host's data is checked (``check``; an input error ends the run as
   one: ``inputerror``) and the check's ``Fleet`` given to the run object, which marks the
   run checked (``is_checked``: deploy files refuse to run on a State that is not). Why:
   pyinfra has no hook between building the inventory and connecting, and no place for a
   deploy's own per-run data (the run object is the one per-run attribute of ours on a
   State, ``RUN_ATTR``; ``INSTALLED_ATTR`` marks a State the integration is installed on). Remove: only with the data checks, which would then happen on the first
   operation, after connecting.
3. **--limit of a group name** (``select``, called before pyinfra's own ``init``): a
   multi-node group's name selects its nodes. Remove: drop ``select`` (the name must then
   be a pyinfra group).
4. **gevent's hub** (``install_hub_errors``): ``ToolError`` (our typed errors as pyinfra's
   kind) is added to the hub's ``NOT_ERROR``, so that one raised in a connecting greenlet is
   reported by pyinfra's CLI as an error, not printed by gevent as a traceback first. Remove:
   delete the call; such an error then shows a traceback before pyinfra's message.
5. **Log records** (``install_log_filters``, on pyinfra's logger): ``TypedErrorsWithoutTraceback``
   keeps only the text of our typed errors raised in a ``python.call`` (pyinfra logs the
   traceback and ``Unexpected error in Python callback: X(...)``); ``NoLimitWarnings`` drops
   ``No host matches found for --limit pattern`` (the pattern may be a group's name, and a
   pattern matching nothing stops the run with its own error). Remove: delete the call; the
   output then carries those lines again. The test checks that pyinfra still logs both.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback

from sglang_deploy.core import errors, runspec
from sglang_deploy.integration import pyinfrafast
from sglang_deploy.integration.pyinfraerror import ToolError, translated

#: the pyinfra version the speed-ups were checked against (pyproject.toml and uv.lock pin it)
PYINFRA_VERSION = "3.10.0"


# ---------------------------------------------------------------------------- the speed-ups
@dataclass(frozen=True)
class Replacement:
    """pyinfra's ``ORIGINAL`` (module.function, whose source hashes to ``SHA256``, the first 16
    hex digits) replaced by ``BY`` as the global ``NAME`` of each module of ``WHERE``, which
    look it up when called: ``CALLERS`` (module.function: source sha256) are the functions
    that do, checked too, so that a pyinfra that stops looking the name up is noticed."""

    name: str
    by: Callable
    original: str
    sha256: str
    where: tuple[str, ...]
    callers: tuple[tuple[str, str], ...]


SPEEDUPS = (
    Replacement("get_operation_order_from_stack", pyinfrafast.from_caller,
                "pyinfra.api.util.get_operation_order_from_stack", "af13fe995eb540e3",
                ("pyinfra.api.operation",),
                (("pyinfra.api.operation.solve_operation_consistency", "3c54b98d907af8d1"),)),
    Replacement("all_global_arguments", pyinfrafast.global_arguments,
                "pyinfra.api.arguments.all_global_arguments", "e2f365132720e833",
                ("pyinfra.api.arguments", "pyinfra.api.facts"),
                (("pyinfra.api.arguments.pop_global_arguments", "acc87f2f3d5006e4"),)),
    Replacement("pop_global_arguments", pyinfrafast.pop_global_arguments,
                "pyinfra.api.arguments.pop_global_arguments", "acc87f2f3d5006e4",
                ("pyinfra.api.operation", "pyinfra.api.deploy", "pyinfra.api.facts"),
                (("pyinfra.api.operation._wrap_operation", "ab90364ac758c3c8"),
                 ("pyinfra.api.deploy._wrap_deploy", "925e8ce06b2ddf3c"),
                 ("pyinfra.api.facts._handle_fact_kwargs", "b4b78457792bca21"))),
)


def _places() -> list[tuple[Any, str, Callable]]:
    """(module, name, replacement) of every place the speed-ups go."""
    # imported for sys.modules: pyinfra.api.operation and .deploy are also decorators' names
    import pyinfra.api.arguments
    import pyinfra.api.deploy
    import pyinfra.api.facts
    import pyinfra.api.operation  # noqa: F401

    return [(sys.modules[m], r.name, r.by) for r in SPEEDUPS for m in r.where]


def installed_version() -> str:
    import pyinfra

    return str(getattr(pyinfra, "__version__", "unknown"))


def install_speedups(version: str | None = None) -> bool:
    """Put the speed-ups in place when the installed pyinfra (VERSION) is the pin and every
    place still exists; True when they are in place (a second call changes nothing)."""
    places = _places()
    if all(getattr(module, name, None) is by for module, name, by in places):
        return True
    if (version or installed_version()) != PYINFRA_VERSION or not all(
            hasattr(module, name) for module, name, _ in places):
        return False
    for module, name, by in places:
        setattr(module, name, by)
    return True


def speedups_off_warning(version: str) -> str:
    return (f"sglang-deploy: warning: pyinfra {version} is installed, this project pins and "
            f"tests {PYINFRA_VERSION}: its speed-ups of pyinfra (integration/pyinfrafast.py) are off, "
            "so the controller spends about twice the CPU per host; the deploy itself is "
            f"unchanged (fix: install the pin, `uv sync --frozen`, or recheck the speed-ups "
            f"against {version}: tests/unit/test_integration.py)")


# ------------------------------------------------------------------ gevent's hub, log records
def install_hub_errors() -> None:
    """A ``ToolError`` raised in a greenlet is not an error for gevent's hub to print."""
    hub = gevent.get_hub()
    if ToolError not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, ToolError)


class TypedErrorsWithoutTraceback(logging.Filter):
    """pyinfra logs an exception raised in a Python callback (``python.call``) as a traceback,
    then `Unexpected error in Python callback: X(...)`. For this tool's typed errors the
    traceback is noise: keep only the error's own text (expected / found / fix)."""

    _tail = re.compile(r"^sglang_deploy\.core\.errors\.\w+: ", re.MULTILINE)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - never break logging
            return True
        if text.startswith("Traceback (most recent call last):"):
            m = self._tail.search(text)
            if m:
                record.msg, record.args = text[m.end():], ()
            return True
        return not ("Unexpected error in Python callback: " in text
                    and any(f": {name}(" in text for name in errors.__all__))


class NoLimitWarnings(logging.Filter):
    """pyinfra's `No host matches found for --limit pattern: X` comes before the hooks know
    the inventory: X may be a multi-node group's name (``hooks._group_limit``), and a pattern
    that matches nothing stops the run with its own error (``hooks.check_selection``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return "No host matches found for --limit pattern" not in record.getMessage()
        except Exception:  # noqa: BLE001 - never break logging
            return True


LOG_FILTERS = (TypedErrorsWithoutTraceback, NoLimitWarnings)


def install_log_filters() -> None:
    """Each of ``LOG_FILTERS`` once on pyinfra's logger."""
    present = {type(f) for f in logger.filters}
    for kind in LOG_FILTERS:
        if kind not in present:
            logger.addFilter(kind())


# ------------------------------------------------------------------------- the run object
@dataclass(frozen=True, eq=False, kw_only=True)
class ThisRun:
    """The run object: everything of one pyinfra run that is this project's, in one place.
    Made when the run starts (the integration's ``begin``: ``hooks.begin``), attached once
    to its State (``PyinfraIntegration.start``), released once its last connected host
    disconnected (``ReleaseRun``): nothing of a run outlives it, nothing of it lives in a
    module. Every reader gets its part from it (``this_run()``, ``run_of(state)``); where
    none is attached the lookup raises (``UsageError``: a deploy file run without the
    project's config.py), it never makes a default.

    - ``spec``: what the run was asked to do (``core/runspec.py``); ``dry``: pyinfra's
      ``--dry``; ``read_only``: either;
    - ``journal``: the run journal's one writer (``integration/journal.py``);
    - ``recorder``: each host's outcome recorder, writing into that journal
      (``integration/outcomes.py``), the run's last callback handler;
    - ``groups``: the multi-node groups' runs (``stages/group/groupops.GroupRuns``);
    - ``reads``: each host's fact reads of this run (``hostops/facts.HostReads``);
    - ``fleet``: every host's checked Settings and the groups planned once
      (``controller/routing.Fleet``), given once by the data check (``checked``), before
      any connection; asked before that, it raises.
    """

    spec: runspec.RunSpec
    dry: bool = False
    # the parts' modules look their part up here, so their types are not imported (an
    # import, even a type checker's, would be an import circle: tests/unit/test_imports.py)
    journal: Any  # integration.journal.Writer
    recorder: Any  # integration.outcomes.Recorder (a pyinfra callback handler)
    groups: Any  # stages.group.groupops.GroupRuns
    reads: Any  # hostops.facts.HostReads
    #: the run's Fleet once its hosts were checked (``checked``: set once, never replaced)
    _fleet: list = field(default_factory=list, repr=False)

    @property
    def read_only(self) -> bool:
        """The run changes nothing: ``--dry`` or a plan run. A read-only run never touches a
        serving host's GPUs (``preflight.probe_plan``)."""
        return self.dry or self.spec.planning

    @property
    def is_checked(self) -> bool:
        """Whether the run's hosts were checked (deploy files refuse to run before)."""
        return bool(self._fleet)

    def checked(self, fleet: Any) -> None:
        """The run's hosts were checked: FLEET (their Settings as checked) is the run's."""
        if self._fleet:
            raise RuntimeError("a bug of sglang-deploy: a run's hosts were checked twice")
        self._fleet.append(fleet)

    @property
    def fleet(self) -> Any:
        """The run's one ``Fleet`` (each host's Settings resolved once, by the check)."""
        if not self._fleet:
            raise errors.UsageError(
                what="the run's Fleet, given by the check of every host's data when the run "
                     "starts (before any connection)",
                found="it was asked for before that check ended: nothing of the hosts' data "
                      "is known yet",
                fix="read the Fleet in a stage or an operation (after the check), or, where "
                    "a run object is made by hand, give it its Fleet (``ThisRun.checked``)")
        return self._fleet[0]


#: the attribute of a State that holds its run object (``ThisRun``)
RUN_ATTR = "_sglang_deploy_run"


def attach_run(state, run: ThisRun) -> ThisRun:
    """Give STATE its run object (once a run: the integration does, when the run starts);
    a State that holds one already is a bug (its run is not over: ``release_run``)."""
    if getattr(state, RUN_ATTR, None) is not None:
        raise RuntimeError("a bug of sglang-deploy: a second run object for a pyinfra State "
                           "whose run object was not released")
    setattr(state, RUN_ATTR, run)
    return run


def release_run(state) -> None:
    """Drop STATE's run object (once its run ended: what it wrote stays in its files)."""
    if hasattr(state, RUN_ATTR):
        delattr(state, RUN_ATTR)


def run_of(state) -> ThisRun:
    """STATE's run object; raises ``UsageError`` where there is none (a State that did not
    start through this project's config.py, or whose run ended: nothing of the run is
    known, nothing is guessed)."""
    run = getattr(state, RUN_ATTR, None)
    if run is None:
        raise errors.UsageError(
            what="a pyinfra run started with this project's config.py (its run object: the "
                 "run's spec, journal, outcome recorder, Fleet, groups and reads, attached "
                 "when pyinfra's State starts)",
            found="no run object on this pyinfra State: its run was not started by the "
                  "project's hooks (``hooks.install``), or it has ended",
            fix="run pyinfra from the project folder (it loads ./config.py); where a State is "
                "made by hand, attach its run object first "
                "(``integration.attach_run(state, hooks.new_run(spec))``)")
    return run


def this_run() -> ThisRun:
    """The run object of the pyinfra run in progress (pyinfra's context State); raises where
    there is none (``run_of``)."""
    from pyinfra import state

    return run_of(state)


def read_spec(inventory) -> runspec.RunSpec:
    """The run's spec: the file named by pyinfra's ``--data _sglang_deploy_run=PATH``
    (``runspec.DATA_KEY``; by hand, the spec's JSON object itself may stand there), which is
    taken out of the inventory's override data (it is no host's data); the default spec (a
    deploy) when the command line names none. A file that cannot be read, or is no spec,
    raises ``UsageError``."""
    override = inventory.get_override_data()
    path = override.pop(runspec.DATA_KEY, None)
    if path is None:
        return runspec.RunSpec()
    if isinstance(path, dict):  # pyinfra parsed the JSON given in place of a path
        return runspec.from_json(json.dumps(path), f"--data {runspec.DATA_KEY}=JSON")
    if not isinstance(path, str):
        raise errors.UsageError(
            what=f"--data {runspec.DATA_KEY}=PATH to name the run spec's file (or give its "
                 "JSON object)", found=repr(path),
            fix="start the run with an `sglang-deploy` command, which writes it")
    where = f"the run spec {path} (--data {runspec.DATA_KEY}=PATH)"
    try:
        with open(str(path)) as f:
            text = f.read()
    except OSError as exc:
        raise errors.UsageError(
            what=f"{where} to be a readable file", found=f"{type(exc).__name__}: {exc}",
            fix="start the run with an `sglang-deploy` command, which writes it, or drop "
                f"the `--data {runspec.DATA_KEY}=...` argument (a deploy)") from exc
    return runspec.from_json(text, where)


# ------------------------------------------------------------------------- the run's start
@dataclass(frozen=True)
class RunStart:
    """What the run's start gets: its State and inventory, the hosts selected (None: all),
    pyinfra's folder, whether the run is ``--dry`` and the run's spec (``read_spec``)."""

    state: Any
    inventory: Any
    initial_limit: Any
    cwd: str | None
    dry: bool
    spec: runspec.RunSpec = field(default_factory=runspec.RunSpec)


class ReleaseRun(BaseStateCallback):
    """Drops the run object from its State (``release_run``) once the run's last connected
    host disconnects. It comes before the recorder among the handlers: the recorder keeps
    its own journal for that last host's record."""

    def __init__(self) -> None:
        self.connected: set[str] = set()

    def host_connect(self, state, host):  # type: ignore[override]
        self.connected.add(host.name)

    def host_disconnect(self, state, host):  # type: ignore[override]
        self.connected.discard(host.name)
        if not self.connected:
            release_run(state)


#: the attribute of a State the integration is installed on (``install`` is idempotent)
INSTALLED_ATTR = "_sglang_deploy_integration"


def is_checked(state) -> bool:
    """True while STATE's run has checked its hosts (its run object says so)."""
    run = getattr(state, RUN_ATTR, None)
    return run is not None and run.is_checked


def cli_params() -> dict:
    """The arguments of the running pyinfra command line (click's context: ``inventory``,
    ``limit``...), or {} outside the pyinfra CLI."""
    import click

    ctx = click.get_current_context(silent=True)
    return dict(ctx.params) if ctx is not None else {}


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the object
@dataclass(frozen=True)
class PyinfraIntegration:
    """Everything done to pyinfra (the module docstring), for one project: BEGIN makes the
    run object (``ThisRun``) of a run that starts (given its ``RunStart``), HANDLERS the
    run's callback handlers (given the ``ReleaseRun`` to place among them and the
    ``RunStart``), SELECT turns pyinfra's initial limit into the run's, CHECK checks the run
    (``RunStart``) before any connection and returns its ``Fleet`` (each host's Settings as
    checked)."""

    handlers: Callable[[BaseStateCallback, RunStart], list]
    begin: Callable[[RunStart], ThisRun]
    select: Callable[[Any, Any], Any]
    check: Callable[[RunStart], Any]

    def install(self, state, warn: Callable[[str], None] = _stderr) -> None:
        """Install everything on STATE (before ``State.init``: config.py). Once per State;
        WARN is told once, in that first call, when the speed-ups are off."""
        if getattr(state, INSTALLED_ATTR, None) is self:
            return
        version = installed_version()
        if not install_speedups(version):  # before any operation is added
            warn(speedups_off_warning(version))
        install_log_filters()
        install_hub_errors()
        self._wrap_init(state)
        setattr(state, INSTALLED_ATTR, self)

    def _wrap_init(self, state) -> None:
        original = state.init

        @translated()
        def init(inventory, config, initial_limit=None, **kwargs):
            from sglang_deploy.integration import inputerror

            try:
                spec = read_spec(inventory)  # first: the spec is no host's data
            except errors.UsageError as exc:
                raise inputerror.InputError(exc) from exc
            initial_limit = self.select(inventory, initial_limit)
            result = original(inventory, config, initial_limit=initial_limit, **kwargs)
            self.start(RunStart(state, inventory, initial_limit, state.cwd,
                                dry=bool(cli_params().get("dry")), spec=spec))
            return result

        state.init = init

    def start(self, start: RunStart) -> None:
        """The run object (``begin``) attached to the run's State, the run's handlers and
        then its recorder added, its hosts checked and the check's Fleet given to the run
        object (a typed input error ends the run as one, exit status 2: ``inputerror``)."""
        from sglang_deploy.integration import inputerror

        run = attach_run(start.state, self.begin(start))
        # the handlers first: the recorder comes last and sees what they noted
        for handler in [*self.handlers(ReleaseRun(), start), run.recorder]:
            if handler is not None:
                start.state.add_callback_handler(handler)
        try:
            run.checked(self.check(start))
        except errors.SglangDeployError as exc:
            if not inputerror.is_input_error(exc):
                raise
            raise inputerror.InputError(exc) from exc

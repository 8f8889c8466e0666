"""Outcome records: each host's result of a pyinfra run, written by the run itself.

Each record is its host's ``outcome`` in the run journal (``integration/journal.py``: the file the
command names in its run spec's ``journal``, ``core/runspec.py``, rewritten atomically, so a
reader sees a whole record or the previous one), beside the host's plan, verification summary and bench entry.
The record's shape and the decision made from it are ``core/outcome.py``; the commands read
them with ``journal.read(PATH).outcomes(HOSTS)``.

Who writes, in the pyinfra process (``Recorder``, a part of the run object with its journal,
``integration.ThisRun``, made when the run starts: ``hooks.begin``; every function here finds
it there, and raises where no run object is attached):

- a connection that fails (``host_connect_error``): ``unreachable``, with the connector's
  message; a deploy lock held by another run (``hooks.HoldDeployLock``) and a host's invalid
  data (``hooks.validate_inventory``): ``failed``, with the typed error;
- each stage (``stage``, around the stages of deploy.py, rollback.py and preflight.py) on
  entry (``running``, the stage reached) and when it raises while its operations are
  prepared (``failed``, the typed error, or an untyped exception's type and message);
- an operation that fails on the host (``operation_host_error``): ``failed``, with the typed
  error ``operations.reported`` noted for it, else the operation's name and output;
- the service stage's restart decision (``decided``): whether the server restarts and why
  (``core.restart``), in every record of the host from then on;
- a verification that passed (``verified``): its summary and action, kept for the end;
- the end of the host's connection (``host_disconnect``): ``passed`` when pyinfra ran every
  operation (or, with ``--dry``, prepared every host) and the host did not fail, else
  ``interrupted``, saying which host stopped the run. After the last host the run object,
  recorder and journal with it, is released from the State (``integration.ReleaseRun``:
  nothing of a run outlives it; the recorder keeps its own journal for the records of that
  last host).

A record still ``running`` after the run means the process was killed there.
"""

from __future__ import annotations

import functools
from typing import Any

from pyinfra.api.state import BaseStateCallback, StateStage

from sglang_deploy.core import journal as shape
from sglang_deploy.core import outcome
from sglang_deploy.core.errors import SglangDeployError
from sglang_deploy.integration import journal, pyinfraerror
from sglang_deploy.integration.integration import this_run

# ------------------------------------------------------------------ in the pyinfra process

_PHASES = {StateStage.Setup: "connect", StateStage.Connect: "connect",
           StateStage.Prepare: "prepare", StateStage.Execute: "execute",
           StateStage.Disconnect: "done"}


class Recorder(BaseStateCallback):
    """Writes each host's record into the run's journal as the run goes (see the module's
    text). One per run: a part of its run object (``integration.ThisRun.recorder``)."""

    def __init__(self, writer: journal.Writer, dry: bool = False, state=None) -> None:
        self.journal = writer
        self.dry = dry
        self.state = state
        self.last: dict[str, dict] = {}  # host -> the record last written
        self.stage: dict[str, str] = {}  # host -> the stage reached
        self.summary: dict[str, dict] = {}  # host -> its verification summary
        self.pending: dict[str, Any] = {}  # host -> error noted for the failing operation
        self.op_stage: dict[tuple[str, str], str] = {}  # (host, op hash) -> its stage
        self.failed_op: dict[str, str] = {}  # host -> the op hash that failed on it
        self.restart: dict[str, dict] = {}  # host -> its restart decision (``decided``)

    # -------------------------------------------------------------- writing
    def phase(self) -> str:
        current = getattr(self.state, "current_stage", None)
        return _PHASES.get(current, "prepare")

    def write(self, host: str, kind: str, **kw) -> dict:
        stage = kw.pop("stage", None) or self.stage.get(host) or "connect"
        summary = kw.pop("summary", None) or self.summary.get(host)
        rec = outcome.record(host, kind, stage, phase=self.phase(), dry=self.dry,
                             summary=summary, restart=self.restart.get(host), **kw)
        self.last[host] = rec
        self.journal.put(host, shape.OUTCOME, rec)
        return rec

    def is_final(self, host: str) -> bool:
        return (self.last.get(host) or {}).get("outcome") in outcome.FINAL

    def enter(self, host: str, stage: str) -> None:
        self.stage[host] = stage
        if not self.is_final(host):
            self.write(host, outcome.RUNNING, stage=stage)

    def failed(self, host: str, error: BaseException | dict, stage: str | None = None) -> None:
        """HOST failed with ERROR (an exception, or a record's ``error``) in STAGE."""
        if self.is_final(host):
            return
        self.write(host, outcome.FAILED, stage=stage,
                   error=error if isinstance(error, dict) else outcome.error_of(error))

    def verified(self, host: str, summary: dict) -> None:
        self.summary[host] = dict(summary)
        if not self.is_final(host):
            self.write(host, outcome.RUNNING, action=summary.get("action"))

    # -------------------------------------------------------------- pyinfra callbacks
    def host_connect(self, state, host):  # type: ignore[override]
        self.state = state
        self.enter(host.name, "connect")

    def host_connect_error(self, state, host, error):  # type: ignore[override]
        self.state = state
        message = str(error.args[0]) if getattr(error, "args", None) else str(error)
        self.write(host.name, outcome.UNREACHABLE, stage="connect",
                   error=outcome.unreachable_error(message))

    def operation_host_start(self, state, host, op_hash):  # type: ignore[override]
        stage = self.op_stage.get((host.name, op_hash))
        if stage and stage != self.stage.get(host.name):
            self.enter(host.name, stage)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):  # type: ignore[override]
        if state.get_op_data_for_host(host, op_hash).global_arguments.get("_ignore_errors"):
            self.pending.pop(host.name, None)
            return
        noted = self.pending.pop(host.name, None)
        stage = self.op_stage.get((host.name, op_hash))
        if noted is None:
            self.failed_op[host.name] = op_hash
            noted = outcome.operation_error(_op_name(state, op_hash))
        self.failed(host.name, noted, stage)

    def host_disconnect(self, state, host):  # type: ignore[override]
        self.state = state
        name = host.name
        if self.is_final(name):
            if name in self.failed_op and self.last[name]["outcome"] == outcome.FAILED:
                meta = state.get_op_data_for_host(host, self.failed_op[name]).operation_meta
                if meta.is_complete():
                    self.last[name]["error"] = outcome.operation_error(
                        _op_name(state, self.failed_op[name]),
                        meta.stderr_lines or meta.stdout_lines)
                    self.journal.put(name, shape.OUTCOME, self.last[name])
            return
        if host in state.failed_hosts:
            self.write(name, outcome.FAILED, error={
                "type": "HostFailed",
                "message": f"pyinfra failed {name} in the {self.stage.get(name, 'connect')} "
                           "stage (a command or a fact failed there; its output is in the log)"})
            return
        finished = state.current_stage == StateStage.Disconnect
        prepared = (self.dry and state.current_stage == StateStage.Prepare
                    and not any(self.is_final(h) and self.last[h]["outcome"] == outcome.FAILED
                                for h in self.last))
        if finished or prepared:
            self.write(name, outcome.PASSED, action=self.action(state, host, finished))
            return
        stoppers = sorted(h for h in self.last if h != name and self.is_final(h)
                          and self.last[h]["outcome"] != outcome.PASSED)
        self.write(name, outcome.INTERRUPTED, note=(
            f"the run stopped when {', '.join(stoppers)} failed, before this host finished"
            if stoppers else "the run stopped before this host finished (interrupted, or a "
                             "pyinfra error)"))

    def action(self, state, host, executed: bool) -> str | None:
        """The verified action, else whether the host's operations changed anything."""
        if host.name in self.summary:
            return self.summary[host.name].get("action")
        if not executed:
            return None
        for data in state.ops.get(host, {}).values():
            meta = data.operation_meta
            if meta.is_complete() and meta.did_change():
                return "changed"
        return "unchanged"


def _op_name(state, op_hash: str) -> str:
    names = sorted(state.get_op_meta(op_hash).names)
    return names[0] if names else op_hash


def recorder() -> Recorder:
    """The recorder of the pyinfra run in progress (its run object's:
    ``integration.this_run``; none attached raises ``UsageError``: a run without this
    project's ``config.py``)."""
    return this_run().recorder


def stage(name: str):
    """Decorate a stage (a ``@deploy`` function): the host's record names it as the stage
    reached, its operations run under its name, and an exception while it prepares them is
    the host's failure (one of ours raised on to pyinfra as its own kind: ``pyinfraerror``)."""

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with pyinfraerror.translated():  # no run object: a pyinfra error, no traceback
                rec = recorder()
            from pyinfra import host

            before = len(host.op_hash_order)
            rec.enter(host.name, name)
            try:
                return function(*args, **kwargs)
            except SglangDeployError as exc:
                rec.failed(host.name, exc, name)
                raise pyinfraerror.for_pyinfra(exc) from exc
            except Exception as exc:
                rec.failed(host.name, exc, name)
                raise
            finally:
                for op_hash in host.op_hash_order[before:]:
                    rec.op_stage[(host.name, op_hash)] = name

        return wrapper

    return decorate


def note_error(host_name: str, error: BaseException | dict) -> None:
    """The error of the operation now failing on HOST_NAME (``operations.reported``): the
    host's record gets it, not just the operation's name."""
    recorder().pending[host_name] = error


def failed(host_name: str, error: BaseException | dict, stage: str) -> None:
    """HOST_NAME failed outside any stage (its deploy lock, its connection)."""
    recorder().failed(host_name, error, stage)


def decided(host_name: str, record: dict, restarts: bool) -> None:
    """The service stage's restart decision for HOST_NAME (``core.restart.record``: its
    ``why`` and ``reasons``; RESTARTS: whether its server restarts): kept in each record the
    host gets from now on."""
    recorder().restart[host_name] = {"restart": bool(restarts), **record}


def verified(summary: dict) -> None:
    """The verifier passed on ``summary["host"]``: its summary and action for the record."""
    recorder().verified(summary["host"], summary)

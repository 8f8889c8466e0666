"""Outcome records: each host's result of a pyinfra run, written by the run itself.

The same hand-over as the plan records (``shell/plan.py``) and the verification summaries
(``report.emit``): the command names a folder in the environment of its pyinfra subprocess
(``SGLANG_DEPLOY_OUTCOMES``; default ``.sglang-deploy/outcomes`` of the run's folder), and
the run writes one JSON file per host there (atomically: a reader sees a whole record or the
previous one). The record's shape and the decision made from it are ``core/outcome.py``.

Who writes, in the pyinfra process (``Recorder``, installed by ``hooks.install``):

- a connection that fails (``host_connect_error``): ``unreachable``, with the connector's
  message; a deploy lock held by another run (``hooks.HoldDeployLock``) and a host's invalid
  data (``hooks.validate_inventory``): ``failed``, with the typed error;
- each stage (``stage``, around the stages of deploy.py, rollback.py and preflight.py) on
  entry (``running``, the stage reached) and when it raises while its operations are
  prepared (``failed``, the typed error, or an untyped exception's type and message);
- an operation that fails on the host (``operation_host_error``): ``failed``, with the typed
  error ``operations.reported`` noted for it, else the operation's name and output;
- a verification that passed (``verified``): its summary and action, kept for the end;
- the end of the host's connection (``host_disconnect``): ``passed`` when pyinfra ran every
  operation (or, with ``--dry``, prepared every host) and the host did not fail, else
  ``interrupted``, saying which host stopped the run.

A record still ``running`` after the run means the process was killed there.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from pyinfra.api.state import BaseStateCallback, StateStage

from sglang_deploy.core import outcome
from sglang_deploy.core.errors import SglangDeployError
from sglang_deploy.shell import pyinfraerror

OUTCOMES_ENV = "SGLANG_DEPLOY_OUTCOMES"
DEFAULT_DIR = Path(".sglang-deploy/outcomes")


def outcome_dir(cwd: str | os.PathLike | None = None) -> Path:
    """The folder the records of this run go to (``$SGLANG_DEPLOY_OUTCOMES``, or the default
    under CWD)."""
    value = os.environ.get(OUTCOMES_ENV)
    return Path(value) if value else Path(cwd or ".") / DEFAULT_DIR


def write_json(folder: Path, name: str, doc: dict) -> Path:
    """Write DOC as FOLDER/NAME.json atomically (a temporary file renamed over it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = folder / f".{name}.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read(folder: str | os.PathLike, hosts: list[str]) -> dict[str, outcome.HostOutcome]:
    """The outcome of each of HOSTS from the records in FOLDER (``outcome.decide``)."""
    out = {}
    for name in hosts:
        path = Path(folder) / f"{name}.json"
        try:
            rec = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            rec = None
        out[name] = outcome.decide(name, rec)
    return out


# ------------------------------------------------------------------ in the pyinfra process

_PHASES = {StateStage.Setup: "connect", StateStage.Connect: "connect",
           StateStage.Prepare: "prepare", StateStage.Execute: "execute",
           StateStage.Disconnect: "done"}


class Recorder(BaseStateCallback):
    """Writes each host's record as the run goes (see the module's text). One per pyinfra
    process (``install``)."""

    def __init__(self, folder: Path, dry: bool = False) -> None:
        self.folder = folder
        self.dry = dry
        self.state = None
        self.last: dict[str, dict] = {}  # host -> the record last written
        self.stage: dict[str, str] = {}  # host -> the stage reached
        self.summary: dict[str, dict] = {}  # host -> its verification summary
        self.pending: dict[str, Any] = {}  # host -> error noted for the failing operation
        self.op_stage: dict[tuple[str, str], str] = {}  # (host, op hash) -> its stage
        self.failed_op: dict[str, str] = {}  # host -> the op hash that failed on it

    # -------------------------------------------------------------- writing
    def phase(self) -> str:
        current = getattr(self.state, "current_stage", None)
        return _PHASES.get(current, "prepare")

    def write(self, host: str, kind: str, **kw) -> dict:
        stage = kw.pop("stage", None) or self.stage.get(host) or "connect"
        summary = kw.pop("summary", None) or self.summary.get(host)
        rec = outcome.record(host, kind, stage, phase=self.phase(), dry=self.dry,
                             summary=summary, **kw)
        self.last[host] = rec
        write_json(self.folder, host, rec)
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
                    write_json(self.folder, name, self.last[name])
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


#: the recorder of this pyinfra process (``install``); None outside a pyinfra run with
#: this project's config.py
_recorder: Recorder | None = None


def install(state, cwd: str | None, dry: bool) -> Recorder:
    """The recorder of this run, writing to ``outcome_dir(CWD)`` (``hooks.install``)."""
    global _recorder
    _recorder = Recorder(outcome_dir(cwd), dry=dry)
    _recorder.state = state
    return _recorder


def stage(name: str):
    """Decorate a stage (a ``@deploy`` function): the host's record names it as the stage
    reached, its operations run under its name, and an exception while it prepares them is
    the host's failure (one of ours raised on to pyinfra as its own kind: ``pyinfraerror``)."""

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            rec = _recorder
            if rec is None:
                with pyinfraerror.translated():
                    return function(*args, **kwargs)
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
    if _recorder is not None:
        _recorder.pending[host_name] = error


def failed(host_name: str, error: BaseException | dict, stage: str) -> None:
    """HOST_NAME failed outside any stage (its data, its deploy lock)."""
    if _recorder is not None:
        _recorder.failed(host_name, error, stage)


def verified(summary: dict) -> None:
    """The verifier passed on ``summary["host"]``: its summary and action for the record."""
    if _recorder is not None:
        _recorder.verified(summary["host"], summary)

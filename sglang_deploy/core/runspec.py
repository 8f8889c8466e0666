"""The run spec: everything a command of this tool tells the pyinfra run it starts, in one
frozen record (pure: no I/O).

A command (``commands/``, through ``controller/runner.py``) writes the spec to one file and names
it by one argument of the pyinfra command line, ``--data _sglang_deploy_run=PATH``
(``DATA_KEY``). The integration object reads it once, when pyinfra's State starts, and the
run's stages find it on the run object (``integration/integration.py``: ``ThisRun``). A plain
``pyinfra INVENTORY deploy.py`` by hand names no spec and runs with the default one: a
deploy, the journal and the reports in their default folders.

The modes (``mode``):

- ``deploy``: converge every selected host (the default);
- ``plan``: read only (``status``, ``doctor``, ``rollout --dry``): each host's drift and
  pre-flight recorded in the journal, no deploy lock, every host prepared to the end;
- ``stage``: the rollout's staging run, nothing serving touched (``stages/staging.py``);
- ``roll``: a staged rollout's rolling run: a deploy that trusts what this rollout's staging
  run proved (its staging records).

Besides the mode: the rolling gate (``gate``: its file, the rollout's pid, the deadline;
``stages/rollgate.py``), the journal file (``journal``), the reports folder (``reports``),
the bench run's id (``bench_run``), a ``--limit`` of part of a multi-node group on purpose
(``partial_group``) and pyinfra's ``-v`` count (``verbosity``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from sglang_deploy.core.errors import UsageError

#: the pyinfra ``--data`` key naming the spec's file (a leading ``_``: pyinfra's own kind of
#: key, passed by the data check; the integration object takes it out of the hosts' data)
DATA_KEY = "_sglang_deploy_run"

DEPLOY, PLAN, STAGE, ROLL = "deploy", "plan", "stage", "roll"
MODES = (DEPLOY, PLAN, STAGE, ROLL)
#: the gate's deadline when the spec gives none (seconds)
GATE_DEADLINE_S = 900.0


@dataclass(frozen=True)
class Gate:
    """A staged rollout's gate (``stages/rollgate.py``): the file the rollout writes, the
    rollout's process (0: not watched) and how long the run waits at most."""

    path: str
    pid: int = 0
    deadline_s: float = GATE_DEADLINE_S


@dataclass(frozen=True)
class RunSpec:
    """What one pyinfra run is asked to do (the module docstring)."""

    mode: str = DEPLOY
    gate: Gate | None = None
    journal: str | None = None
    reports: str | None = None
    bench_run: str | None = None
    partial_group: bool = False
    verbosity: int = 0

    def __post_init__(self) -> None:
        check(self)

    @property
    def planning(self) -> bool:
        """A plan run: read only, each host's plan in the journal."""
        return self.mode == PLAN

    @property
    def stage_only(self) -> bool:
        """The rollout's staging run: nothing serving is touched."""
        return self.mode == STAGE

    @property
    def trusts_staging(self) -> bool:
        """A rolling run after this rollout's staging run: a matching record stands."""
        return self.mode == ROLL

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_json(), sort_keys=True) + "\n"


def _refuse(field: str, wanted: str, value: Any, fix: str | None = None) -> UsageError:
    return UsageError(what=f"the run spec's `{field}` is {wanted}", found=repr(value),
                      fix=fix or f"write `{field}` as {wanted} (core/runspec.py), or start "
                                 "the run with an `sglang-deploy` command, which writes it")


def _optional_text(spec: RunSpec, name: str) -> None:
    value = getattr(spec, name)
    if value is not None and (not isinstance(value, str) or not value):
        raise _refuse(name, "a non-empty string or null", value)


def check(spec: RunSpec) -> None:
    """Raise ``UsageError`` (what, found, fix) for a spec no run can act on."""
    if spec.mode not in MODES:
        raise _refuse("mode", f"one of {', '.join(MODES)}", spec.mode)
    for name in ("journal", "reports", "bench_run"):
        _optional_text(spec, name)
    if not isinstance(spec.partial_group, bool):
        raise _refuse("partial_group", "true or false", spec.partial_group)
    if isinstance(spec.verbosity, bool) or not isinstance(spec.verbosity, int) \
            or spec.verbosity < 0:
        raise _refuse("verbosity", "a count >= 0 (pyinfra's -v)", spec.verbosity)
    gate = spec.gate
    if gate is None:
        return
    if not isinstance(gate, Gate):
        raise _refuse("gate", "an object with path, pid and deadline_s", gate)
    if spec.mode not in (DEPLOY, ROLL):
        raise _refuse("gate", f"absent in a `{spec.mode}` run (only a deploy waits at a "
                              "rollout's gate)", asdict(gate),
                      fix="drop the gate, or make the run a deploy (`mode`: deploy or roll)")
    if not isinstance(gate.path, str) or not gate.path:
        raise _refuse("gate.path", "the gate file's path", gate.path)
    if isinstance(gate.pid, bool) or not isinstance(gate.pid, int) or gate.pid < 0:
        raise _refuse("gate.pid", "the rollout's process id (0: none)", gate.pid)
    if isinstance(gate.deadline_s, bool) or not isinstance(gate.deadline_s, (int, float)) \
            or not math.isfinite(gate.deadline_s) or gate.deadline_s <= 0:
        raise _refuse("gate.deadline_s", "a number of seconds > 0", gate.deadline_s)


def from_json(text: str, where: str = "the run spec") -> RunSpec:
    """The spec in TEXT (``RunSpec.to_json``'s); WHERE names it in an error. Raises
    ``UsageError`` for text that is not a spec: not JSON, a key this tool does not know, a
    value of the wrong kind."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(what=f"{where} to be a JSON object (core/runspec.py)",
                         found=f"not JSON: {exc}",
                         fix="start the run with an `sglang-deploy` command, which writes "
                             "it, or drop the `--data " + DATA_KEY + "=...` argument") from exc
    if not isinstance(doc, dict):
        raise UsageError(what=f"{where} to be a JSON object (core/runspec.py)",
                         found=type(doc).__name__, fix="write the spec as a JSON object")
    known = {f.name for f in fields(RunSpec)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise UsageError(what=f"{where}'s keys to be among {', '.join(sorted(known))}",
                         found=f"unknown key(s): {', '.join(unknown)}",
                         fix="remove them (a spec written by another version of the tool: "
                             "rerun the command with this one)")
    gate = doc.get("gate")
    if isinstance(gate, dict):
        gate_keys = {f.name for f in fields(Gate)}
        if set(gate) - gate_keys or "path" not in gate:
            raise _refuse("gate", "an object with path (and pid, deadline_s)", gate)
        doc = {**doc, "gate": Gate(**gate)}
    elif gate is not None:
        raise _refuse("gate", "an object with path, pid and deadline_s, or null", gate)
    return RunSpec(**doc)

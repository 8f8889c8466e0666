"""One outcome record per host of every pyinfra run, and what a command decides from it.

The deploy files (deploy.py, rollback.py, preflight.py, and any pyinfra run with this
project's config.py) write, for each host, one JSON record (``integration/outcomes.py``): passed
or failed, the stage reached, the action, the typed error, the verification summary. The
commands (rollout, status, doctor) decide each host's outcome from that record, or from
its absence, never from pyinfra's printed text. This module is the pure part: the record's
shape, the error of an exception, and the decision.

A record::

    {"host": "gpu-1", "outcome": "passed" | "failed" | "unreachable" | "running"
                                 | "interrupted",
     "stage": "connect" | "data" | "preflight" | "runtime" | "service" | "verify" | "router"
              | "rollback",
     "phase": "connect" | "prepare" | "execute" | "done",
     "dry": false, "action": "started" | "restarted" | "converged" | "unchanged"
                             | "rolled-back" | "changed" | null,
     "error": null | {"type", "message", ...}, "summary": null | {...}, "note": ""}

``running`` is what a host's record says while the run is on it: a record still
``running`` after the run means the run was killed there (``interrupted``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the outcomes a record can hold
PASSED, FAILED, UNREACHABLE, RUNNING, INTERRUPTED = (
    "passed", "failed", "unreachable", "running", "interrupted")
#: what a command decides for a host: a record's outcome, or MISSING (no record at all)
MISSING = "missing"
FINAL = (PASSED, FAILED, UNREACHABLE)


def record(host: str, outcome: str, stage: str, *, phase: str = "prepare", dry: bool = False,
           action: str | None = None, error: dict[str, Any] | None = None,
           summary: dict[str, Any] | None = None,
           note: str = "", restart: dict[str, Any] | None = None) -> dict[str, Any]:
    """A host's outcome record (what ``integration/outcomes.py`` writes). RESTART: the run's restart
    decision for the host (``core.restart.record``: ``restart`` true or false, ``why`` and
    its ``reasons``), once the service stage has made it."""
    return {"host": host, "outcome": outcome, "stage": stage, "phase": phase, "dry": dry,
            "action": action, "error": error, "summary": summary, "note": note,
            "restart": restart}


def error_of(exc: BaseException) -> dict[str, Any]:
    """The record's ``error`` for EXC: a typed error's ``to_dict()`` with its full text in
    ``message``; any other exception's type name and message."""
    from sglang_deploy.core.errors import SglangDeployError

    if isinstance(exc, SglangDeployError):
        return {**exc.to_dict(), "message": exc.message}
    text = str(exc) or repr(exc)
    return {"type": type(exc).__name__, "message": text}


def unreachable_error(message: str) -> dict[str, Any]:
    """The ``error`` of a host pyinfra could not connect to (MESSAGE: the connector's)."""
    return {"type": "unreachable", "message": message or "could not connect"}


def operation_error(operation: str, output: list[str] | None = None) -> dict[str, Any]:
    """The ``error`` of an operation that failed on the host without a typed error (a command
    that exited non-zero): its name and the last lines it printed."""
    lines = [ln for ln in (output or []) if ln.strip()][-12:]
    return {"type": "OperationError", "operation": operation,
            "message": f"the operation `{operation}` failed on the host"
                       + ("\n" + "\n".join(lines) if lines else "")}


@dataclass
class HostOutcome:
    """What a command decides for one host from its record (``decide``)."""

    host: str
    kind: str  # passed | failed | unreachable | interrupted | missing
    stage: str | None = None
    action: str | None = None
    error: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    message: str = ""
    record: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def restart(self) -> dict[str, Any] | None:
        """The run's restart decision for the host (``record``'s ``restart``), None when the
        run did not reach it."""
        return (self.record or {}).get("restart")

    @property
    def passed(self) -> bool:
        return self.kind == PASSED

    @property
    def verified(self) -> bool:
        """Passed, and the verifier passed on it in this run (a summary was recorded)."""
        return self.kind == PASSED and self.summary is not None

    def error_type(self) -> str | None:
        return (self.error or {}).get("type")


def message_of(error: dict[str, Any] | None) -> str:
    """The text of a record's ERROR (a typed error's expected / found / fix lines)."""
    if not error:
        return ""
    return str(error.get("message") or error.get("what") or error.get("type") or "")


def decide(host: str, rec: dict[str, Any] | None) -> HostOutcome:
    """HOST's outcome from its record REC (None: the run left no record for it)."""
    if rec is None:
        return HostOutcome(host, MISSING, message=(
            "no outcome record: the run stopped before it reached this host (pyinfra did not "
            "start, or it stopped before connecting)"))
    kind = rec.get("outcome")
    stage, error = rec.get("stage"), rec.get("error")
    common: dict[str, Any] = {"stage": stage, "action": rec.get("action"), "error": error,
              "summary": rec.get("summary"), "record": rec}
    if kind == PASSED:
        return HostOutcome(host, PASSED, message=rec.get("note") or "", **common)
    if kind == UNREACHABLE:
        return HostOutcome(host, UNREACHABLE, message=message_of(error), **common)
    if kind == FAILED:
        return HostOutcome(host, FAILED, message=message_of(error) or
                           f"failed in the {stage} stage", **common)
    # running (the process ended there) or interrupted (the run stopped around it)
    why = rec.get("note") or "the run ended while it was on this host"
    return HostOutcome(host, INTERRUPTED, message=(
        f"no result: {why} (stage reached: {stage or 'none'}, "
        f"{rec.get('phase') or 'prepare'} phase)"), **common)

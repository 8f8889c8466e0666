"""The served model read into the page cache before a (re)start (``core.residency``).

While the operations are prepared, ``add_warm`` decides from the run's host-state read
(``residency.warm_decision``) whether the service stage adds the operation ``model_warmed``:
before the stop of a plain deploy's restart (and before a first start: ``rebuild``), and in a
rollout's staging run (before its first drain). When it executes, the operation measures the
shards and the memory again on the host (``model_warm.py measure``: the download or the install
before it may have changed both), decides again, and reads what is missing
(``model_warm.py warm``), its progress shown live. A staged rollout's rolling runs do not warm
again (``before_restart``). pyinfra runs one operation on every host
before the next: the hosts of a run, and so a multi-node group's nodes, warm at once.

A warm that fails or stops early is said (a warning) and the deploy goes on: the server then
loads from disk, as it did before there was a warm.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation

from sglang_deploy.core import modelfetch, residency
from sglang_deploy.core.hostrecords import Memory, ModelState
from sglang_deploy.hostops.operations import reported
from sglang_deploy.integration import streamed
from sglang_deploy.stages import staging
from sglang_deploy.stages.group import groupops

TOOL = "model_warm.py"


def decision(hp, restart_coming: bool) -> residency.WarmDecision:
    """The decision for HP's host (its ``hostplan.HostPlan``) while its operations are
    prepared."""
    s, hs = hp.settings, hp.hoststate
    pending = bool(s.sglang_model_download) and not modelfetch.model_complete(
        hs.model, s.sglang_model_path)
    return residency.warm_decision(
        residency.Residency.of(hs.model, hs.memory), enabled=s.sglang_model_warm,
        restart_coming=restart_coming,
        margin_pct=s.sglang_model_warm_margin_pct, pending=pending)


def add_warm(hp, restart_coming: bool, gate: dict | None = None) -> residency.WarmDecision:
    """Add ``model_warmed`` for HP's host when its decision is to warm (GATE: a group's node's
    ``_if``, its group restarts); a skip, or shards already in memory before a (re)start, is
    said under the host. Returns the decision."""
    s = hp.settings
    found = decision(hp, restart_coming)
    if found.action == residency.WARM:
        model_warmed(name=f"Model {s.sglang_model_path} into the page cache, before the "
                          "server (re)starts",
                     path=s.sglang_model_path, python=s.sglang_system_python,
                     tool=hp.layout.tool(TOOL), margin_pct=s.sglang_model_warm_margin_pct,
                     timeout_s=s.sglang_model_warm_timeout_s, **(gate or {}))
    elif found.action == residency.SKIP:
        logger.warning(f"{host.print_prefix}model warm skipped: {found.reason}")
    elif restart_coming and s.sglang_model_warm:
        host.noop(f"model warm: {found.reason}")
    return found


def before_restart(hp, active: bool, reasons: list[str], group_restarts: bool) -> None:
    """The service stage's warm: a single server's when it (re)starts (not ACTIVE, or
    REASONS), a group's node's when its group restarts (gated by the group's decision). Not in
    a staged rollout's rolling run: its staging run warmed before the first drain, and the
    host is out of the router now, so a read here would only add to its time out (what the
    page cache lost since, the server reads itself)."""
    if staging.trusts_record():
        if hp.settings.sglang_model_warm and (group_restarts or not active or reasons):
            host.noop("model warm: left to this rollout's staging run, before the drain (the host "
                      "is out of the router now: the server reads what is missing)")
        return
    if hp.group is None:
        add_warm(hp, restart_coming=not active or bool(reasons))
    elif group_restarts:
        add_warm(hp, restart_coming=True, gate={"_if": groupops.Decided()})


def _run_json(command: str) -> dict | None:
    _, output = host.run_shell_command(command, print_output=False)
    try:
        value = json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) else None


def _warm_on_host(path: str, python: str, tool: str, margin_pct: float, timeout_s: float) -> None:
    prefix = host.print_prefix
    measured = _run_json(f"{shlex.quote(python)} {shlex.quote(tool)} measure "
                         f"--model {shlex.quote(path)}")
    if measured is None:
        logger.warning(f"{prefix}model warm skipped: `{tool} measure` printed no result")
        return
    res = residency.Residency.of(ModelState.from_json(measured.get("model")),
                                 Memory.from_json(measured.get("memory")))
    found = residency.warm_decision(res, enabled=True, restart_coming=True,
                                    margin_pct=margin_pct)
    if found.action == residency.SKIP:
        logger.warning(f"{prefix}model warm skipped: {found.reason}")
        return
    if found.action == residency.NONE:
        logger.info(f"{prefix}model warm: {found.reason}")
        return
    logger.info(f"{prefix}model warm: {found.reason}")
    command = (f"{shlex.quote(python)} {shlex.quote(tool)} warm --model {shlex.quote(path)} "
               f"--keep-available {found.keep_available} --timeout-s {timeout_s:g}")
    ok, output = streamed.run_logged(command, timeout=timeout_s + 120)
    lines = output.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not ok or not isinstance(result, dict) or not result.get("ok"):
        error = (result or {}).get("error") or "\n".join(output.stderr_lines[-5:]) or "no output"
        logger.warning(f"{prefix}model warm failed (the server will load from disk): {error}")
        return
    text = residency.result_text(result)
    (logger.warning if result.get("stopped") else logger.info)(f"{prefix}{text}")


@operation()
def model_warmed(path: str, python: str, tool: str, margin_pct: float = 10,
                 timeout_s: float = 1800):
    """
    Read the shards of the model at PATH that are not in the page cache into it (``model_warm.py``
    run by the system python), when they fit in MemAvailable with MARGIN_PCT percent of
    MemTotal to spare; measured and decided again on the host when it runs.

    + path: the model folder on the host
    + python: the host's system python (the tool is stdlib only)
    + tool: where ``model_warm.py`` is installed on the host
    + margin_pct: memory kept free, percent of MemTotal
    + timeout_s: the warm's deadline (it stops there, and the deploy goes on)
    """
    yield FunctionCommand(reported(_warm_on_host), (path, python, tool, margin_pct, timeout_s), {})

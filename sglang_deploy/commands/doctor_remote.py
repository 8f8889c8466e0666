"""``sglang-deploy doctor INVENTORY [--limit PATTERN]...``: the deploy's pre-flight on its hosts.

One ``pyinfra INVENTORY preflight.py --dry`` run (the deploy's pre-flight stage alone, hosts
in parallel) in plan mode: each host's stage records every check it made in the run's
journal (``plan.preflight``: the host's ``preflight``), judged by that host's data exactly as a
deploy would. Nothing is installed or changed and no deploy lock is taken. A host without a
record is explained by its outcome record (``integration/outcomes.py``: unreachable, its typed
error, or no result), not by pyinfra's printed text.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_deploy.controller import runner
from sglang_deploy.controller.hosts import select
from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec

if TYPE_CHECKING:
    from sglang_deploy.core.journal import Journal


def status_of(checks: list[dict]) -> str:
    statuses = {c.get("status") for c in checks}
    return next((s for s in ("fail", "warn", "pass") if s in statuses), "skipped")


def host_report(name: str, ran: Journal, fallback: str = "") -> dict[str, Any]:
    """One host's report from its pre-flight record in the run's journal RAN, or a failure
    saying why it has none: its outcome record (unreachable, its typed error, or no result:
    then FALLBACK, pyinfra's own last error)."""
    from sglang_deploy.core import outcome

    record = ran.preflight(name)
    if record is None:
        got = ran.outcome(name)
        error = got.message + (f"\n{fallback}" if got.kind == outcome.MISSING and fallback else "")
        return {"host": name, "mode": "remote", "source": name, "status": "fail", "checks": [],
                "error": error}
    return {"host": name, "mode": "remote", "source": name, "status": status_of(record["checks"]),
            "checks": record["checks"], "nccl_env": record.get("nccl_env") or {},
            "p2p_matrix": record.get("p2p_matrix")}


def collect(inventory: str, limit: list[str], data: list[str], cwd: str = ".") -> list[dict]:
    """The report of each host INVENTORY and LIMIT select (pyinfra's --limit rules; the
    inventory, the limit and the data are checked before any connection, exit status 2)."""
    from sglang_deploy.commands.common import host_error
    from sglang_deploy.integration import journal

    hosts = select(inventory, limit, data, cwd=cwd).hosts
    with tempfile.TemporaryDirectory(prefix="sglang-doctor-") as tmp:
        records = Path(tmp) / "journal.json"
        run = runner.run_pyinfra(inventory, "preflight.py", limit=hosts, data=data, dry=True,
                                 cwd=cwd, spec=RunSpec(mode=runspec.PLAN, journal=str(records)))
        ran, fallback = journal.read(records), host_error(run.output)
        return [host_report(h, ran, fallback) for h in hosts]


def run(args, data: list[str], render: Callable[[dict[str, Any]], None]) -> int:
    """``doctor INVENTORY``: DATA are the ``--data`` items (the options as data keys, made by
    ``doctor.data_overrides``); RENDER prints one host's report (``doctor.render``, passed in:
    ``doctor`` imports this module, not the other way round)."""
    try:
        reports = collect(args.inventory, args.limit, data)
    except (FileNotFoundError, ValueError) as exc:
        print(f"sglang-deploy doctor: {exc}", file=sys.stderr)
        return 2
    overall = status_of([{"status": r["status"]} for r in reports])
    if args.json:
        print(json.dumps({"status": overall, "hosts": reports}))
    else:
        for report in reports:
            if report.get("error"):
                print(f"{report['host']}: no pre-flight result\n{report['error']}")
            else:
                render(report)
    return 0 if overall in ("pass", "warn") else 1

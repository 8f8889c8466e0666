"""``sglang-deploy doctor INVENTORY [--limit PATTERN]...``: the deploy's pre-flight on its hosts.

One ``pyinfra INVENTORY preflight.py --dry`` run (the deploy's pre-flight stage alone, hosts
in parallel) with a plan folder: each host's stage writes every check it made
(``plan.preflight``: ``<host>.preflight.json``), judged by that host's data exactly as a
deploy would. Nothing is installed or changed and no deploy lock is taken. A host without a
record did not answer or has invalid data: its pyinfra lines are shown instead.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_deploy.shell import runner
from sglang_deploy.shell.hosts import select
from sglang_deploy.shell.plan import PLAN_ENV


def status_of(checks: list[dict]) -> str:
    statuses = {c.get("status") for c in checks}
    return next((s for s in ("fail", "warn", "pass") if s in statuses), "skipped")


def host_report(name: str, plans: Path, output: str) -> dict[str, Any]:
    """One host's report from its plan record, or a failure quoting its pyinfra lines."""
    path = plans / f"{name}.preflight.json"
    if not path.exists():
        lines = [ln.strip() for ln in output.splitlines() if f"[{name}]" in ln or "error" in ln.lower()]
        return {"host": name, "mode": "remote", "source": name, "status": "fail", "checks": [],
                "error": "\n".join(lines[-8:]) or output.strip()[-1500:] or "pyinfra printed nothing"}
    record = json.loads(path.read_text())
    return {"host": name, "mode": "remote", "source": name, "status": status_of(record["checks"]),
            "checks": record["checks"], "nccl_env": record.get("nccl_env") or {},
            "p2p_matrix": record.get("p2p_matrix")}


def collect(inventory: str, limit: list[str], data: list[str], cwd: str = ".") -> list[dict]:
    """The report of each host INVENTORY and LIMIT select (pyinfra's --limit rules; the
    inventory, the limit and the data are checked before any connection, exit status 2)."""
    hosts = select(inventory, limit, data, cwd=cwd).hosts
    with tempfile.TemporaryDirectory(prefix="sglang-doctor-") as tmp:
        run = runner.run_pyinfra(inventory, "preflight.py", limit=hosts, data=data, dry=True,
                                 cwd=cwd, env={PLAN_ENV: tmp})
        return [host_report(h, Path(tmp), run.output) for h in hosts]


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

"""`sglang-deploy status INVENTORY [--json]`: where every host stands. Read-only.

One ``pyinfra INVENTORY deploy.py --dry`` run (hosts in parallel) with a plan folder: the
stages read each host exactly as a deploy would, and record, without changing anything:
the unit's state and uptime, the release and its sglang version, the patch state, one poll
of ``/health`` and ``/v1/models``, the time of the last successful verification, and the
drift: the operations a deploy would run now (an empty list means the host is exactly what
the deploy would make it). A host without a plan record is explained by its outcome record
(``shell/outcomes.py``: unreachable, its typed error, or no result), not by pyinfra's text.

With a ``routers`` group, the router too (``router`` in ``--json``: its ``url`` and its
``workers``, each with ``host``, ``url`` and ``state`` as the router reports it).
``--json`` prints ``{"hosts": [...], "router": {...} or null}``.

Exit status: 0 when every host is reachable, in sync and healthy (and, with a router, every
serving host is ready in it); 1 otherwise; 2 for a missing inventory, a --limit that matches
nothing or bad --data (nothing contacted).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_deploy.commands import common

if TYPE_CHECKING:
    from sglang_deploy.core.outcome import HostOutcome


def rows_from_plans(hosts: list[str], plans: Path, outcomes: dict[str, HostOutcome],
                    fallback: str = "") -> list[dict]:
    """Pure-ish: one status row per host from the plan files and, for a host without one, its
    outcome record (OUTCOMES: ``shell.outcomes.read``): unreachable, its error, or no result
    (then FALLBACK, pyinfra's own last error, is shown)."""
    from sglang_deploy.core import outcome

    rows = []
    for name in hosts:
        path = plans / f"{name}.json"
        if not path.exists():
            o = outcomes.get(name) or outcome.decide(name, None)
            problem = o.message + (f"\n{fallback}" if o.kind == outcome.MISSING and fallback else "")
            rows.append({"host": name,
                         "reachable": False if o.kind == outcome.UNREACHABLE else None,
                         "problem": problem, "in_sync": None, "healthy": False})
            continue
        p = json.loads(path.read_text())
        row = {"host": name, "reachable": True, **{k: v for k, v in p.items() if k != "host"}}
        if p.get("preflight") == "fail":
            row["problem"] = "pre-flight fails: " + "; ".join(f"{c['name']}: {c['message']}" for c in p["failed"])
            row["in_sync"], row["healthy"] = None, False
        else:
            row["in_sync"] = not p["changes"]
            row["healthy"] = p.get("health") == 200 and p.get("unit") == "active/running"
        rows.append(row)
    return rows


def _fmt_uptime(s) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else (
        f"{s // 3600}h{s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m{s % 60}s")


def render(rows: list[dict], out=None) -> None:
    table = common.table(("host", "reachable", "unit", "uptime", "release", "sglang", "patch",
                          "health", "model", "last verified", "drift"),
                         title="sglang-deploy status", out=out)
    for r in rows:
        if r.get("reachable") is not True or r.get("preflight") == "fail":
            table.add_row(r["host"], "no" if r.get("reachable") is False else ("yes" if r.get("reachable") else "?"),
                          "", "", "", "", "", "", "", "", _one_line(r.get("problem", "")))
            continue
        drift = "in sync" if r["in_sync"] else f"{len(r['changes'])} change(s): " + "; ".join(r["changes"][:4])
        table.add_row(r["host"], "yes", r.get("unit") or "-", _fmt_uptime(r.get("uptime_s")),
                      r.get("release") or "-", r.get("sglang_version") or "-",
                      r.get("patch_state") or "-", str(r.get("health") or "down"),
                      ", ".join(r.get("models") or []) or "-", r.get("last_verified") or "never",
                      drift)
    common.print_table(table, out)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def router_status(inventory: str, cwd: str = ".", data: list[str] | None = None) -> dict | None:
    """The front door: the (first) router's ``url`` and its ``workers`` (host, url, state as
    the router reports it, ``absent`` when it does not list the host); ``error`` when the
    router does not answer. None without a ``routers`` group."""
    from sglang_deploy.core.errors import RouterError
    from sglang_deploy.shell import routerctl

    fronts = routerctl.routers(inventory, cwd, data)
    if not fronts:
        return None
    r = fronts[0]
    doc = {"host": r.host, "url": r.url, "error": None}
    try:
        doc["workers"] = r.states()
    except RouterError as exc:
        doc["error"] = exc.found or exc.what
        doc["workers"] = [{"host": h, "url": u, "state": "unknown"} for h, u in r.workers.items()]
    return doc


def render_router(router: dict | None, out=None) -> None:
    if router is None:
        return
    print(f"router {router['host']}: {router['url']}"
          + (f"  NOT ANSWERING: {router['error']}" if router["error"] else ""), file=out or sys.stdout)
    for w in router["workers"]:
        print(f"  {w['host'] or '(not in the inventory)':<16} {w['url']:<32} {w['state']}",
              file=out or sys.stdout)


def collect(inventory: str, cwd: str = ".", limit: list[str] | None = None,
            data: list[str] | None = None) -> list[dict]:
    """Rows of the hosts INVENTORY and LIMIT select (checked before any connection: a missing
    inventory, a limit that matches nothing or bad data raise, exit status 2)."""
    from sglang_deploy.shell import outcomes, routing, runner
    from sglang_deploy.shell.hosts import select
    from sglang_deploy.shell.plan import PLAN_ENV

    chosen = select(inventory, limit, data, cwd=cwd).hosts
    serving = {name for name, _ in routing.fleet(inventory, cwd).workers}  # not routers
    hosts = [h for h in chosen if h in serving]
    with tempfile.TemporaryDirectory(prefix="sglang-status-") as tmp:
        plans, records = Path(tmp) / "plans", Path(tmp) / "outcomes"
        run = runner.run_pyinfra(inventory, "deploy.py", limit=hosts, data=data, dry=True,
                                 cwd=cwd, env={PLAN_ENV: str(plans),
                                               outcomes.OUTCOMES_ENV: str(records)})
        return rows_from_plans(hosts, plans, outcomes.read(records, hosts),
                               fallback=common.host_error(run.output))


def add_parser(sub) -> None:
    p = common.add_command(sub, "status",
                           help="one row per host: unit, release, patch, health, drift (read-only)",
                           failed="a host is unreachable, unhealthy or drifted")
    common.add_inventory(p)
    common.add_limit(p)
    common.add_json(p, 'one document, {"hosts": [one object per host], "router": null (no '
                       'routers group) or {"host", "url", "error", "workers": [{"host", "url", '
                       '"state"}]}},')
    common.add_data(p)


def run(args) -> int:
    rows = collect(args.inventory, limit=args.limit, data=args.data)
    router = router_status(args.inventory, data=args.data)
    if args.json:
        json.dump({"hosts": rows, "router": router}, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        render(rows)
        render_router(router)
    routed = router is None or (not router["error"] and all(
        w["state"] == "ready" for w in router["workers"] if w["host"]))
    ok = routed and all(r.get("in_sync") and r.get("healthy") for r in rows)
    return common.EXIT_OK if ok else common.EXIT_FAILED

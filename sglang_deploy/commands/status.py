"""`sglang-deploy status INVENTORY [--json]`: where every host stands. Read-only.

One ``pyinfra INVENTORY deploy.py --dry`` run (hosts in parallel) in plan mode: the
stages read each host exactly as a deploy would, and record in the run's journal
(``integration/journal.py``), without changing anything:
the unit's state and uptime, the release and its sglang version, the patch state, one poll
of ``/health`` and ``/v1/models``, the time of the last successful verification, and the
drift: the operations a deploy would run now (an empty list means the host is exactly what
the deploy would make it). A host without a plan record is explained by its outcome record
(``integration/outcomes.py``: unreachable, its typed error, or no result), not by pyinfra's text.

Multi-node groups (hosts with the same ``sglang_group``, ``core.group``) are shown as units
(``core.groupstatus``): each host row names its ``group`` and ``node_rank`` (null for a
single host), a group's nodes stand together in rank order, and a ``--limit`` that names part
of a group looks at the whole group. A node of rank >= 1 serves only SGLang's health server:
it is healthy when its unit is active/running and ``/health`` answers 200 (it has no
``/v1/models``). A group is ``serving`` when rank 0 is healthy and every other node is,
``degraded`` when rank 0 is healthy and a node is not, ``down`` otherwise; ``problem`` names
the nodes and what is wrong.

With a ``routers`` group, the router too (``router`` in ``--json``: its ``url`` and its
``workers``, each with ``host``, ``url`` and ``state`` as the router reports it).
```--json`` prints ``{"hosts": [...], "groups": [{"name", "nodes", "dist_init_addr",
"state", "problem"}], "router": {...} or null}``.

Each host's ``gpu_health`` (``core.gpuhealth``: its ``verdict``, healthy, warning, unknown or
fatal, and its ``findings``, each with ``code``, ``severity``, ``gpu``, ``message`` and ``fix``;
null when the host-state read brought none) is read in the same round trip as the rest: the
``gpus`` column shows the verdict and what decided it, the findings are listed under the table.

Each host's ``watchdog`` (``core.watchdog.status_doc``, null where none runs): its unit,
last verdict, last event and restarts in the last hour, read in the same round trip.

Each host's ``hardening`` (``core.hardening.summary``, null before a release smoke ran under
the unit's sandbox there): the properties in force, those not in force with why and the fix,
and those it cannot tell; the text output lists the ones not in force under the table.

Exit status: 0 when every host is reachable, in sync and healthy, no host's GPU health is
fatal, every group is serving (and, with a router, every serving host is ready in it); 1
otherwise; 2 for a missing
inventory, a --limit that matches nothing or bad --data (nothing contacted).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_deploy.commands import common
from sglang_deploy.core import runspec
from sglang_deploy.core.runspec import RunSpec

if TYPE_CHECKING:
    from sglang_deploy.core.group import Group
    from sglang_deploy.core.journal import Journal


def rows_from_plans(hosts: list[str], ran: Journal, fallback: str = "") -> list[dict]:
    """Pure: one status row per host from its plan record in the run's journal RAN and, for a
    host without one, its outcome record: unreachable, its error, or no result (then
    FALLBACK, pyinfra's own last error, is shown)."""
    from sglang_deploy.core import outcome

    rows = []
    for name in hosts:
        p = ran.plan(name)
        if p is None:
            o = ran.outcome(name)
            problem = o.message + (f"\n{fallback}" if o.kind == outcome.MISSING and fallback else "")
            rows.append({"host": name,
                         "reachable": False if o.kind == outcome.UNREACHABLE else None,
                         "problem": problem, "in_sync": None, "healthy": False})
            continue
        row = {"host": name, "reachable": True, **{k: v for k, v in p.items() if k != "host"}}
        if p.get("preflight") == "fail":
            row["problem"] = "pre-flight fails: " + "; ".join(f"{c['name']}: {c['message']}" for c in p["failed"])
            row["in_sync"], row["healthy"] = None, False
        else:
            # a group's node: what would restart its group is kept out of ``changes``
            # (``plan.changes``) and recorded as its ``group_wants``: drift all the same
            row["in_sync"] = not p["changes"] and not p.get("group_wants")
            row["healthy"] = p.get("health") == 200 and p.get("unit") == "active/running"
        rows.append(row)
    return rows


def _fmt_uptime(s) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else (
        f"{s // 3600}h{s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m{s % 60}s")


def _group_cell(r: dict) -> str:
    """``NAME/RANK`` of a group's node, ``-`` for a single host."""
    return f"{r['group']}/{r.get('node_rank')}" if r.get("group") else "-"


#: the columns; on a terminal (not --wide) the short headers, so that a row fits 120 columns
COLUMNS = ("host", "group", "reachable", "unit", "uptime", "release", "sglang", "patch",
           "health", "gpus", "model", "last verified", "drift")
SHORT = {"reachable": "ssh", "uptime": "up", "health": "http", "last verified": "verified",
         "gpus": "gpu"}
#: a terminal's short form of a GPU health verdict (the findings are listed under the table)
SHORT_VERDICT = {"healthy": "ok", "warning": "warn", "unknown": "?", "fatal": "FATAL"}


def gpu_cell(r: dict, short: bool = False) -> str:
    """The ``gpus`` column: the GPU health's verdict, short (``ok``, ``warn``, ``?``,
    ``FATAL``) or with what decided it (``fatal: GPU 1 ecc-uncorrected-volatile``); ``-``
    when none was read."""
    from sglang_deploy.core import gpuhealth

    doc = r.get("gpu_health")
    if not doc:
        return "-"
    if short:
        return SHORT_VERDICT.get(doc.get("verdict"), doc.get("verdict") or "-")
    return gpuhealth.summary_of(doc)


def short_cells(r: dict) -> dict:
    """The short forms of a terminal's table: the unit's sub-state alone where it is active
    (``running``), the release's first 8 characters, the verification's ``MM-DD HH:MM``
    (UTC, as recorded)."""
    unit = r.get("unit") or "-"
    active, _, sub = unit.partition("/")
    verified = r.get("last_verified") or "never"
    if len(verified) >= 16 and verified[4] == "-" and verified[10] == "T":
        verified = f"{verified[5:10]} {verified[11:16]}"
    return {"unit": sub if active == "active" and sub else active,
            "release": (r.get("release") or "-")[:8], "last verified": verified}


def _drift(r: dict) -> str:
    items = [*(r.get("changes") or []),
             *(f"restarts its group: {w}" for w in r.get("group_wants") or [])]
    return "in sync" if r["in_sync"] else f"{len(items)} change(s): " + "; ".join(items[:4])


def render(rows: list[dict], out=None, wide: bool = False) -> None:
    """The table; on a terminal (unless WIDE) short headers and values (``short_cells``), and
    a host's drift or problem on its own line under the table, so that a row fits a
    120-column terminal and no value is cut. Piped: every value whole, one row per line."""
    short = common.is_terminal(out) and not wide
    table = common.table([SHORT.get(c, c) if short else c for c in COLUMNS],
                         title="sglang-deploy status", out=out)
    table.pad_edge = False  # 13 columns in 120: no padding outside the first and last
    below = []
    for r in rows:
        if r.get("reachable") is not True or r.get("preflight") == "fail":
            problem = _one_line(r.get("problem", ""))
            if short:
                below.append(f"{r['host']}: {problem}")
            table.add_row(r["host"], _group_cell(r),
                          "no" if r.get("reachable") is False else ("yes" if r.get("reachable") else "?"),
                          "", "", "", "", "", "", gpu_cell(r, short), "", "",
                          "see below" if short else problem)
            continue
        drift = _drift(r)
        if short and not r["in_sync"]:
            below.append(f"{r['host']}: {drift}")
            drift = drift.split(":", 1)[0]
        cells = short_cells(r) if short else {
            "unit": r.get("unit") or "-", "release": r.get("release") or "-",
            "last verified": r.get("last_verified") or "never"}
        table.add_row(r["host"], _group_cell(r), "yes", cells["unit"],
                      _fmt_uptime(r.get("uptime_s")),
                      cells["release"], r.get("sglang_version") or "-",
                      r.get("patch_state") or "-", str(r.get("health") or "down"),
                      gpu_cell(r, short), ", ".join(r.get("models") or []) or "-",
                      cells["last verified"],
                      drift)
    common.print_table(table, out)
    console = common.console(out)
    for line in below:  # wrapped at the terminal's width
        console.print(line, markup=False, overflow="fold")


def render_hardening(rows: list[dict], out=None) -> None:
    """Under the table, one line per host and property of the unit's hardening that is not in
    force there (``core.hardening``: what the release smoke saw), with why and the fix."""
    from sglang_deploy.core import hardening

    for r in rows:
        for line in hardening.lines(r["host"], r.get("hardening")):
            print(f"hardening: {line}", file=out or sys.stdout)


def render_gpu_health(rows: list[dict], out=None) -> None:
    """Under the table, one line per host and GPU health finding (fatal, warning, unknown):
    what was found and the fix (``core.gpuhealth``)."""
    from sglang_deploy.core import gpuhealth

    for r in rows:
        for line in gpuhealth.lines(r["host"], r.get("gpu_health")):
            print(f"gpu: {line}", file=out or sys.stdout)


def render_model_memory(rows: list[dict], out=None) -> None:
    """Under the table, one line per host: its served model's shards in the page cache
    (``core.residency``), ``HOST: model: 97% in memory (...)``."""
    for r in rows:
        found = r.get("model_memory")
        if found:
            print(f"{r['host']}: model: {found['text']}", file=out or sys.stdout)


def render_watchdog(rows: list[dict], out=None) -> None:
    """Under the table, one line per host that runs the watchdog: its unit, its last verdict,
    its last event (a wedge seen, what it did) and its restarts in the last hour."""
    for r in rows:
        found = r.get("watchdog")
        if found:
            print(f"{r['host']}: watchdog: {found['text']}", file=out or sys.stdout)


def render_last_restart(rows: list[dict], out=None) -> None:
    """Under the table, one line per host whose verifier recorded a (re)start: when and why
    (``core.restart``), ``HOST: last restart: 2026-12-05 18:20 UTC restarted: flags changed:
    tp-size 8 -> 4; release d5e0… -> 7a1c…``."""
    for r in rows:
        found = r.get("last_restart")
        if found and found.get("text"):
            print(f"{r['host']}: last restart: {found['text']}", file=out or sys.stdout)


def render_groups(groups: list[dict], out=None) -> None:
    """One line per group: its nodes in rank order, rank 0's address, its state and why."""
    for g in groups:
        print(f"group {g['name']} ({', '.join(g['nodes'])}; dist-init {g['dist_init_addr']}): "
              f"{g['state']}" + (f": {g['problem']}" if g.get("problem") else ""),
              file=out or sys.stdout)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def router_status(inventory: str, cwd: str = ".", data: list[str] | None = None) -> dict | None:
    """The front door: the (first) router's ``url`` and its ``workers`` (host, url, state as
    the router reports it, ``absent`` when it does not list the host); ``error`` when the
    router does not answer. None without a ``routers`` group."""
    from sglang_deploy.controller import routerctl
    from sglang_deploy.core.errors import RouterError

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
        note = ""
        if w.get("not_worker"):
            note = f"  ({w['not_worker']}"
            if w["state"] == "ready":
                note += ("; the router sends it requests that fail; fix: `sglang-deploy "
                         "rollout INVENTORY` drains it out, then `pyinfra INVENTORY deploy.py "
                         f"--limit {router['host']}` writes the router's worker list")
            note += ")"
        print(f"  {w['host'] or '(not in the inventory)':<16} {w['url']:<32} {w['state']}{note}",
              file=out or sys.stdout)


def collect_status(inventory: str, cwd: str = ".", limit: list[str] | None = None,
                   data: list[str] | None = None) -> tuple[list[dict], dict[str, Group]]:
    """(rows, groups) of the hosts INVENTORY and LIMIT select (checked before any connection:
    a missing inventory, a limit that matches nothing or bad data raise, exit status 2). A
    limit that names part of a multi-node group selects the whole group; each row carries
    its ``group`` and ``node_rank``, a group's nodes stand together in rank order."""
    from sglang_deploy.controller import routing, runner
    from sglang_deploy.controller.hosts import select
    from sglang_deploy.core import groupstatus
    from sglang_deploy.integration import journal

    sel = select(inventory, limit, data, cwd=cwd)
    groups = routing.groups(sel.inventory)
    chosen = groupstatus.widen(sel.hosts, groups)
    serving = [h.name for h in sel.inventory if not routing.is_router(h)]  # not routers
    hosts = groupstatus.ordered([h for h in serving if h in chosen], groups)
    with tempfile.TemporaryDirectory(prefix="sglang-status-") as tmp:
        records = Path(tmp) / "journal.json"
        run = runner.run_pyinfra(inventory, "deploy.py", limit=hosts, data=data, dry=True,
                                 cwd=cwd, spec=RunSpec(mode=runspec.PLAN, journal=str(records)))
        rows = rows_from_plans(hosts, journal.read(records),
                               fallback=common.host_error(run.output))
    return groupstatus.annotate(rows, groups), groups


def collect(inventory: str, cwd: str = ".", limit: list[str] | None = None,
            data: list[str] | None = None) -> list[dict]:
    """The rows of ``collect_status``."""
    return collect_status(inventory, cwd, limit, data)[0]


def ok(rows: list[dict], groups: list[dict], router: dict | None) -> bool:
    """Pure: every host in sync and healthy with no fatal GPU, every group serving, every
    routed host ready."""
    from sglang_deploy.core.gpuhealth import FATAL
    from sglang_deploy.core.groupstatus import SERVING

    # a host the router lists that is no worker of it (a group's node of rank >= 1) must not
    # be routed to: its requests fail
    routed = router is None or (not router["error"] and all(
        (w["state"] != "ready") if w.get("not_worker") else (w["state"] == "ready")
        for w in router["workers"] if w["host"]))
    return (routed and all(r.get("in_sync") and r.get("healthy") for r in rows)
            and not any((r.get("gpu_health") or {}).get("verdict") == FATAL for r in rows)
            and all(g["state"] == SERVING for g in groups))


DESCRIPTION = """\
One row per host: unit, release, patch, health, GPU health, drift (read-only).

The gpus column is the GPUs' health as read with the rest of the host's state (nvidia-smi's
ECC, row remapping and recovery-action fields, a lost GPU, the kernel log's Xid lines, DCGM
where installed): healthy, warning, unknown (a read that failed) or fatal (a deploy refuses
to restart a server there); one line per finding under the table, with its fix.

Under the table, one line per host and property of the unit's sandbox that is not in force
there (what the last release smoke saw), with why and the fix; and one line per host with how
much of its served model is in the page cache (`model: 97% in memory`) and its MemAvailable;
and one line per host that runs the watchdog (`watchdog: active/running, healthy 4s ago; last
event ...: wedged -> restart (...)`). No CUDA probe and no peer
copies run on a serving host.

A multi-node group (hosts with the same sglang_group) is one unit: each row names its
group/rank, and one line per group says serving (rank 0 healthy, every other node's unit
active/running with /health 200; those nodes have no /v1/models), degraded (rank 0
healthy, a node not) or down. A --limit that names part of a group shows the whole group."""


def add_parser(sub) -> None:
    p = common.add_command(sub, "status",
                           help="one row per host: unit, release, patch, health, drift; one line "
                                "per multi-node group: serving, degraded or down (read-only)",
                           description=DESCRIPTION,
                           failed="a host is unreachable, unhealthy or drifted, its GPU health "
                                  "is fatal, or a group is not serving")
    common.add_inventory(p)
    common.add_limit(p)
    common.add_json(p, 'one document, {"hosts": [one object per host, with "group" and '
                       '"node_rank" (null: a single host)], "groups": [{"name", "nodes" (rank '
                       'order), "dist_init_addr", "state" (serving, degraded or down), '
                       '"problem"}], "router": null (no routers group) or {"host", "url", '
                       '"error", "workers": [{"host", "url", "state"}]}}; each host\'s '
                       '"hardening": {"in_force", "not_in_force" [{"name", "why", "fix", '
                       '"found"}], "unknown", "checked_at", "release"} or null; each host\'s '
                       '"gpu_health": {"verdict", "gpus", "sources", "findings" [{"code", '
                       '"severity", "gpu", "bus_id", "message", "fix", "source"}], "notes"} or '
                       'null; each '
                       'host\'s "model_memory": {"shard_bytes", "resident_bytes", "percent", '
                       '"shards", "mem_available", "mem_total", "text"} or null (no shard); '
                       'each host\'s "watchdog": {"unit", "verdict", "observed_at", '
                       '"last_event", "restarts_last_hour", "text"} or null (none runs there)')
    common.add_data(p)
    p.add_argument("--wide", action="store_true",
                   help="on a terminal, every value whole (default: short forms that fit 120 "
                        "columns: the unit's state, the release's first 8 characters, the "
                        "verification's MM-DD HH:MM)")


def run(args) -> int:
    from sglang_deploy.core import groupstatus

    rows, groups = collect_status(args.inventory, limit=args.limit, data=args.data)
    states = groupstatus.states(rows, groups)
    router = router_status(args.inventory, data=args.data)
    if args.json:
        json.dump({"hosts": rows, "groups": states, "router": router}, sys.stdout, indent=2,
                  sort_keys=True)
        sys.stdout.write("\n")
    else:
        render(rows, wide=args.wide)
        render_gpu_health(rows)
        render_hardening(rows)
        render_model_memory(rows)
        render_last_restart(rows)
        render_watchdog(rows)
        render_groups(states)
        render_router(router)
    return common.EXIT_OK if ok(rows, states, router) else common.EXIT_FAILED

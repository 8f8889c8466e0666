"""`sglang-deploy report INVENTORY [--out FILE.html] [--json] [--limit PATTERN]...`: one
page about the fleet.

One self-contained HTML file (inline CSS, JavaScript and SVG; nothing fetched from the
network) with the fleet status (the same read-only run as `sglang-deploy status`), each
host's last data-verified P2P matrix as a heatmap, each host's last startup by phase, and
its benchmark history per configuration. Everything on the page is drawn from the JSON
document that ``--json`` prints (``core.fleetreport.build``), which is embedded in the page.

A multi-node group (``sglang_group``) is shown as a unit: its nodes together, rank 0 first,
and the group's state as `status` judges it; a ``--limit`` that names part of a group shows
the whole group (as `status` does).

``--limit`` follows pyinfra's rules (host names, group names, globs); the inventory, the
limit, ``--data`` and an ``--out`` folder that does not exist are refused (exit status 2)
before any connection. Exit status: 0 when the page (or the JSON) was written, 2 on a usage
or data error.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.core import fleetreport

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "report.html.j2"
STATE_DIR = Path(".sglang-deploy")
DEFAULT_OUT = STATE_DIR / "report.html"


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_summaries(state_dir: Path) -> dict[str, list[dict]]:
    """Every verification summary the deploys left: plain deploys' and each rollout step's."""
    found: dict[str, list[dict]] = {}
    paths = list((state_dir / "reports").glob("*.json"))
    paths += list((state_dir / "rollouts").glob("*/*-reports/*.json"))
    for path in paths:
        summary = _read_json(path)
        if summary and summary.get("host"):
            found.setdefault(str(summary["host"]), []).append(summary)
    return found


def read_records(state_dir: Path, hosts: list[str]) -> tuple[dict, dict]:
    """(P2P record per host, benchmark entries per host) from the controller's folders."""
    from sglang_deploy.stages import throughputhost

    p2p = {h: r for h in hosts if (r := _read_json(state_dir / "p2p" / f"{h}.json"))}
    runs = {h: throughputhost.read_local(h, state_dir.parent) for h in hosts}
    return p2p, runs


def collect(inventory: str, cwd: str = ".", limit: list[str] | None = None,
            data: list[str] | None = None, with_status: bool = True) -> dict:
    """The report document of the hosts INVENTORY and LIMIT select (pyinfra's --limit rules:
    host names, group names, globs; one that matches nothing is a UsageError, exit 2), with
    their status read live (checked as `status` checks it) unless WITH_STATUS is off."""
    from sglang_deploy.commands import status
    from sglang_deploy.controller import routing
    from sglang_deploy.controller.hosts import load, match, parse_data
    from sglang_deploy.core import groupstatus

    inv = load(inventory, cwd, parse_data(list(data or ())))
    groups = routing.groups(inv)
    chosen = groupstatus.widen((h.name for h in (match(inv, list(limit)) if limit else inv)), groups)
    hosts = groupstatus.ordered([h.name for h in inv if h.name in chosen], groups)
    rows = status.collect(inventory, cwd=cwd, limit=limit, data=data) if with_status else None
    state_dir = Path(cwd) / STATE_DIR
    p2p, runs = read_records(state_dir, hosts)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return fleetreport.build(inventory, hosts, rows, read_summaries(state_dir), p2p, runs, now,
                             groups)


def render_html(doc: dict) -> str:
    """The page, from DOC only (Jinja2, autoescaped; the document is embedded as JSON)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    # no "<" at all inside the <script> element: nothing in the data can end or nest it
    embedded = json.dumps(doc, sort_keys=True).replace("<", "\\u003c")
    return env.get_template(TEMPLATE.name).render(
        doc=doc, data_json=embedded, heat_colour=fleetreport.heat_colour,
        timeline_bars=fleetreport.timeline_bars, bench_chart=fleetreport.bench_chart)


def check_out(out: str | Path) -> None:
    """--out OUT must name a file in an existing folder: a typo is refused, not silently made
    a folder (the default's folder, the tool's own state folder, is created)."""
    from sglang_deploy.core.errors import UsageError

    folder = Path(out).parent
    if not folder.is_dir():
        raise UsageError(what="--out FILE.html in an existing folder",
                         found=f"no folder {folder}" + (" (a file)" if folder.exists() else ""),
                         fix=f"create it first (mkdir -p {folder}) or write the page into an "
                             "existing folder")


def write(doc: dict, out: str | Path) -> Path:
    path = Path(out)
    path.write_text(render_html(doc))
    return path


def add_parser(sub) -> None:
    p = common.add_command(
        sub, "report", help="one self-contained HTML page: fleet status, P2P heatmaps, startup "
                            "timelines, benchmark history",
        description=__doc__.split("\n\n")[0],
        failed="the page could not be written")
    common.add_inventory(p)
    p.add_argument("--out", metavar="FILE.html",
                   help=f"where to write the page, in an existing folder (default {DEFAULT_OUT}, "
                        "its folder created; with --json: only when given)")
    common.add_json(p, "the report's document")
    common.add_limit(p)
    common.add_data(p)
    p.add_argument("--no-status", action="store_true",
                   help="do not connect to the hosts: only what the controller recorded")


def run(args) -> int:
    if args.out is not None:
        check_out(args.out)  # before any connection
    doc = collect(args.inventory, limit=args.limit, data=args.data,
                  with_status=not args.no_status)
    out = Path(args.out) if args.out else (None if args.json else DEFAULT_OUT)
    if out is not None:
        if not out.parent.is_dir():  # the default's: the tool's own state folder
            out.parent.mkdir(parents=True)
            print(f"report: created the folder {out.parent}/", file=sys.stderr)
        path = write(doc, out)
        n = doc["summary"]["hosts"]
        print(f"report: {path} ({n} host{'' if n == 1 else 's'})", file=sys.stderr)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    return 0

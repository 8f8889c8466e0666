"""`sglang-deploy report INVENTORY [--out FILE.html] [--json]`: one page about the fleet.

One self-contained HTML file (inline CSS, JavaScript and SVG; nothing fetched from the
network) with the fleet status (the same read-only run as `sglang-deploy status`), each
host's last data-verified P2P matrix as a heatmap, each host's last startup by phase, and
its benchmark history per configuration. Everything on the page is drawn from the JSON
document that ``--json`` prints (``core.fleetreport.build``), which is embedded in the page.

Exit status: 0 when the page (or the JSON) was written, 2 on a usage or data error.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

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
    from sglang_deploy.commands import bench

    p2p = {h: r for h in hosts if (r := _read_json(state_dir / "p2p" / f"{h}.json"))}
    runs = {h: bench.read_local(h, state_dir.parent) for h in hosts}
    return p2p, runs


def collect(inventory: str, cwd: str = ".", limit: list[str] | None = None,
            data: list[str] | None = None, with_status: bool = True) -> dict:
    """The report document of INVENTORY's hosts (status read live unless WITH_STATUS off)."""
    from sglang_deploy.commands import status
    from sglang_deploy.core.errors import SglangDeployError
    from sglang_deploy.shell import runner

    hosts = [name for name, _ in runner.inventory_hosts(inventory, cwd)]
    if limit:
        missing = [h for h in limit if h not in hosts]
        if missing:
            raise SglangDeployError(what="host names from the inventory",
                               found=f"not in {inventory}: {', '.join(missing)}",
                               fix=f"use one of: {', '.join(hosts)}")
        hosts = [h for h in hosts if h in limit]
    rows = status.collect(inventory, cwd=cwd, limit=hosts, data=data) if with_status else None
    state_dir = Path(cwd) / STATE_DIR
    p2p, runs = read_records(state_dir, hosts)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return fleetreport.build(inventory, hosts, rows, read_summaries(state_dir), p2p, runs, now)


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


def write(doc: dict, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(doc))
    return path


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page: fleet status, P2P "
                                      "heatmaps, startup timelines, benchmark history",
                       description=__doc__)
    p.add_argument("inventory")
    p.add_argument("--out", metavar="FILE.html",
                   help=f"where to write the page (default {DEFAULT_OUT}; with --json: only "
                        "when given)")
    p.add_argument("--json", action="store_true", help="print the report's JSON document")
    p.add_argument("--limit", action="append", help="only these hosts (repeatable)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="data overrides for the status run (as in status --data)")
    p.add_argument("--no-status", action="store_true",
                   help="do not connect to the hosts: only what the controller recorded")


def run(args) -> int:
    from sglang_deploy.core.errors import SglangDeployError

    try:
        doc = collect(args.inventory, limit=args.limit, data=args.data,
                      with_status=not args.no_status)
    except SglangDeployError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    out = args.out or (None if args.json else DEFAULT_OUT)
    if out is not None:
        path = write(doc, out)
        print(f"report: {path} ({doc['summary']['hosts']} hosts)", file=sys.stderr)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    return 0

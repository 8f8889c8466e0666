"""`sglang-deploy bench`: SGLang's own benchmark on each host, recorded and gated.

    sglang-deploy bench INVENTORY [--limit PATTERN]... [--data K=V]... [--min-throughput-ratio R] [--json]

On each host, `python -m sglang.bench_serving` of the CURRENT release venv runs against the
local server once per concurrency level (`bench_concurrency`). Its output file (JSONL) is
parsed for the output token throughput; the figures become a record of the host's
configuration identity (release id + short hash of the unit file, so a flag change counts as
a new configuration), kept on the host (`<sglang_root>/bench/<identity>.json`) and locally
(`.sglang-deploy/bench/<host>.jsonl`), and shown beside the previous configuration's figures
(the most recent record of a different identity). With `--min-throughput-ratio R` a level
below R x the previous figure fails the command (exit 1); the rollout calls
`run_and_gate` and rolls back on such a failure.

Pure core (`core/throughput.py`): `bench_argv`, `parse_summary`, `level_figures`, `make_record`,
`pick_previous`, `gate`, `table_rows`. Host side (`stages/throughputhost.py`): `bench_host` (runs
inside `pyinfra INVENTORY throughput_bench.py`, through
`runner.run_pyinfra`) and the local records. This module: the command (`run_hosts`, `run`).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_deploy.commands import common
from sglang_deploy.core.runspec import RunSpec
from sglang_deploy.core.throughput import TABLE_COLUMNS, gate, table_rows

#: the deploy file it runs (beside deploy.py, in the deploy folder: the current one)
DEPLOY_FILE = "throughput_bench.py"


# --------------------------------------------------------------------------- the command

@dataclass
class BenchOutcome:
    ok: bool
    message: str
    current: dict | None = None
    previous: dict | None = None
    host: str | None = None


def run_hosts(inventory: str, hosts: list[str], min_ratio: float | None, cwd=".",
              on_line=None, data=None) -> list[BenchOutcome]:
    """Run the bench deploy for HOSTS (one pyinfra process) and gate each host."""
    from sglang_deploy.controller import runner
    from sglang_deploy.integration import journal

    run_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        records = Path(tmp) / "journal.json"
        run = runner.run_pyinfra(inventory, DEPLOY_FILE, limit=hosts, cwd=cwd, data=data,
                                 spec=RunSpec(journal=str(records), bench_run=run_id),
                                 on_line=on_line)
        ran = journal.read(records)  # each host's own records, never the text
    got = ran.outcomes(hosts)
    outcomes = []
    for name in hosts:
        entry = ran.bench(name)
        if entry is None:
            outcomes.append(BenchOutcome(
                ok=False, host=name, message=f"{name}: no benchmark result (pyinfra exit status "
                                             f"{run.rc}):\n" + (got[name].message
                                                                 or got[name].kind)))
        else:
            ok, message = gate(entry["current"], entry["previous"], min_ratio)
            outcomes.append(BenchOutcome(ok, message, entry["current"], entry["previous"], name))
    return outcomes


def run_and_gate(inventory: str, host: str, min_ratio: float, cwd=".", data=None) -> BenchOutcome:
    """Benchmark HOST and gate it against its previous configuration (for the rollout)."""
    return run_hosts(inventory, [host], min_ratio, cwd=cwd, data=data)[0]


def add_parser(sub) -> None:
    p = common.add_command(sub, "bench",
                           help="run sglang.bench_serving on hosts, record and compare output "
                                "token throughput with the previous configuration",
                           failed="a host's benchmark failed, or its throughput fell below "
                                  "--min-throughput-ratio")
    common.add_inventory(p)
    common.add_limit(p)
    common.add_data(p)
    p.add_argument("--min-throughput-ratio", type=float, default=None, metavar="R",
                   help="fail (exit 1) when a level's output tok/s is below R x the previous "
                        "configuration's (e.g. 0.95)")
    common.add_json(p, "one outcome per host")


def check_ratio(ratio: float | None) -> float | None:
    """--min-throughput-ratio (of bench and rollout): None or a positive finite number."""
    from sglang_deploy.core.errors import UsageError

    if ratio is not None and not (ratio > 0 and math.isfinite(ratio)):
        raise UsageError(what="--min-throughput-ratio: a positive number", found=str(ratio),
                         fix="e.g. --min-throughput-ratio 0.95")
    return ratio


def run(args) -> int:
    from sglang_deploy.controller import routing
    from sglang_deploy.controller.hosts import select

    ratio = check_ratio(args.min_throughput_ratio)
    chosen = select(args.inventory, args.limit, args.data).hosts
    serving = {h for h, _ in routing.fleet(args.inventory).workers}  # not the routers
    hosts = [h for h in chosen if h in serving]

    def progress(line: str) -> None:  # pyinfra's output: never on stdout
        print(line, file=sys.stderr)

    outcomes = run_hosts(args.inventory, hosts, ratio, on_line=progress, data=args.data)
    if args.json:
        print(json.dumps([asdict(o) for o in outcomes], indent=2, sort_keys=True))
    else:
        done = [(o.current, o.previous) for o in outcomes if o.current]
        if done:
            t = common.table(TABLE_COLUMNS, title="output token throughput")
            for row in table_rows(done):
                t.add_row(*row)
            common.print_table(t)
        for o in outcomes:
            print(("ok:   " if o.ok else "FAIL: ") + o.message)
    return common.EXIT_OK if all(o.ok for o in outcomes) else common.EXIT_FAILED

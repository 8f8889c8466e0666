"""Run the benchmarks on the local testbed; write bench/results/<timestamp>.json and render
docs/performance.md.

    .venv/bin/python bench/run_all.py                       # everything, default counts
    .venv/bin/python bench/run_all.py --runs 2 --only noop,latency
    .venv/bin/python bench/run_all.py --render bench/results/X.json [--before Y.json]
    .venv/bin/python bench/run_all.py --render latest   # the newest file of bench/results/

Needs root (the testbed) and honours TESTBED_DIR / TESTBED_SUBNET / TESTBED_PREFIX. Scripts,
not tests: figures measured on the testbed are simulated server timings on this machine.
The fleet is left up unless --down (the testbed's own `down` then removes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import ROOT, log, plural

SUITES = ("noop", "latency", "rollout", "dr", "scale", "router", "versions", "detection", "stage", "stagerev",
          "residency", "lxcdr")


def git_commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+dirty" if dirty else "")


def run_suites(args) -> dict:
    import importlib

    started = time.time()
    result = {"started": started, "started_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "commit": git_commit(), "machine": common.machine(), "load_before": common.loadavg(),
              "conditions": args.conditions,
              "config": {"runs": args.runs, "scale_runs": args.scale_runs, "noop_hosts": args.noop_hosts,
                         "scale_hosts": args.scale_hosts, "only": args.only},
              "testbed": {k: os.environ.get(k) for k in ("TESTBED_DIR", "TESTBED_SUBNET", "TESTBED_PREFIX")},
              "figures": [], "errors": {}, "durations_s": {}}
    for name in args.only:
        t0 = time.monotonic()
        log(f"== {name}")
        try:
            figs = importlib.import_module(f"bench.{name}").run(args)
        except Exception as e:  # a broken suite must not lose the others' figures
            traceback.print_exc()
            result["errors"][name] = f"{type(e).__name__}: {e}"[:3000]
            figs = [common.not_measured(name, name, "s", f"the {name} suite failed: {str(e).splitlines()[0][:200]}")]
        result["figures"] += [{**f.to_json(), "suite": name} for f in figs]
        result["durations_s"][name] = round(time.monotonic() - t0, 1)
        log(f"== {name} done in {result['durations_s'][name]}s")
    result["finished"] = time.time()
    result["load_after"] = common.loadavg()
    return result


def _updates(result: dict) -> list:
    u = result.get("updated") or []
    return [u] if isinstance(u, dict) else list(u)


def current_updates(result: dict) -> tuple[list, int]:
    """The reruns whose figures are still shown (a rerun all of whose suites were rerun
    later is superseded), and how many were superseded (all stay in the results file)."""
    ups = _updates(result)
    kept = [u for i, u in enumerate(ups)
            if any(all(s not in later["suites"] for later in ups[i + 1:]) for s in u["suites"])]
    return kept, len(ups) - len(kept)


def merge_update(old: dict, new: dict) -> dict:
    """OLD's figures with those of NEW's suites replaced in place (a figure without a
    ``suite`` field belongs to the suite named by its key, or to the suite run now that
    produced the same key)."""
    suites = set(new["config"]["only"])
    new_keys = {f["key"] for f in new["figures"]}

    def replaced(f):
        return f.get("suite") in suites or f["key"] in suites or f["key"] in new_keys

    figures, inserted = [], set()
    for f in old["figures"]:
        if not replaced(f):
            figures.append(f)
            continue
        suite = f.get("suite") or next((g["suite"] for g in new["figures"] if g["key"] == f["key"]), f["key"])
        if suite not in inserted:
            figures += [g for g in new["figures"] if g["suite"] == suite]
            inserted.add(suite)
    figures += [g for g in new["figures"] if g["suite"] not in inserted]
    errors = {k: v for k, v in old.get("errors", {}).items() if k not in suites}
    errors.update(new.get("errors", {}))
    durations = {**old.get("durations_s", {}), **new.get("durations_s", {})}
    return {**old, "figures": figures, "errors": errors, "durations_s": durations,
            "load_after": new["load_after"],
            "updated": _updates(old) + [{"suites": sorted(suites), "at": new["started_iso"],
                                         "commit": new["commit"], "load_before": new["load_before"]}],
            "finished": old["finished"] + (new["finished"] - new["started"])}


# ------------------------------------------------------------------------------ rendering
def _fmt(x, unit="s"):
    if x is None:
        return "-"
    if unit == "MiB":
        return f"{x:.0f} MiB"
    if unit in ("requests", "commands"):
        return f"{x:.0f}"
    if unit == "bytes":
        return f"{x / 1000:.1f} KB"
    if unit == "installs":
        return f"{x:.2f} installs"
    if unit == "GB/s":
        return f"{x:.2f} GB/s"
    return f"{x:.3f} s" if abs(x) < 10 else f"{x:.1f} s"


def _met(m):
    return {True: "yes", False: "**no**", None: "-"}[m]


def table(figures: list[dict]) -> list[str]:
    out = ["| figure | median | runs | baseline (median) | ratio | goal | met? |",
           "|---|---|---|---|---|---|---|"]
    for f in figures:
        if not f["measured"]:
            out.append(f"| {f['name']} | not measured | 0 | - | - | {f.get('goal') or '-'} | - |")
            continue
        base = f"{f['baseline_name']} ({_fmt(f['baseline_median'], f['unit'])})" if f.get("baseline_name") else "-"
        ratio = f"{f['ratio']:.2f}x" if f.get("ratio") is not None else "-"
        out.append(f"| {f['name']} | {_fmt(f['median'], f['unit'])} | {f['runs']} | {base} | {ratio} | "
                   f"{f.get('goal') or '-'} | {_met(f['met'])} |")
    return out


RESULTS = ROOT / "bench" / "results"
#: a hand-written section of docs/performance.md, rendered near its top (kept here, not in the
#: page, so that rendering the page again keeps it)
RELEASE_CHECK = ROOT / "bench" / "release-check.md"
RELEASE_CHECK_PLACEHOLDER = """## Release check (lock --check)

<!-- release-check: write this section in bench/release-check.md (its first line is this
heading); bench/run_all.py renders it here. -->
Not written yet.
"""


def newest_result(folder: Path = RESULTS) -> Path:
    """The newest results file of FOLDER (names are UTC timestamps: the last in sort order)."""
    found = sorted(folder.glob("*.json"))
    if not found:
        raise FileNotFoundError(f"no results file in {folder}: run bench/run_all.py")
    return found[-1]


def render(result: dict, before: dict | None = None, source: str | None = None) -> str:
    """docs/performance.md from one results file: the run's conditions, its figures, the
    release-check section (``RELEASE_CHECK``) and how to reproduce it. SOURCE names the results
    file in the page. The history of earlier runs is bench/performance-notes.md (linked)."""
    m = result["machine"]
    release = RELEASE_CHECK.read_text() if RELEASE_CHECK.exists() else RELEASE_CHECK_PLACEHOLDER
    lines = [
        "# Performance",
        "",
        "Generated by `bench/run_all.py` from "
        + (f"`{source}` (the newest run)" if source else "one run") + "; do not edit by hand.",
        "Every figure is measured on the local testbed (LXC containers from 2026-12-05, systemd-nspawn",
        "before: each rerun below is dated; hosts on the machine below,",
        "simulated GPUs and a simulated server: **server timings are simulated**); each figure's",
        "baseline is measured in the same run. Medians of `runs` runs. How each figure is measured:",
        "[bench/performance-notes.md](../bench/performance-notes.md#how-each-figure-is-measured);",
        "the history of earlier runs follows it there.",
        "",
        f"- Run: {result['started_iso']}, commit `{result['commit']}`, "
        f"{(result['finished'] - result['started']) / 60:.1f} min of measuring (reruns included)",
        f"- Machine: {m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, kernel {m['kernel']}, "
        f"Python {m['python']}",
        f"- Load average (1/5/15 min) before: {' / '.join(map(str, result['load_before']))}; "
        f"after: {' / '.join(map(str, result['load_after']))}",
        f"- Conditions: {result.get('conditions') or 'not stated'}",
        *[f"- Rerun of {', '.join(u['suites'])} at {u['at']} (commit `{u['commit']}`, load before "
          f"{' / '.join(map(str, u['load_before'] or ['?']))}): their figures replace the first run's"
          for u in current_updates(result)[0]],
        *([(f"- Earlier reruns superseded by later ones of the same suites: "
            f"{current_updates(result)[1]} (listed in the results file's `updated`)")]
          if current_updates(result)[1] else []),
        f"- Counts: {result['config']['runs']} runs per figure, {result['config']['scale_runs']} for scale",
        "",
        release.rstrip(),
        "",
        "## Figures",
        "",
        *table(result["figures"]),
        "",
        "## Notes per figure",
        "",
    ]
    for f in result["figures"]:
        extra = f.get("extra") or {}
        bits = [f["notes"]] if f.get("notes") else []
        if f["measured"]:
            bits.append("samples: " + ", ".join(_fmt(x, f["unit"]) for x in f["samples"]))
        if "profile_1_host" in extra:
            prof = extra["profile_1_host"]
            facts = "; ".join(f"{k} {v['count']}x {v['seconds']:.2f}s" for k, v in prof["facts"].items())
            bits.append(f"round trips of one no-op run (1 host, -vv): {plural(prof['commands'], 'command')}; "
                        f"facts: {facts}")
        if "controller_cpu_s" in extra:
            bits.append("controller CPU (pyinfra user+sys, median): " + ", ".join(
                f"{k.replace('_', ' ')} {statistics.median(v):.2f} s" for k, v in extra["controller_cpu_s"].items() if v))
        if "startup_s" in extra:
            bits.append("server restart-to-ready (simulated): "
                        + ", ".join(f"{x:.2f} s" for x in extra["startup_s"]))
        lines.append(f"- **{f['name']}**: " + ". ".join(bits))
    if result.get("errors"):
        lines += ["", "## Suite errors", ""]
        lines += [f"- `{k}`: {v.splitlines()[0][:300]}" for k, v in result["errors"].items()]
    if before:
        prev = {f["key"]: f for f in before["figures"]}
        lines += ["", f"## Before / after (before: {before['started_iso']}, commit `{before['commit']}`; "
                      f"conditions: {before.get('conditions') or 'not stated'})", "",
                  "| figure | before (median) | after (median) | after / before | ratio to baseline before -> after |",
                  "|---|---|---|---|---|"]
        for f in result["figures"]:
            b = prev.get(f["key"])
            if not b or not b["measured"] or not f["measured"]:
                continue
            r = f"{f['median'] / b['median']:.2f}x" if b["median"] else "-"
            rr = (f"{b['ratio']:.2f}x -> {f['ratio']:.2f}x"
                  if b.get("ratio") is not None and f.get("ratio") is not None else "-")
            lines.append(f"| {f['name']} | {_fmt(b['median'], f['unit'])} | {_fmt(f['median'], f['unit'])} "
                         f"| {r} | {rr} |")
    lines += ["", "## Reproduce", "", *REPRODUCE.splitlines(), ""]
    return "\n".join(lines)


REPRODUCE = """\
    export TESTBED_DIR=... TESTBED_SUBNET=... TESTBED_PREFIX=...   # optional
    .venv/bin/python bench/run_all.py [--runs N] [--scale-hosts N] [--only noop,latency,...]
        [--before bench/results/EARLIER.json] [--conditions TEXT]
    .venv/bin/python bench/run_all.py --render latest    # this page again, from the newest run

Scripts, not tests (root; honouring `TESTBED_DIR`/`TESTBED_SUBNET`/`TESTBED_PREFIX`): each
figure measured on the testbed beside its baseline in the same run, written to
`bench/results/<timestamp>.json` and rendered here (medians, ratios, goals, the machine);
`--only SUITE[,...] --update RESULTS` reruns some suites into a new file. About 6 minutes with
the default counts on a quiet 2-core machine, longer on busy cores.
`.venv/bin/python bench/timeline.py [--hosts 8]`, a diagnostic: a no-op run's phases on 1 and N
hosts, with the cores busy and the controller's (bench/performance-notes.md, fifth round).

Commit the new results file with the page: `tests/unit/test_performance_doc.py` checks that
this page is what `--render latest` makes of the newest file in `bench/results/`."""


def _shown(path: Path) -> str:
    """PATH as the page names it: relative to the repository when it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")),
                   help="runs per figure (default 3, env BENCH_RUNS)")
    p.add_argument("--scale-runs", type=int, default=int(os.environ.get("BENCH_SCALE_RUNS", "2")))
    p.add_argument("--noop-hosts", type=int, default=8)
    p.add_argument("--scale-hosts", type=int, default=int(os.environ.get("BENCH_SCALE_HOSTS", "16")))
    p.add_argument("--only", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    p.add_argument("--versions", default="before=93972c5,after=HEAD",
                   help="versions suite: LABEL=REV,... (the first is the baseline; HEAD = this tree)")
    p.add_argument("--before", help="an earlier results JSON: adds a before/after table")
    p.add_argument("--conditions", default="", help="load conditions to print with the figures")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "performance.md"))
    p.add_argument("--render", metavar="RESULTS",
                   help="only render RESULTS (a results JSON, or `latest`: the newest of bench/results/) to --doc")
    p.add_argument("--down", action="store_true", help="take the testbed down at the end")
    p.add_argument("--update", metavar="RESULTS",
                   help="rerun only the --only suites and replace their figures in RESULTS "
                        "(e.g. after fixing one suite); writes a new results file")
    args = p.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    bad = [s for s in args.only if s not in SUITES]
    if bad:
        p.error(f"unknown suites {bad}; known: {', '.join(SUITES)}")
    before = json.loads(Path(args.before).read_text()) if args.before else None
    source = None
    if args.render:
        path = newest_result() if args.render == "latest" else Path(args.render)
        result = json.loads(path.read_text())
        source = _shown(path)
    else:
        if os.geteuid() != 0:
            p.error("the testbed needs root")
        common.byte_compile()
        try:
            result = run_suites(args)
        finally:
            if args.down:
                common.testbed("down", check=False)
        if args.update:
            result = merge_update(json.loads(Path(args.update).read_text()), result)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / time.strftime("%Y%m%dT%H%M%SZ.json", time.gmtime(result["started"]))
        path.write_text(json.dumps(result, indent=2) + "\n")
        log(f"results: {path}")
        source = _shown(path)
    Path(args.doc).write_text(render(result, before, source))
    log(f"rendered {args.doc}")
    print("\n".join(table(result["figures"])))
    return 1 if result.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())

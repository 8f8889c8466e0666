"""The figures an operator of real hosts feels, for several versions of the tool in one run.

    .venv/bin/python bench/run_all.py --only versions --versions before=93972c5,after=HEAD

Each version is a git revision checked out (detached) under bench/results/checkouts/ and run
from there with this checkout's Python environment (its own ``sglang_deploy`` first on the
path). On the same testbed hosts, per version, interleaved run by run:

- SSH round trips per host of a no-op deploy (commands sent, from a ``-vv`` run of one host);
- bytes sent and received per host of a no-op deploy (the counters of the host's veth: SSH
  handshake and every command, both ways);
- controller CPU per host of a no-op deploy at 16 and at 32 hosts (the pyinfra process's own
  user + system CPU, divided by the hosts);
- time from a unit change to a verified server (one host: a new ``sglang_env`` value, the
  deploy that restarts and verifies it, wall time);
- rollout overhead per host (``sglang-deploy rollout`` on 3 hosts, minus each server's own
  restart-to-ready time).

Each version converges the hosts first (the tools it ships differ), so its no-op runs see a
host converged by itself. The first version listed is the baseline of the figures.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from bench.common import (
    PY,
    ROOT,
    Figure,
    bench_env,
    changes,
    deploy,
    ensure_hosts,
    log,
    median,
    round_trips,
    run_timed,
)
from testbed import net

CHECKOUTS = ROOT / "bench" / "results" / "checkouts"


def checkout(rev: str) -> Path:
    """A detached checkout of REV (kept between runs; HEAD means this working tree)."""
    if rev in ("HEAD", "."):
        return ROOT
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    path = CHECKOUTS / sha
    if not path.exists():
        CHECKOUTS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), sha], cwd=ROOT,
                       check=True, capture_output=True)
    return path


def veth_bytes(host: str) -> int:
    """Bytes both ways through the host's veth so far (its bridge port in the root namespace)."""
    stats = Path("/sys/class/net") / net.veth_name(host) / "statistics"
    return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))


def cli_argv(code: Path) -> list[str]:
    """`sglang-deploy` of a checkout: the entry point its pyproject.toml declares (the console
    script's), so that no module of the tool is named here."""
    target = tomllib.loads((code / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = target["sglang-deploy"].partition(":")
    return [PY, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def rollout_overhead(code: Path, hosts: list[str]) -> list[float]:
    """Per host: rollout step seconds - the server's restart-to-ready seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rollout.json"
        argv = [*cli_argv(code), "rollout", str(ROOT / "bench" / "inventory.py"), "--report",
                str(report)]
        for h in hosts:
            argv += ["--limit", h]
        env = bench_env({"sglang_env": {"BENCH_RUN": f"rollout-{time.time():.3f}"}})
        env["PYTHONPATH"] = str(code)
        t = run_timed(argv, env=env, cwd=code)
        if not t.ok or not report.exists():
            raise RuntimeError(f"rollout with {code} failed (rc {t.rc}):\n{t.tail()}")
        data = json.loads(report.read_text())
    steps = data["hosts"] if isinstance(data, dict) else data
    return [round(s["seconds"] - s["restart_to_ready_s"], 3) for s in steps
            if s.get("status") == "done" and s.get("restart_to_ready_s") is not None]


def measure(label: str, code: Path, hosts: list[str], sizes: list[int], runs: int) -> dict:
    one = hosts[:1]
    deploy(hosts, code=code)  # converge: this version's tools on every host
    out: dict = {"label": label, "code": str(code), "round_trips": [], "bytes": [],
                 "changes": [], **{f"cpu_per_host_{n}": [] for n in sizes},
                 "unit_change_s": [], "rollout_overhead_s": []}
    for i in range(runs):
        before = veth_bytes(one[0])
        t = deploy(one, code=code, verbose=True)
        out["bytes"].append(veth_bytes(one[0]) - before)
        out["round_trips"].append(round_trips(t)["commands"])
        out["changes"].append(changes(t))
        for n in sizes:
            t = deploy(hosts[:n], code=code)
            out[f"cpu_per_host_{n}"].append(round(t.cpu_s / n, 4))
            out["changes"].append(changes(t))
        t = deploy(one, code=code, extra_data={"sglang_env": {"BENCH_RUN": f"{label}-{time.time():.3f}"}})
        out["unit_change_s"].append(round(t.seconds, 2))
        out["rollout_overhead_s"] += rollout_overhead(code, hosts[:3])
        log(f"versions {label} run {i + 1}/{runs}: round trips {out['round_trips'][-1]}, bytes "
            f"{out['bytes'][-1]}, cpu/host " + ", ".join(
                f"{n}: {out[f'cpu_per_host_{n}'][-1] * 1000:.1f} ms" for n in sizes)
            + f", unit change {out['unit_change_s'][-1]} s, rollout overhead "
            f"{out['rollout_overhead_s'][-3:]}")
    deploy(hosts[:3], code=code)  # leave the hosts converged on the plain data
    return out


FIGURES = (
    ("round_trips", "SSH round trips per host, no-op deploy", "commands"),
    ("bytes", "Bytes sent and received per host, no-op deploy", "bytes"),
    ("cpu_per_host_16", "Controller CPU per host, no-op deploy of 16 hosts", "s"),
    ("cpu_per_host_32", "Controller CPU per host, no-op deploy of 32 hosts", "s"),
    ("unit_change_s", "Unit change to a verified server (1 host)", "s"),
    ("rollout_overhead_s", "Rollout overhead per host (3 hosts)", "s"),
)


def run(cfg) -> list[Figure]:
    versions = [v.split("=", 1) for v in cfg.versions.split(",")]
    sizes = sorted({min(16, cfg.scale_hosts), cfg.scale_hosts})
    hosts = ensure_hosts(max(sizes))
    results = {}
    for rnd in range(cfg.runs):  # interleaved: each round measures every version once
        for label, rev in versions:
            r = measure(label, checkout(rev), hosts, sizes, 1)
            acc = results.setdefault(label, {**r, **{k: [] for k in r if isinstance(r[k], list)}})
            for k, v in r.items():
                if isinstance(v, list):
                    acc[k] += v
    base_label = versions[0][0]
    figs = []
    for label, _ in versions[1:]:
        for key, name, unit in FIGURES:
            key_n = key if key in results[label] else None
            if key_n is None:
                continue
            figs.append(Figure(
                key=f"versions_{label}_{key}", name=f"{name}: {label}", unit=unit,
                samples=results[label][key], baseline_name=f"{base_label} ({versions[0][1]})",
                baseline_samples=results[base_label][key],
                notes=f"{label} = {dict(versions)[label]}; medians {median(results[label][key])} "
                      f"vs {median(results[base_label][key])}",
                extra={"changes": results[label]["changes"]}))
    log("versions: " + json.dumps({k: {f: median(v[f]) for f, _, _ in FIGURES if f in v}
                                   for k, v in results.items()}))
    return figs

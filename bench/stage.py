"""Rollouts that stage before they drain: a new release over 3 hosts under load, with and
without staging, side by side in one run, beside a config-only change.

The router host (SMG) in front of the 3 testbed hosts, a steady load through it
(bench/router_load.py). Per run, three rollouts of `inventory/testbed.py`, each under load:

1. a config-only change (a new `sglang_env` value): the baseline of a host's time out of the
   router (nothing to install);
2. a new release (the testbed lock plus a comment line: a new release id, installed offline
   from the wheelhouse) with `--no-stage`: each host installs while it is out of the router;
3. another new release, staged (the default): every host installs and checks at once before
   the first drain; each batch then only drains, restarts, verifies and puts back.

Figures: the total time of 3 against 2 (goal: down by at least the (N - 1) installs, an
install being a host's deploy step with --no-stage minus its step when staged), each host's
time out of the router (its drain's start to its put back) of 3 against 1 (goal: within 1.3x),
and the failed requests during 3.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from pathlib import Path

from bench import router_load
from bench.common import PY, ROOT, Figure, log, median, state, testbed

INVENTORY = "inventory/testbed.py"
DATA = ["gpu_p2p_min_gbps=0.05"]
HOSTS = 3
#: said beside the figures: the testbed's 3 hosts share the controller's cores
SHARED = ("measured on a 2-core machine shared with 5 other sessions' testbeds and tests, "
          "its 3 hosts installing on the same 2 cores (a real fleet's hosts install each on "
          "its own CPUs, disk and network)")


def router_of() -> tuple[str, str]:
    st = state()
    router = next(h for h in st["hosts"] if h.get("role") == "router")
    key = (Path(st["state_dir"]) / "router-key").read_text().strip()
    return f"http://{router['address']}:30000", key


def cli(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(PY).parent / "sglang-deploy"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def converge() -> None:
    argv = [str(Path(PY).parent / "pyinfra"), "-y", INVENTORY, "deploy.py"]
    for d in DATA:
        argv += ["--data", d]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"the routed fleet's deploy failed:\n{(r.stdout + r.stderr)[-3000:]}")


def new_release(folder: Path) -> str:
    path = folder / f"release-{uuid.uuid4().hex[:8]}.txt"
    path.write_text((ROOT / "locks/testbed.txt").read_text() + f"# bench stage {path.name}\n")
    return str(path)


def rollout(url: str, key: str, folder: Path, data: list[str], *args: str) -> dict:
    """One rollout under load: its report, the load's summary."""
    report = folder / f"rollout-{uuid.uuid4().hex[:8]}.json"
    argv = ["rollout", INVENTORY, "--report", str(report), *args]
    for d in [*DATA, *data]:
        argv += ["--data", d]
    result, r = router_load.run_through(url, key, "glm-5", lambda: cli(*argv))
    if r.returncode != 0 or not report.exists():
        raise RuntimeError(f"rollout {' '.join(args)} failed (rc {r.returncode}):\n"
                           f"{(r.stdout + r.stderr)[-3000:]}")
    doc = json.loads(report.read_text())
    if [h["status"] for h in doc["hosts"]] != ["done"] * HOSTS:
        raise RuntimeError(f"rollout {' '.join(args)}: not every host done: {doc['hosts']}")
    return {"doc": doc, "load": result.summary()}


def one_run(url: str, key: str, folder: Path) -> dict:
    env = f'sglang_env={{"BENCH_STAGE": "{uuid.uuid4().hex[:6]}"}}'
    got = {"config": rollout(url, key, folder, [env])}
    got["nostage"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"], "--no-stage")
    got["staged"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"])
    for name, g in got.items():
        d = g["doc"]
        log(f"stage: {name}: total {d['seconds']:.1f}s; out of the router "
            + ", ".join(f"{h['host']} {h['out_of_router_s']}s" for h in d["hosts"])
            + f"; failed requests {g['load']['during']['failed']} of {g['load']['during']['requests']}")
    return got


def run(cfg) -> list[Figure]:
    testbed("up", "--hosts", str(HOSTS), "--router", timeout=900)
    runs = []
    try:
        converge()
        url, key = router_of()
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(cfg.runs):
                runs.append(one_run(url, key, Path(tmp)))
        converge()
    finally:
        testbed("down", "--router", check=False, timeout=300)
    return figures(runs)


def _hosts(runs: list[dict], case: str, key: str) -> list[float]:
    return [h[key] for r in runs for h in r[case]["doc"]["hosts"]]


def install_s(run: dict) -> float:
    """One run's install: the median over hosts of a host's deploy step with --no-stage minus
    its step when staged (what staging took out of the time a host is out of the router)."""
    return median([a["seconds"] - b["seconds"] for a, b in
                   zip(run["nostage"]["doc"]["hosts"], run["staged"]["doc"]["hosts"])])


def figures(runs: list[dict], shared: str = SHARED) -> list[Figure]:
    total = [r["staged"]["doc"]["seconds"] for r in runs]
    total_off = [r["nostage"]["doc"]["seconds"] for r in runs]
    installs = [install_s(r) for r in runs]
    saved = [(off - on) / i for off, on, i in zip(total_off, total, installs)]
    stage_s = [r["staged"]["doc"]["hosts"][0]["stage_seconds"] for r in runs]
    out_staged = _hosts(runs, "staged", "out_of_router_s")
    load = [r["staged"]["load"]["during"] for r in runs]
    return [
        Figure(key="stage_total", unit="s",
               name=f"Rollout of a new release, {HOSTS} hosts under load: total, staged",
               samples=total, baseline_name="same with --no-stage", baseline_samples=total_off,
               notes=f"{shared}; the staging run of all {HOSTS} hosts at once "
                     f"{', '.join(f'{x:.1f} s' for x in stage_s)}; the testbed's release is "
                     "installed offline from the wheelhouse (a real one: 196 packages, 9.6 GB)",
               extra={"stage_s": stage_s}),
        Figure(key="stage_saved", unit="installs",
               name=f"Time a staged rollout saves, in installs ({HOSTS} hosts, same run)",
               samples=saved, goal=f">= {HOSTS - 1} installs", goal_kind="value_min",
               goal_value=HOSTS - 1,
               notes="per run: (total with --no-stage - total staged) / that run's install (the "
                     "median over hosts of a host's deploy step with --no-stage minus its step "
                     "when staged: install, JIT check and smoke); installs "
                     + ", ".join(f"{x:.1f} s" for x in installs) + f"; {shared}",
               extra={"install_s": installs}),
        Figure(key="stage_out", unit="s",
               name="A host's time out of the router, new release staged",
               samples=out_staged, baseline_name="a config-only change (new sglang_env)",
               baseline_samples=_hosts(runs, "config", "out_of_router_s"),
               goal="<= 1.3x config-only", goal_kind="ratio_max", goal_value=1.3,
               notes="its drain's start to its put back, one sample per host per run; with "
                     "--no-stage: " + ", ".join(
                         f"{x:.1f} s" for x in _hosts(runs, "nostage", "out_of_router_s")),
               extra={"nostage_out_s": _hosts(runs, "nostage", "out_of_router_s")}),
        Figure(key="stage_failed", unit="requests",
               name="Failed requests through the router during the staged rollout",
               samples=[x["failed"] for x in load], goal="0 failed", goal_kind="value_max",
               goal_value=1,
               notes=f"{router_load.RATE:g} req/s through the router; "
                     f"{sum(x['requests'] for x in load)} requests during the staged rollouts"),
    ]

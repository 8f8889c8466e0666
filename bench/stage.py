"""Rollouts that stage before they drain: a new release over 3 hosts under load, with and
without staging, side by side in one run, beside a config-only change.

The router host (SMG) in front of the 3 testbed hosts, a steady load through it
(bench/router_load.py). Per run, three rollouts of `inventory/testbed.py`, each under load:

1. a config-only change (a new `sglang_env` value): the baseline of a host's time out of the
   router (nothing to install);
2. a new release (the testbed lock plus a comment line: a new release id, installed offline
   from the wheelhouse) with `--no-stage`: each host installs while it is out of the router;
3. another new release, staged (the default): every host installs and checks at once before
   the first drain; each batch then only drains, restarts, verifies and puts back;
4. a new model revision (a new folder of the same size, its shards evicted from the page
   cache as after a download days ago), staged: the staging run warms it on every host while
   they serve, before the first drain (issue 42);
5. the same with the warm off (`sglang_model_warm: false`): what the warm takes out of a
   host's time out of the router.

The fleet serves a model of real bytes (``BENCH_STAGE_MODEL_MIB``, default 1024 MiB in 8
shards, at the residency bench's path), so that a restart reads as much as a revision brings.

Each testbed host is held to its own share of this machine's cores (``HOST_CORES``, ``python
-m testbed cpu``, testbed/README.md): a real fleet's hosts install, import and smoke a release
each on its own CPUs, so that one host's install takes as long whether the others install at
the same moment or not; without the limit the 3 hosts staging at once share 2 cores (and the
controller's), which no real fleet sees. The same pair 2 and 3 is then rolled again without
the limit (4, 5: the hosts on the shared cores), its figures in the notes beside.

Figures: the total time of 3 against 2 (goal: down by at least the (N - 1) installs, an
install being a host's deploy step with --no-stage minus its step when staged), each host's
time out of the router (its drain's start to its put back) of 3 against 1 (goal: within 1.3x),
and the failed requests during 3.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import uuid
from pathlib import Path

from bench import residency, router_load
from bench.common import PY, ROOT, Figure, log, median, ssh, state, testbed

INVENTORY = "inventory/testbed.py"
DATA = ["gpu_p2p_min_gbps=0.05", f"sglang_model_path={residency.MODEL}"]
#: where each run's new model revision is written (replaced run by run)
REVISION = "/srv/models/GLM-5-revision"
HOSTS = 3
#: each host's own CPUs (``testbed cpu``): 1.5 of the 2 cores for the 3 hosts, the rest for
#: the controller, the router and the load
HOST_CORES = 0.5
#: said beside the figures
SHARED = (f"each testbed host held to {HOST_CORES:g} of this machine's cores (`testbed cpu`: "
          "a real host installs on its own CPUs, its install as long whether the others "
          "install at once or not)")


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
    return {"doc": doc, "load": result.summary(), "staging_lat": staging_latencies(result, doc)}


def staging_latencies(result, doc: dict) -> list[float]:
    """The latencies of the requests that left while the staging run ran (the rollout's
    first STAGE_SECONDS, no host drained yet; the rollout's own start included): what the
    staging (a revision's warm) costs the serving fleet. Empty without staging."""
    stage_s = doc["hosts"][0].get("stage_seconds")
    during = [s for s in result.samples if s.phase == "during"]
    if not stage_s or not during:
        return []
    t0 = min(s.start for s in during)
    return sorted(s.seconds for s in during if s.ok and s.start <= t0 + stage_s)


def cpu_limit(cores: float, check: bool = True) -> None:
    """Each server host held to CORES cores (0: the limit off)."""
    for name in [h["name"] for h in state()["hosts"] if h.get("role") != "router"]:
        testbed("cpu", name, f"{cores:g}", check=check, timeout=60)


def model_mib() -> int:
    return int(os.environ.get("BENCH_STAGE_MODEL_MIB", "1024"))


def servers() -> list[str]:
    return [h["name"] for h in state()["hosts"] if h.get("role") != "router"]


def new_revision(mib: int, serving: str | None = None) -> str:
    """A new model revision on every server host: a folder of MIB MiB (other bytes than the
    last one), its shards evicted from the page cache; its path. Earlier revisions are
    removed but the one SERVING (as a deploy keeps the old revision beside the new one: its
    config.json is what the autotune cache's carry compares)."""
    path = f"{REVISION}-{uuid.uuid4().hex[:6]}"
    code = (f"from model import make_model_dir; make_model_dir({path!r}, {residency.SHARDS}, "
            f"{mib * (1 << 20) // residency.SHARDS})")
    drop = residency.DROP.replace(residency.MODEL, path)
    keep = f" ! -path {shlex.quote(serving)}" if serving else ""
    for host in servers():
        ssh(host, f"find /srv/models -maxdepth 1 -path '{REVISION}-*'{keep} -exec rm -rf {{}} +; "
                  f"cd /opt/sglang-sim && python3 -c {shlex.quote(code)} && {drop}", timeout=600)
    return path


def revision_rollouts(url: str, key: str, folder: Path) -> dict:
    """A new model revision staged (warmed before the first drain), then another with the
    warm off; afterwards the fleet serves the bench's model again."""
    mib = model_mib()
    first = new_revision(mib)
    got = {"revision": rollout(url, key, folder, [f"sglang_model_path={first}"])}
    got["revision_cold"] = rollout(url, key, folder, [
        f"sglang_model_path={new_revision(mib, serving=first)}", "sglang_model_warm=false"])
    converge()
    return got


def one_run(url: str, key: str, folder: Path) -> dict:
    env = f'sglang_env={{"BENCH_STAGE": "{uuid.uuid4().hex[:6]}"}}'
    cpu_limit(HOST_CORES)
    got = {"config": rollout(url, key, folder, [env])}
    got["nostage"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"], "--no-stage")
    got["staged"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"])
    got.update(revision_rollouts(url, key, folder))
    cpu_limit(0)  # the same pair on the shared cores
    got["nostage_shared"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"],
                                    "--no-stage")
    got["staged_shared"] = rollout(url, key, folder, [f"sglang_lock={new_release(folder)}"])
    say(got)
    return got


def say(got: dict) -> None:
    for name, g in got.items():
        d = g["doc"]
        log(f"stage: {name}: total {d['seconds']:.1f}s; out of the router "
            + ", ".join(f"{h['host']} {h['out_of_router_s']}s" for h in d["hosts"])
            + f"; failed requests {g['load']['during']['failed']} of {g['load']['during']['requests']}")


def run(cfg) -> list[Figure]:
    return figures(measure(cfg, one_run))


def measure(cfg, one) -> list[dict]:
    """CFG.runs runs of ONE(url, key, folder) on the routed 3-host testbed (booted, the
    bench's model made and served first; the fleet restored afterwards)."""
    testbed("up", "--hosts", str(HOSTS), "--router", timeout=900)
    runs = []
    try:
        for host in servers():
            residency.make_model(host, model_mib())
        converge()
        url, key = router_of()
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(cfg.runs):
                runs.append(one(url, key, Path(tmp)))
    finally:
        for host in servers():
            ssh(host, f"rm -rf {REVISION}-*", check=False)
        subprocess.run([str(Path(PY).parent / "pyinfra"), "-y", INVENTORY, "deploy.py",
                        "--data", DATA[0]], check=False, cwd=ROOT, capture_output=True,
                       timeout=1800)
        cpu_limit(0, check=False)
        testbed("down", "--router", check=False, timeout=300)
    return runs


def _hosts(runs: list[dict], case: str, key: str) -> list[float]:
    return [h[key] for r in runs for h in r[case]["doc"]["hosts"]]


def install_s(run: dict, on: str = "staged", off: str = "nostage") -> float:
    """One run's install: the median over hosts of a host's deploy step with --no-stage minus
    its step when staged (what staging took out of the time a host is out of the router)."""
    return median([a["seconds"] - b["seconds"] for a, b in
                   zip(run[off]["doc"]["hosts"], run[on]["doc"]["hosts"])])


def saved_installs(runs: list[dict], on: str = "staged", off: str = "nostage") -> list[float]:
    """Per run: (total with --no-stage - total staged) / that run's install."""
    return [(r[off]["doc"]["seconds"] - r[on]["doc"]["seconds"]) / install_s(r, on, off)
            for r in runs]


def _s(xs) -> str:
    return ", ".join(f"{x:.1f} s" for x in xs)


def prepared(run: dict, case: str = "staged") -> float:
    """A run's seconds of rolling runs done while their hosts drained (the run's start,
    connections and reads: ``stages/rollgate.py``), summed over its hosts."""
    return sum(h.get("prepared_while_draining_s") or 0.0 for h in run[case]["doc"]["hosts"])


def phases(runs: list[dict]) -> str:
    """Where a staged rollout's time goes, medians over the runs' hosts."""
    staged_step = _hosts(runs, "staged", "seconds")
    off_step = _hosts(runs, "nostage", "seconds")
    out = _hosts(runs, "staged", "out_of_router_s")
    during = [h.get("prepared_while_draining_s") or 0.0 for r in runs
              for h in r["staged"]["doc"]["hosts"]]
    stage = median([r["staged"]["doc"]["hosts"][0]["stage_seconds"] for r in runs])
    return (f"per phase (medians): the staging run {stage:.1f} s "
            f"(all {HOSTS} hosts at once; it is also the check that every host answers); a "
            f"host's rolling step (deploy.py: pre-flight read, P2P retest, switch, unit, restart, "
            f"verify) {median(staged_step):.1f} s staged, of which {median(during):.1f} s (its "
            "start, connection and host reads) while it drained, "
            f"{median(off_step):.1f} s with --no-stage (install, JIT check and smoke too; "
            f"started after the drain, as before); the rest of a host's "
            f"{median(out):.1f} s out of the router is the drain (the router's removal) and the "
            "put back")


def figures(runs: list[dict], shared: str = SHARED) -> list[Figure]:
    total = [r["staged"]["doc"]["seconds"] for r in runs]
    total_off = [r["nostage"]["doc"]["seconds"] for r in runs]
    installs = [install_s(r) for r in runs]
    saved = saved_installs(runs)
    stage_s = [r["staged"]["doc"]["hosts"][0]["stage_seconds"] for r in runs]
    out_staged = _hosts(runs, "staged", "out_of_router_s")
    load = [r["staged"]["load"]["during"] for r in runs]
    pair = all("staged_shared" in r for r in runs)
    on_shared = "" if not pair else (
        "; the same pair without the limit (the 3 hosts on the 2 shared cores with the "
        "controller, as no real fleet installs): totals staged "
        + _s(r["staged_shared"]["doc"]["seconds"] for r in runs) + ", --no-stage "
        + _s(r["nostage_shared"]["doc"]["seconds"] for r in runs) + ", installs "
        + _s(install_s(r, "staged_shared", "nostage_shared") for r in runs) + ", saved "
        + ", ".join(f"{x:.2f}" for x in saved_installs(runs, "staged_shared", "nostage_shared"))
        + " installs")
    return [
        Figure(key="stage_total", unit="s",
               name=f"Rollout of a new release, {HOSTS} hosts under load: total, staged",
               samples=total, baseline_name="same with --no-stage", baseline_samples=total_off,
               notes=f"{shared}; {phases(runs)}; the staging runs "
                     f"{_s(stage_s)}; the testbed's release is installed offline from the "
                     "wheelhouse into each host's warm uv cache (hard links), so that a host's "
                     "install is mostly its release smoke (`import sglang`), CPU-bound; a real "
                     "one: 196 packages, 9.6 GB, the smoke 20-40 s",
               extra={"stage_s": stage_s}),
        Figure(key="stage_saved", unit="installs",
               name=f"Time a staged rollout saves, in installs ({HOSTS} hosts, same run)",
               samples=saved, goal=f">= {HOSTS - 1} installs", goal_kind="value_min",
               goal_value=HOSTS - 1,
               notes="per run: (total with --no-stage - total staged) / that run's install (the "
                     "median over hosts of a host's deploy step with --no-stage minus its step "
                     "when staged: install, JIT check and smoke); installs "
                     + _s(installs) + "; of the time saved, the staged rolling runs' steps "
                     "done while their hosts drained (--no-stage keeps today's order: drain, "
                     "then the run): " + _s(prepared(r) for r in runs)
                     + ", the rest the installs taken out of the rolling steps less the "
                     f"staging run; {shared}{on_shared}",
               extra={"install_s": installs, "saved_shared": (
                   saved_installs(runs, "staged_shared", "nostage_shared") if pair else None)}),
        Figure(key="stage_out", unit="s",
               name="A host's time out of the router, new release staged",
               samples=out_staged, baseline_name="a config-only change (new sglang_env)",
               baseline_samples=_hosts(runs, "config", "out_of_router_s"),
               goal="<= 1.3x config-only", goal_kind="ratio_max", goal_value=1.3,
               notes="its drain's start to its put back, one sample per host per run; with "
                     "--no-stage: " + ", ".join(
                         f"{x:.1f} s" for x in _hosts(runs, "nostage", "out_of_router_s")),
               extra={"nostage_out_s": _hosts(runs, "nostage", "out_of_router_s")}),
        *revision_figures(runs),
        Figure(key="stage_failed", unit="requests",
               name="Failed requests through the router during the staged rollout",
               samples=[x["failed"] for x in load], goal="0 failed", goal_kind="value_max",
               goal_value=1,
               notes=f"{router_load.RATE:g} req/s through the router; "
                     f"{sum(x['requests'] for x in load)} requests during the staged rollouts"),
    ]


def revision_figures(runs: list[dict]) -> list[Figure]:
    """A host's time out of the router for a new model revision, staged and warmed, against
    the config-only change of the same runs (issue 42: within 1.2x); its failed requests."""
    if not all("revision" in r for r in runs):
        return []
    cold = _hosts(runs, "revision_cold", "out_of_router_s")
    load = [r[c]["load"]["during"] for r in runs for c in ("revision", "revision_cold")]
    size = f"{model_mib()} MiB in {residency.SHARDS} shards"
    warm_p99 = [x for r in runs if (x := p99(r["revision"].get("staging_lat"))) is not None]
    cold_p99 = [x for r in runs if (x := p99(r["revision_cold"].get("staging_lat"))) is not None]
    before = [r["revision"]["load"]["before"]["p99_s"] for r in runs]
    return [
        Figure(key="stage_revision_warm_p99", unit="s",
               name="Latency p99 through the router while the staging run warms a new model "
                    "revision",
               samples=warm_p99, baseline_name="the same staging run, warm off",
               baseline_samples=cold_p99,
               notes=f"requests that left during the staging run ({size} read into the page "
                     f"cache on all {HOSTS} hosts at once, I/O priority idle; no host drained "
                     "yet), one p99 per run; before the rollout: "
                     + ", ".join(f"{x:.3f} s" for x in before if x is not None)
                     + f"; {router_load.RATE:g} req/s; this machine's one disk serves every "
                       "host's reads, a real fleet's hosts each their own",
               extra={"before_p99_s": before}),
        Figure(key="stage_revision_out", unit="s",
               name="A host's time out of the router, new model revision staged and warmed",
               samples=_hosts(runs, "revision", "out_of_router_s"),
               baseline_name="a config-only change (new sglang_env)",
               baseline_samples=_hosts(runs, "config", "out_of_router_s"),
               goal="<= 1.2x config-only", goal_kind="ratio_max", goal_value=1.2,
               notes=f"a new model folder ({size}, the served model's size) evicted from the "
                     "page cache before the rollout; the staging run reads it in on every host "
                     "while they serve; one sample per host per run; the same rollout with the "
                     "warm off (`sglang_model_warm: false`): " + _s(cold) + f"; failed requests "
                     f"during both: {sum(x['failed'] for x in load)} of "
                     f"{sum(x['requests'] for x in load)}; {SHARED}",
               extra={"cold_out_s": cold}),
    ]


def p99(latencies: list[float] | None) -> float | None:
    return router_load.percentile(sorted(latencies), 0.99) if latencies else None

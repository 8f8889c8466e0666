"""Shared helpers of the benchmark scripts: testbed control, timed pyinfra runs, medians.

Benchmarks are scripts, not tests: they drive the real CLI against the local testbed and
return figures. Every testbed call honours TESTBED_DIR / TESTBED_SUBNET / TESTBED_PREFIX from
the environment (the testbed reads them itself).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed import fleet

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
BENCH_INVENTORY = "bench/inventory.py"
# The testbed's simulated peer copies are host memcpy: their speed follows this machine's
# load. The benchmark measures time, not bandwidth, so a busy machine must not fail the
# pre-flight threshold; nothing else differs from the testbed inventory.
BENCH_DATA = {"gpu_p2p_min_gbps": 0.05}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ figures
@dataclass
class Figure:
    """One measured figure beside its baseline (same run), as written to the JSON report."""

    key: str
    name: str
    unit: str
    samples: list = field(default_factory=list)
    baseline_name: str | None = None
    baseline_samples: list = field(default_factory=list)
    goal: str | None = None           # human text, e.g. "<= 2x baseline"
    goal_kind: str | None = None      # "ratio_max" | "value_max" | "value_min" | None
    goal_value: float | None = None
    notes: str = ""
    measured: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def median(self):
        return median(self.samples)

    @property
    def baseline_median(self):
        return median(self.baseline_samples)

    @property
    def ratio(self):
        m, b = self.median, self.baseline_median
        if m is None or b in (None, 0):
            return None
        return m / b

    @property
    def met(self):
        if not self.measured or self.goal_kind is None or self.median is None:
            return None
        if self.goal_kind == "ratio_max":
            return None if self.ratio is None else self.ratio <= self.goal_value
        if self.goal_kind == "value_max":
            return self.median < self.goal_value
        if self.goal_kind == "value_min":
            return self.median >= self.goal_value
        return None

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(median=_r(self.median), baseline_median=_r(self.baseline_median),
                 ratio=_r(self.ratio), met=self.met, runs=len(self.samples))
        d["samples"] = [_r(x) for x in self.samples]
        d["baseline_samples"] = [_r(x) for x in self.baseline_samples]
        return d


def not_measured(key: str, name: str, unit: str, why: str, goal: str | None = None) -> Figure:
    return Figure(key=key, name=name, unit=unit, goal=goal, measured=False, notes=f"not measured: {why}")


def _r(x, nd=3):
    return None if x is None else round(float(x), nd)


def plural(n, word: str) -> str:
    """``1 command``, ``2 commands``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ------------------------------------------------------------------------------ testbed
def testbed(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([PY, "-m", "testbed", *args], cwd=ROOT, text=True, capture_output=True, check=False,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"python -m testbed {' '.join(args)} failed ({r.returncode}):\n"
                           f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def state() -> dict:
    return json.loads(fleet.state_file().read_text())


def ensure_hosts(n: int) -> list[str]:
    """Boot (or keep) at least N testbed hosts; return the names of the first N."""
    t0 = time.monotonic()
    testbed("up", "--hosts", str(n), timeout=900)
    hosts = sorted(state()["hosts"], key=lambda h: h["index"])[:n]
    log(f"testbed: {len(hosts)} hosts up ({time.monotonic() - t0:.1f}s)")
    return [h["name"] for h in hosts]


def ssh(host: str, cmd: str, check: bool = True, timeout: float = 60) -> str:
    r = testbed("ssh", host, "sh", "-c", shlex.quote(cmd), check=check, timeout=timeout)
    return r.stdout


def read_json_on(host: str, path: str):
    out = ssh(host, f"cat {shlex.quote(path)} 2>/dev/null || echo null", check=False)
    try:
        return json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------ pyinfra runs
@dataclass
class Timed:
    argv: list
    rc: int
    seconds: float
    maxrss_kib: int
    cpu_s: float         # the child's own user + system CPU time (the controller's cost)
    lines: list          # [(monotonic offset s, wall-clock epoch s, text)]
    started_wall: float
    machine_cpu_s: float = 0.0  # busy CPU of the whole machine meanwhile (/proc/stat): the
    #                             controller, the testbed hosts' own work, sshd, the kernel
    cpu_samples: list = field(default_factory=list)  # [(offset s, machine busy s, controller
    #                                                   CPU s)], only with run_timed(sample_s=...)

    @property
    def others_cpu_s(self) -> float:
        """Machine CPU not spent by the controller: mostly the hosts' work."""
        return max(0.0, self.machine_cpu_s - self.cpu_s)

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, n: int = 40) -> str:
        return "\n".join(t for _, _, t in self.lines[-n:])

    def first_line(self, pred: Callable[[str], bool]):
        for off, wall, text in self.lines:
            if pred(text):
                return off, wall, text
        return None


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of the live process PID (/proc/PID/stat), None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_timed(argv: list[str], env: dict | None = None, sample_s: float | None = None,
              cwd: Path | None = None) -> Timed:
    """Run ARGV, timestamping each output line; peak RSS from the child's own rusage. With
    SAMPLE_S, a thread also samples the machine's busy CPU and the child's own CPU that often
    (``Timed.cpu_samples``, for ``bench/timeline.py``)."""
    busy0 = machine_busy_s()
    wall0, t0 = time.time(), time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd or ROOT, env={**os.environ, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    samples: list = []
    done = threading.Event()

    def sample() -> None:
        while True:
            own = process_cpu_s(proc.pid)
            if own is None:
                return
            samples.append((time.monotonic() - t0, machine_busy_s(), own))
            if done.wait(sample_s):
                return

    sampler = threading.Thread(target=sample, daemon=True) if sample_s else None
    if sampler:
        sampler.start()
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - t0, time.time(), line.rstrip("\n")))
    done.set()
    if sampler:
        sampler.join()
    _, status, rusage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Timed(argv=argv, rc=proc.returncode, seconds=seconds, maxrss_kib=rusage.ru_maxrss,
                 cpu_s=rusage.ru_utime + rusage.ru_stime, lines=lines, started_wall=wall0,
                 machine_cpu_s=machine_busy_s() - busy0, cpu_samples=samples)


def byte_compile() -> None:
    """Write the .pyc files of the controller's modules (the venv, sglang_deploy, bench,
    config.py). An operator's pyinfra imports from .pyc files; with PYTHONDONTWRITEBYTECODE
    set and no .pyc on disk, every run would compile ~400 modules (about 0.9 s of CPU), and a
    module changed since the last compile would be compiled again in every run."""
    subprocess.run([PY, "-m", "compileall", "-q", "-j", "0", str(Path(PY).parent.parent / "lib"),
                    str(ROOT / "sglang_deploy"), str(ROOT / "bench"), str(ROOT / "config.py")],
                   check=False, capture_output=True)


def pyinfra_argv(deploy: str, limit: list[str] | None = None, verbose: bool = False,
                 inventory: str = BENCH_INVENTORY, spec_file: Path | None = None) -> list[str]:
    """SPEC_FILE: the run spec's file (sglang_deploy/core/runspec.py), named by `--data`."""
    argv = [str(Path(PY).parent / "pyinfra"), "-y", inventory, deploy]
    for name in limit or ():
        argv += ["--limit", name]  # one flag per host: pyinfra does not split "a,b"
    if verbose:
        argv.append("-vv")
    if spec_file is not None:
        argv += ["--data", f"_sglang_deploy_run={spec_file}"]
    return argv


def bench_env(extra_data: dict | None = None, env: dict | None = None) -> dict:
    """Environment of a run against bench/inventory.py (its extra data)."""
    run_env = dict(env or {})
    run_env["BENCH_EXTRA_DATA"] = json.dumps({**BENCH_DATA, **(extra_data or {})})
    return run_env


def run_spec_file() -> Path:
    """The run spec of a bench's own pyinfra runs: their reports in ``report_dir``."""
    from sglang_deploy.core.runspec import RunSpec

    path = report_dir().with_name(report_dir().name + ".run.json")
    if not path.exists():
        path.write_text(RunSpec(reports=str(report_dir())).to_json())
    return path


def deploy(hosts: list[str] | None, *, extra_data: dict | None = None, env: dict | None = None,
           verbose: bool = False, deploy_file: str = "deploy.py", check: bool = True,
           sample_s: float | None = None, code: Path | None = None) -> Timed:
    """One `pyinfra INVENTORY deploy.py` run (bench inventory: testbed + BENCH_EXTRA_DATA).
    CODE: another checkout of the tool to run instead of this one (``bench/versions.py``)."""
    run_env = bench_env(extra_data, env)
    if code is not None:
        run_env["PYTHONPATH"] = str(code)  # its sglang_deploy before the installed one
        # a checkout older than the run spec reads its reports folder from the environment
        run_env.setdefault("SGLANG_DEPLOY_REPORTS", str(report_dir()))
    t = run_timed(pyinfra_argv(deploy_file, limit=hosts, verbose=verbose,
                               inventory=str(ROOT / BENCH_INVENTORY), spec_file=run_spec_file()),
                  env=run_env, sample_s=sample_s, cwd=code)
    if any("No host matches found" in text for _, _, text in t.lines):
        raise RuntimeError(f"{' '.join(t.argv)}: a --limit matched no host:\n{t.tail()}")
    if check and not t.ok:
        raise RuntimeError(f"{' '.join(t.argv)} failed (rc {t.rc}) after {t.seconds:.1f}s:\n{t.tail()}")
    return t


_REPORTS: Path | None = None


def report_dir() -> Path:
    global _REPORTS
    if _REPORTS is None:
        _REPORTS = Path(tempfile.mkdtemp(prefix="sglang-bench-reports-"))
    return _REPORTS


def host_report(host: str) -> dict | None:
    """HOST's newest verification summary: of the bench's own runs (``report_dir``), or of a
    run an `sglang-deploy` command started (``rebuild``: the default folder)."""
    found = [json.loads(p.read_text()) for p in (report_dir() / f"{host}.json",
                                                 ROOT / ".sglang-deploy" / "reports" / f"{host}.json")
             if p.exists()]
    return max(found, key=lambda r: r.get("verified_epoch_s") or 0, default=None)


def converge(hosts: list[str]) -> Timed:
    """Bring HOSTS to the converged state of the plain testbed data (installs if needed)."""
    t = deploy(hosts, extra_data={})
    log(f"converged {','.join(hosts)} in {t.seconds:.1f}s")
    return t


def changes(t: Timed) -> int | None:
    """Operations that changed something (pyinfra's "Grand total" Success column)."""
    for _, _, text in reversed(t.lines):
        parts = text.split()
        if parts[:2] == ["Grand", "total"] and len(parts) >= 4:
            return 0 if parts[3] == "-" else int(parts[3])
    return None


def round_trips(t: Timed) -> dict:
    """From a -vv run of ONE host: commands sent, and per fact: round trips and seconds.

    A command starts at its `[host] >>> ...` line and ends at the next `Loaded fact NAME` line
    (facts) or at the next line of any kind (other commands).
    """
    sends = 0
    facts: dict = {}
    pending = None
    send = re.compile(r"^\s*\[[^\]]+\]\s+>>> ")       # host names are padded to one width
    loaded = re.compile(r"^\s*\[[^\]]+\]\s+Loaded fact (\S+)")
    for off, _, text in t.lines:
        m = loaded.match(text)
        if send.match(text):
            sends += 1
            pending = off
        elif pending is not None and m:
            name = m.group(1)
            name = name.rsplit(".", 1)[-1]
            f = facts.setdefault(name, {"count": 0, "seconds": 0.0})
            f["count"] += 1
            f["seconds"] = round(f["seconds"] + off - pending, 3)
            pending = None
    return {"commands": sends, "facts": dict(sorted(facts.items(), key=lambda kv: -kv[1]["seconds"]))}


# ------------------------------------------------------------------------------ machine
def machine() -> dict:
    cpu_model, cores = None, 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu_model is None:
                cpu_model = line.split(":", 1)[1].strip()
            if line.startswith("processor"):
                cores += 1
    except OSError:
        pass
    mem_kib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    try:
        kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    except OSError:
        kernel = platform.release()
    return {"cpu_model": cpu_model, "cores": cores or os.cpu_count(),
            "ram_gib": round(mem_kib / (1 << 20), 1) if mem_kib else None, "kernel": kernel,
            "python": platform.python_version()}


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []

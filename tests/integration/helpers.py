"""What integration test modules share: host names, the seed configuration, commands that run
the real tools, reading a host's state, and the fault records (observations for
docs/faults.md). Fixtures live in conftest.py; test modules never import each other.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_deploy.core import lockfile, runspec
from testbed import fleet
from testbed.lxchost import DEFAULT_UVM

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
PYINFRA = str(BIN / "pyinfra")
PREFIX = os.environ.get("TESTBED_PREFIX", "tb")
TB1, TB2, TB3 = (f"{PREFIX}{i}" for i in (1, 2, 3))
INVENTORY = REPO / "inventory" / "testbed.py"
SEED_FLAGS = {
    "tp-size": 8, "quantization": "modelopt_fp4", "moe-runner-backend": "flashinfer_cutlass",
    "enable-flashinfer-allreduce-fusion": True, "disable-cuda-graph": True,
    "trust-remote-code": True,
}
# An API key full of shell metacharacters (quotes, $HOME, ;|&, a backtick command).
SECRET = "s3cr'et \"$HOME\" ;|&`x`"
GPU_SCENARIOS = {
    "uvm-missing": ["/dev/nvidia-uvm", "nvidia-modprobe -u -c=0"],
    "driver-mismatch": ["Driver/library version mismatch"],
    "gpu-missing": ["7", "8"],
    "p2p-unsupported": ["P2P"],
    "p2p-corrupt": ["corrupt"],
    "p2p-slow": ["GB/s"],
    # opening the nodes really fails with EPERM (the container's devices cgroup denies them):
    # the cause, and the allow lines with the real majors (the nvidia-uvm major of the
    # testbed's simulated LXC host, testbed/lxchost.py)
    "cgroup-denied": ["device cgroup denies", "EPERM", "lxc.cgroup2.devices.allow: c 195:* rwm",
                      f"lxc.cgroup2.devices.allow: c {DEFAULT_UVM}:* rwm"],
}
# sim.env as `python -m testbed up` writes it (testbed/fleet.py SIM_ENV_DEFAULT); keys a test
# may set through Testbed.sim_env and the value they go back to after it.
SIM_ENV_DEFAULTS = {"TOKENS_PER_S": "400", "MAX_TOKENS_PER_S": "1000", "TIME_SCALE": "0.02",
                    "SLOW_WHEN": "", "SLOW_FACTOR": "", "WARMUP_GATE": "", "HANG_AT_SHARD": "",
                    "GPU_MEMORY_MIB": ""}


def both(r) -> str:
    return r.stdout + r.stderr


def run_testbed(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m testbed ARGS` from the repo root (same env: TESTBED_DIR etc. pass through)."""
    r = subprocess.run([sys.executable, "-m", "testbed", *args], check=False, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"python -m testbed {' '.join(args)} failed (rc={r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def state_path() -> Path:
    """The testbed's state file (TESTBED_DIR honoured), as the testbed itself finds it."""
    return fleet.state_file()


def data_args(*data: str) -> list[str]:
    """["--data", D] for each KEY=VALUE in DATA."""
    return [arg for d in data for arg in ("--data", d)]


def pyinfra_deploy(hosts, *args: str, inventory: Path | str = INVENTORY, env: dict | None = None,
                   timeout: float = 900, spec=None) -> subprocess.CompletedProcess:
    """The real `pyinfra -y INVENTORY deploy.py --limit HOST...` (no --limit: every host);
    SPEC: the run spec (``core/runspec.py``) the command names, as `sglang-deploy` names it."""
    from sglang_deploy.controller import runner

    argv = [PYINFRA, "-y", str(inventory), "deploy.py"]
    for h in hosts or ():
        argv += ["--limit", h]
    spec_file = runner.write_spec(spec) if spec is not None else None
    if spec_file is not None:
        argv += ["--data", f"{runspec.DATA_KEY}={spec_file}"]
    try:
        return subprocess.run([*argv, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})
    finally:
        if spec_file is not None:
            spec_file.unlink(missing_ok=True)


def results(out: str) -> dict[str, tuple[int, int, int]]:
    """pyinfra's results table: operation name -> (success, error, no change)."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s{4}(.+?)\s{2,}(\d+)\s+([\d-]+)\s+([\d-]+)\s+([\d-]+)\s*$", line)
        if m:
            rows[m.group(1).strip()] = tuple(0 if x == "-" else int(x) for x in m.group(3, 4, 5))
    return rows


def changed(out: str) -> list[str]:
    """The operations of pyinfra's results table that changed something."""
    return [name for name, (ok, _, _) in results(out).items() if ok and name != "Grand total"]


# A host's state in one SSH round trip: what a converged, verified host is made of.
HOST_STATE = (
    "printf 'invocation=%s\\nverified=%s\\nunit=%s\\nsecrets=%s\\ncurrent=%s\\nhealth=%s\\n"
    "gpu=%s\\nsim=%s\\nblank=%s\\n' "
    "\"$(systemctl show -p InvocationID --value sglang.service 2>/dev/null)\" "
    "\"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(\"invocation\") or \"\")' "
    "/opt/sglang/last-verified.json 2>/dev/null)\" "
    "\"$(sha256sum /etc/systemd/system/sglang.service 2>/dev/null | cut -c1-16)\" "
    "\"$(sha256sum /etc/sglang/secrets.env 2>/dev/null | cut -c1-16)\" "
    "\"$(readlink /opt/sglang/current)\" "
    "\"$(curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:30000/health)\" "
    "\"$(grep -h ^SCENARIO= /etc/testbed/gpu.env | cut -d= -f2)\" "
    "\"$(grep -h ^SCENARIO= /etc/testbed/sim.env | cut -d= -f2)\" "
    "\"$(test -e /opt/sglang || test -e /etc/sglang || test -e /etc/systemd/system/sglang.service "
    "|| echo yes)\"")


@dataclass
class Testbed:
    """What tests get: the hosts of the running testbed and a few helpers."""

    state: dict
    inventory: Path = INVENTORY
    log: list = field(default_factory=list)
    # hosts/keys a test moved away from healthy (restored after each test by conftest)
    touched_scenarios: set = field(default_factory=set)
    touched_sim_env: dict = field(default_factory=dict)

    @property
    def hosts(self) -> list[str]:
        return [h["name"] for h in self.state["hosts"]]

    def host(self, name: str) -> dict:
        return next(h for h in self.state["hosts"] if h["name"] == name)

    def address(self, name: str) -> str:
        return self.host(name)["address"]

    def reload(self) -> dict:
        self.state = json.loads(state_path().read_text())
        return self.state

    def ssh_argv(self, host: str, cmd: str, known_hosts: str | None = None) -> list[str]:
        return [
            "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts or self.state['known_hosts']}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            "-i", self.state["key"], f"root@{self.address(host)}", cmd,
        ]

    def ssh(self, host: str, cmd: str, check: bool = False, timeout: float = 120,
            known_hosts: str | None = None) -> subprocess.CompletedProcess:
        """Run CMD (a shell string) on HOST as root, strict host key checking."""
        r = subprocess.run(self.ssh_argv(host, cmd, known_hosts), check=False, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"{host}: `{cmd}` rc={r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def host_state(self, host: str, check: bool = True) -> dict:
        """HOST's service state (HOST_STATE's keys) read in one SSH round trip."""
        r = self.ssh(host, HOST_STATE, check=check)
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def scenario(self, host: str, name: str, when: str = "") -> None:
        """Set a GPU or server scenario; the `healthy_testbed` fixture undoes it after the test."""
        if name != "healthy":
            self.touched_scenarios.add(host)
        run_testbed("scenario", host, name, *(["--when", when] if when else []), timeout=120)

    def sim_env(self, host: str, *settings: str) -> None:
        """`python -m testbed sim-env HOST KEY=VALUE...` (undone after the test)."""
        for s in settings:
            key = s.split("=", 1)[0]
            self.touched_sim_env.setdefault(host, set()).add(key)
        run_testbed("sim-env", host, *settings, timeout=120)

    def wipe(self, host: str) -> None:
        run_testbed("wipe", host, timeout=300)
        self.touched_scenarios.discard(host)
        self.touched_sim_env.pop(host, None)
        self.reload()

    def status(self) -> dict:
        return json.loads(run_testbed("status", "--json", timeout=120).stdout)

    def wait_for(self, what: str, predicate, timeout: float = 30.0, interval: float = 0.2,
                 describe=None):
        """Poll PREDICATE until truthy (returned) or fail with its last value, and with
        DESCRIBE() (what was observed, when the predicate's value does not say) if given."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        seen = f"; observed: {describe()}" if describe is not None else ""
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}"
                             + seen)


# ------------------------------------------------------------------ fault records
# What the fault and security tests OBSERVED, one JSON file per case, for
# `python scripts/faults_table.py` (docs/faults.md). Writing them is an observation log:
# no test reads a record, and no test needs the table.
RECORDS = Path(os.environ.get("SGLANG_DEPLOY_FAULT_RECORDS") or REPO / ".sglang-deploy" / "faults")


def slug(category: str, case: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{category}-{case}".lower()).strip("-")


def error_lines(out: str) -> list[str]:
    """The error as the user sees it: our own message if any, else pyinfra's final error;
    its headline plus its `found:` and `fix:` lines."""
    lines = out.splitlines()
    typed = re.compile(r"(verification failed|GPU pre-flight failed|invalid (deploy )?data|invalid "
                       r"launch flags|cannot patch SGLang|runtime setup failed|host is being "
                       r"deployed by someone else|sglang-deploy error): ")
    for marker in ("sglang-deploy: ", typed, "--> pyinfra error"):
        for i, line in enumerate(lines):
            if (marker.search(line) if isinstance(marker, re.Pattern) else marker in line):
                cause = [x for x in lines[max(i - 6, 0):i]
                         if re.search(r"error[:(]|No space|Killed|os error", x)][-2:]
                block = [*cause, line]
                for key in ("  found:", "  fix:"):
                    block += [x for x in lines[i + 1:i + 80] if x.startswith(key)][:1]
                return [re.sub(r" in /\S+ line \d+|^sglang_deploy\.core\.errors\.\w+: ", "", x.strip())[:500]
                        for x in block]
    return [x.strip()[:500] for x in lines if re.search(r"error|fail", x, re.IGNORECASE)][-3:]


def rollout_error_lines(r) -> list[str]:
    """A rollout's own verdict lines (STOPPED / HALT / per-host failure / FAILED)."""
    keys = ("STOPPED", "HALT", "FAILED:", "      VerifyError", f"    {PREFIX}")
    return [line.strip() for line in both(r).splitlines()
            if line.startswith(keys) and ("fail" in line.lower() or "STOPPED" in line
                                          or "HALT" in line or "rolled" in line)][:4]


def record(case: str, category: str, fault: str, r, *, others_untouched=None, serving=None,
           converged=None, notes: str = "", expect_ok: bool = False,
           error: list[str] | None = None, **extra) -> dict:
    """Write what a fault case observed to RECORDS/<category>-<case>.json; returns it."""
    rec = {
        "case": case, "category": category, "fault": fault, "exit_code": r.returncode,
        "expected_exit": "0" if expect_ok else "non-zero",
        "error": [] if r.returncode == 0 else (error or error_lines(both(r))),
        "warnings": [x.strip()[:300] for x in both(r).splitlines()
                     if "took over a stale deploy lock" in x],
        "other_hosts_untouched": others_untouched, "previous_release_serving": serving,
        "rerun_converged": converged, "notes": notes, "recorded_at": time.time(), **extra,
    }
    write_record(slug(category, case), rec)
    return rec


def write_record(name: str, rec: dict) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{name}.json").write_text(json.dumps(rec, indent=2) + "\n")


def keep_output(case: str, category: str, r) -> None:
    """The faulty run's whole output, for reading (not rendered)."""
    out = RECORDS / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{slug(category, case)}.log").write_text(both(r))


# ------------------------------------------------------------------ fault-suite deploys
FAULT_INVENTORY = Path(__file__).with_name("fault_inventory.py")
# Simulated peer copies are paced host memcpy: their speed follows the machine's load, and
# P2P speed is not what the fault cases test (p2p-slow sets its own floor).
# Small verified copies keep pre-flight short on a loaded machine (the P2P scenarios are
# still detected: unsupported and corrupt pairs do not depend on the size).
FAULT_HOST_DEFAULTS = {"gpu_p2p_min_gbps": 0.05, "gpu_p2p_test_mib": 8}


def fault_env(data: dict[str, dict] | None = None) -> dict:
    """FAULT_HOST_DATA for fault_inventory.py: the fault defaults plus DATA per host."""
    per_host = {h: {**FAULT_HOST_DEFAULTS, **(data or {}).get(h, {})} for h in (TB1, TB2, TB3)}
    return {"FAULT_HOST_DATA": json.dumps(per_host, sort_keys=True)}


def fault_deploy(data: dict[str, dict] | None = None, *args: str, hosts=(TB1, TB2),
                 env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """The real deploy through fault_inventory.py; DATA: per-host data on top of the defaults."""
    return pyinfra_deploy(hosts, *args, inventory=FAULT_INVENTORY,
                          env={**fault_env(data), **(env or {})}, timeout=timeout)


def view(testbed, host: str) -> dict:
    """What must not change on a host that is not the target (or that must keep serving)."""
    s = testbed.host_state(host, check=False)
    return {k: s.get(k, "") for k in ("invocation", "unit", "current", "health")}


def broken_lock(tmp_path: Path) -> Path:
    """The testbed lock without pybase64, which `import sglang` needs: a release that
    installs cleanly (offline, from the wheelhouse) and does not import."""
    text = (REPO / "locks/testbed.txt").read_text()
    pins = [p for p in lockfile.parse_lock(text) if p.name != "pybase64"]
    assert len(pins) == len(lockfile.parse_lock(text)) - 1
    out = tmp_path / "testbed-broken.txt"
    out.write_text("".join(f"{p.requirement()}\n" for p in pins))
    return out

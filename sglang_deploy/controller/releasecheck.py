"""``sglang-deploy lock --check LOCK``: the lock installed for real, then the release smoke.

1. A scratch venv of LOCK, made by uv with the system python of the lock's version
   (``uv pip sync --require-hashes``), cached by the lock's hash under
   ``~/.cache/sglang-deploy/lockcheck/<hash>/venv`` (``$SGLANG_DEPLOY_LOCKCHECK_CACHE``):
   a second check of the same lock installs nothing.
2. The release smoke (``remote/release_smoke.py``, judged by ``core.smoke``) with the GPUs
   hidden, once per distinct set of launch flags of the hosts that use LOCK (``--inventory``;
   default: group_data/ alone).
3. The metric names of the shipped dashboard and alert rules against the sglang and SMG the
   venv holds (``core.metricnames``): a release that renames one fails here.
4. ``uv pip check`` of the venv (not for a partial, ``--no-deps`` lock).

The verdict: exit 0, or 1 with the import error and the packages that meet there.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as pyplatform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import lockfile, service, smoke
from sglang_deploy.core.errors import SglangDeployError, UsageError
from sglang_deploy.remote import release_smoke

SMOKE_TOOL = Path(release_smoke.__file__)
DEFAULT_TARGET = ("x86_64-manylinux_2_36", "3.11")


def cache_root() -> Path:
    return Path(os.environ.get("SGLANG_DEPLOY_LOCKCHECK_CACHE")
                or "~/.cache/sglang-deploy/lockcheck").expanduser()


def _say(text: str) -> None:
    print(f"lock --check: {text}", file=sys.stderr, flush=True)


def target(header: lockfile.LockHeader) -> tuple[str, str]:
    """(platform, python) a lock was made for (older locks: the defaults of `lock`)."""
    return header.platform or DEFAULT_TARGET[0], header.python or DEFAULT_TARGET[1]


def platform_mismatch(header: lockfile.LockHeader) -> str | None:
    """Why this machine cannot install a lock made for HEADER's platform (None: it can)."""
    plat, _ = target(header)
    arch, _, rest = plat.partition("-")
    if arch != pyplatform.machine():
        return f"the lock is for {arch}, this machine is {pyplatform.machine()}"
    if rest.startswith("manylinux_"):
        want = tuple(int(x) for x in rest[len("manylinux_"):].split("_")[:2])
        libc, ver = pyplatform.libc_ver()
        have = tuple(int(x) for x in (ver or "0.0").split(".")[:2])
        if libc != "glibc" or have < want:
            return f"the lock is for glibc >= {want[0]}.{want[1]}, this machine has " \
                   f"{libc or 'no glibc'} {ver}"
    return None


def python_for(version: str, explicit: str | None = None) -> str:
    """The scratch venv's interpreter: EXPLICIT, else the system /usr/bin/pythonX.Y (what the
    hosts use), else pythonX.Y on PATH."""
    if explicit:
        return explicit
    system = Path(f"/usr/bin/python{version}")
    if system.exists():
        return str(system)
    found = shutil.which(f"python{version}")
    if not found:
        raise UsageError(what=f"a Python {version} on this machine (the lock's version)",
                         found=f"no /usr/bin/python{version} and no python{version} on PATH",
                         fix=f"install Python {version}, or pass --python PATH")
    return found


def uv() -> str:
    found = shutil.which("uv")
    if not found:
        raise UsageError(what="uv on PATH (it installs the lock)", found="no uv",
                         fix="`pip install uv` (scripts/setup.sh pins its version)")
    return found


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


@dataclass
class Venv:
    path: Path
    cached: bool
    seconds: float
    size: int

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")


def scratch_venv(lock: Path, python: str) -> Venv:
    """LOCK installed into its cached scratch venv (made now unless a complete one exists)."""
    text = lock.read_text()
    key = hashlib.sha256(f"{python}\n{text}".encode()).hexdigest()[:16]
    home = cache_root() / key
    marker = home / "complete.json"
    venv = home / "venv"
    if marker.is_file() and (venv / "bin" / "python").exists():
        info = json.loads(marker.read_text())
        _say(f"{lock}: the scratch venv of this lock is installed ({venv}), reused")
        return Venv(venv, True, 0.0, int(info.get("size", 0)))
    n = len(lockfile.parse_lock(text, str(lock)))
    _say(f"{lock}: installing {n} packages with uv into a scratch venv {venv} "
         f"(python {python}) ...")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    t0 = time.monotonic()
    for argv in ([uv(), "venv", "--quiet", "--python", python, "--python-preference",
                  "only-system", str(venv)],
                 [uv(), "pip", "sync", "--require-hashes", "--python", str(venv / "bin/python"),
                  str(lock)]):
        proc = subprocess.Popen(argv, stdout=sys.stderr, stderr=sys.stderr)
        while True:  # a line every 10 s: packages in the venv of those the lock pins, size
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                have = len(list(venv.glob("lib/python*/site-packages/*.dist-info")))
                _say(f"installing: {have} of {n} packages, {_gb(_size(venv))}, "
                     f"{time.monotonic() - t0:.0f} s")
        if proc.returncode != 0:
            raise SglangDeployError(
                what=f"the lock {lock} installs with uv",
                found=f"`{' '.join(argv[:3])} ...` exit status {proc.returncode} (uv's error "
                      "is above)",
                fix="re-lock (`sglang-deploy lock locks/NAME.in`) or fix the index / network")
    seconds = time.monotonic() - t0
    size = _size(venv)
    marker.write_text(json.dumps({"lock": str(lock), "seconds": round(seconds, 1),
                                  "size": size}) + "\n")
    return Venv(venv, False, seconds, size)


@dataclass
class FlagSet:
    hosts: list[str]
    argv: list[str]
    steps: list[str] = field(default_factory=lambda: list(smoke.STEPS))


def flag_sets(lock: Path, inventory: str | None, cwd: str = ".") -> list[FlagSet]:
    """One FlagSet per distinct launch flags of the serving hosts that use LOCK (INVENTORY,
    else group_data/ alone as one host "group_data")."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from sglang_deploy.controller import hosts as hostsmod
    from sglang_deploy.controller import routing

    if inventory:
        inv = hostsmod.load(inventory, cwd)
    else:
        if not Path(cwd, "group_data").is_dir():
            raise UsageError(what="group_data/ in the current folder (the launch flags to "
                                  "check), or --inventory", found=f"no {Path(cwd, 'group_data')}",
                             fix="run from the project folder or pass --inventory INVENTORY")
        ctx_state.set(State())
        inv = make_inventory("@local", cwd=str(Path(cwd).resolve()))
    want = lock.resolve()
    fleet = routing.fleet_of(inv)  # one Fleet: each group planned once, not per host
    serving = [(h.name, fleet.settings(h.name)) for h in inv if not routing.is_router(h)]
    users = [(n, s) for n, s in serving if Path(cwd, s.sglang_lock).resolve() == want]
    if inventory and serving and not users:
        # a new lock, checked before the hosts move to it: their flags, as they are
        _say(f"no host of {inventory} uses {lock} yet: checking it with every host's flags")
    out: dict[tuple, FlagSet] = {}
    for name, s in users or serving:
        argv = flagmod.render_flags(service.flag_map(s))  # never --api-key in argv
        steps = list(s.sglang_smoke)
        key = (tuple(argv), tuple(steps))
        out.setdefault(key, FlagSet([], argv, steps)).hosts.append(
            name if inventory else "group_data")
    return list(out.values())


def run_smoke(venv: Venv, fs: FlagSet) -> tuple[dict | None, str]:
    """The smoke in VENV with FS's flags; each of its progress lines is said as it arrives
    (which step runs: the import of sglang's server modules takes tens of seconds)."""
    argv = smoke.smoke_argv(venv.python, str(SMOKE_TOOL), fs.steps, fs.argv)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        out = []
        for line in proc.stdout:
            out.append(line)
            if line.startswith(smoke.PROGRESS):
                _say(line.rstrip("\n"))
        proc.wait()
        err.seek(0)
        stdout = "".join(out)
        return smoke.parse_result(stdout), stdout + err.read()


def pip_check(venv: Venv) -> tuple[int, str]:
    proc = subprocess.run([uv(), "pip", "check", "--python", venv.python],
                          capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def site_packages(venv: Venv) -> Path | None:
    found = sorted(venv.path.glob("lib/python*/site-packages"))
    return found[0] if found else None


def metric_check(lock: Path, site: Path | None) -> dict | None:
    """The metric names of the shipped dashboard and alert rules (``core.metricnames``)
    against what the sglang and SMG installed under SITE define; None when LOCK installs
    neither. Raises SglangDeployError naming each name the release does not define."""
    from sglang_deploy.core import metricnames

    if site is None:
        return None
    sglang = metricnames.sglang_series_in(site) if (site / "sglang").is_dir() else None
    binary = metricnames.smg_binary(site)
    smg = binary.read_bytes() if binary else None
    if sglang is None and smg is None:
        return None
    used = metricnames.shipped_uses()
    bad = metricnames.problems(used, sglang=sglang, smg=smg)
    products = [p for p, v in (("sglang", sglang), ("smg", smg)) if v is not None]
    if bad:
        known = sorted(sglang or ())
        hints = [f"{b.split(' ')[0]} -> {', '.join(c)}" for b in bad
                 if (c := metricnames.close(b.split(" ")[0], known))]
        raise SglangDeployError(
            what=f"every metric name the shipped dashboard and alert rules use "
                 f"({metricnames.MONITORING}) to be defined by the {' and '.join(products)} "
                 f"of {lock}",
            found="not defined: " + "; ".join(bad),
            fix="the release renamed or removed them: update alerts.yml and dashboard.json "
                "to its names" + (f" (close: {'; '.join(hints)})" if hints else "")
                + ", or keep the previous release")
    checked = sorted({u.name for u in used if any(
        u.name.startswith(metricnames.SGLANG_PREFIX if p == "sglang" else metricnames.SMG_PREFIX)
        for p in products)})
    _say(f"metric names: the {len(checked)} {' and '.join(products)} names the dashboard and "
         f"alert rules use are defined by this release")
    return {"products": products, "names": checked}


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def check(lock: Path, inventory: str | None = None, python: str | None = None,
          cwd: str = ".") -> dict:
    """The whole check; raises SglangDeployError for the first failure."""
    text = lock.read_text()
    header = lockfile.parse_header(text)
    reason = platform_mismatch(header)
    if reason:
        raise UsageError(what=f"a machine of the lock's platform to check {lock} on",
                         found=reason, fix="run the check on a machine like the hosts")
    _, version = target(header)
    has_sglang = any(p.name == "sglang" for p in lockfile.parse_lock(text, str(lock)))
    # a partial (--no-deps) lock is not a whole environment: sglang does not import from it
    # alone (the testbed's lacks torch; its hosts run the smoke with their stand-ins)
    sets = flag_sets(lock, inventory, cwd) if has_sglang and not header.partial else []
    venv = scratch_venv(lock, python_for(version, python))
    result: dict = {"lock": str(lock), "venv": str(venv.path), "cached": venv.cached,
                    "install_s": round(venv.seconds, 1), "size_bytes": venv.size,
                    "partial": header.partial, "bounds": list(header.bounds), "smoke": [],
                    "pip_check": None}
    for fs in sets:
        t0 = time.monotonic()
        # a passed smoke of this very venv, smoke script and flags is not run again
        key = hashlib.sha256(json.dumps([fs.argv, fs.steps]).encode()
                             + SMOKE_TOOL.read_bytes()).hexdigest()[:16]
        record = venv.path.parent / f"smoke-{key}.json"
        if venv.cached and record.is_file():
            res = json.loads(record.read_text())
            _say(f"{smoke.summary(res)} (the passed result of this venv and these flags, "
                 f"kept in {record})")
        else:
            _say(f"release smoke for {', '.join(fs.hosts)}: {' '.join(fs.steps)} ...")
            res, output = run_smoke(venv, fs)
            if res is None or not res.get("ok"):
                raise smoke.error_for(res, f"lock {lock}", output)
            record.write_text(json.dumps(res, sort_keys=True) + "\n")
            _say(f"{smoke.summary(res)} ({time.monotonic() - t0:.0f} s)")
        result["smoke"].append({"hosts": fs.hosts, "result": res})
    result["metrics"] = metric_check(lock, site_packages(venv))
    if header.partial:
        _say(f"{lock} is a partial lock (--no-deps): installed; the release smoke and "
             "`uv pip check` need a whole environment and do not apply")
    else:
        rc, out = pip_check(venv)
        result["pip_check"] = out
        if rc != 0:
            raise SglangDeployError(what=f"`uv pip check` passes in the venv of {lock}",
                                    found=out, fix="re-lock: sglang-deploy lock locks/NAME.in")
        _say(f"uv pip check: {out.splitlines()[-1] if out else 'ok'}")
    return result


def main(lock: Path, inventory: str | None = None, python: str | None = None,
         as_json: bool = False) -> int:
    t0 = time.monotonic()
    try:
        result = check(lock, inventory, python)
    except SglangDeployError as exc:
        if as_json:
            print(json.dumps({"lock": str(lock), "ok": False, "error": exc.to_dict()},
                             sort_keys=True, default=str))
        if isinstance(exc, UsageError):
            raise
        print(str(exc), file=sys.stderr)
        return 1
    result["ok"] = True
    result["seconds"] = round(time.monotonic() - t0, 1)
    install = "reused (cached)" if result["cached"] else f"installed in {result['install_s']:.0f} s"
    # a partial lock ran neither the smoke nor `uv pip check`: it is installed, not PASSED
    verdict = "installed (smoke not applicable)" if result["partial"] else "PASSED"
    _say(f"{lock}: {verdict} in {result['seconds']:.0f} s; venv {install}, "
         f"{_gb(result['size_bytes'])}")
    if as_json:
        print(json.dumps(result, sort_keys=True))
    return 0

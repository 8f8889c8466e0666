"""``sglang-deploy doctor``: the deploy's GPU pre-flight, on this machine or on a host.

    sglang-deploy doctor [--json] [--collect DIR] [--from DIR] [--expected-count N]
                         [--expected-model M] [--min-driver V] [--p2p-policy require|adapt]
                         [--min-gbps X] [--mib N] [--no-p2p-test]
    sglang-deploy doctor INVENTORY [--limit PATTERN]... [--json] [--data K=V]... [same options]

The expectations are the deploy's: the defaults of the data keys ``gpu_expected_count``,
``gpu_expected_model`` (the exact name), ``gpu_min_driver``, ``gpu_p2p_policy``,
``gpu_p2p_min_gbps`` and ``gpu_p2p_test_mib``; each option overrides one.

With INVENTORY, the deploy's own pre-flight stage runs on the inventory's hosts over SSH
(``pyinfra INVENTORY preflight.py --dry`` from the deploy folder: each host's data, the same
facts and checks as ``deploy.py``; nothing is changed, no deploy lock is taken), the
options becoming ``--data`` overrides. ``--limit`` follows pyinfra's rules and the data is
checked before any connection, as for every command (``controller.hosts.select``).

Live mode reads the system python's version and glibc's (``/usr/bin/python3 hoststate.py
platform``: the deploy's ``sglang_system_python``, judged against what the default lock's
wheels need), runs nvidia-smi (table, the deploy's own query, ``topo -m``, ``topo -p2p r|w``),
lists ``/dev/nvidia*``, tries to open each node and runs the CUDA probe, saving every raw
output in a folder (``--collect DIR``, else a temporary one) and then analysing that folder.
``--from DIR`` analyses such a folder without running anything; a missing file makes its
checks ``skipped``. Exit code: 0 when the result is pass or warn, 1 otherwise.

Folder layout (raw outputs, byte for byte)::

    nvidia-smi.txt      nvidia-smi
    query-gpu.csv       nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits
    topo-m.txt          nvidia-smi topo -m
    topo-p2p-r.txt      nvidia-smi topo -p2p r
    topo-p2p-w.txt      nvidia-smi topo -p2p w
    dev-nvidia.txt      ls -l /dev/nvidia*
    dev-open.txt        "<path> ok" | "<path> <ERRNO> <message>" per node (open test)
    cuda-probe.json     python3 cuda_probe.py --p2p --mib N
    host-platform.json  /usr/bin/python3 hoststate.py platform: {"python": "3.11", "glibc": "2.36"}
    commands.txt        "<file>\\t<exit code>\\t<command>" per file above

When a command fails, its file holds stdout followed by stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from sglang_deploy.core import data as datamod
from sglang_deploy.core import preflight
from sglang_deploy.core.preflight import Check
from sglang_deploy.remote import CUDA_PROBE
from sglang_deploy.remote.hoststate import open_test

FILES = {
    **preflight.SNAPSHOT_FILES,
    "probe": "cuda-probe.json",
    "platform": "host-platform.json",
    "commands": "commands.txt",
}

SMI_TIMEOUT_S = 60


Expectations = preflight.Expectations

#: option -> the data key whose default it takes (and that it overrides on an inventory's hosts)
OPTION_KEYS = {
    "expected_count": "gpu_expected_count", "expected_model": "gpu_expected_model",
    "min_driver": "gpu_min_driver", "p2p_policy": "gpu_p2p_policy",
    "min_gbps": "gpu_p2p_min_gbps", "mib": "gpu_p2p_test_mib",
}


def default(option: str):
    return datamod.KEYS[OPTION_KEYS[option]].default


def deploy_expectations(**given) -> Expectations:
    """The deploy's expectations: the data keys' defaults, overridden by the GIVEN options
    that are not None (an empty model name accepts any GPU)."""
    value = {o: default(o) if given.get(o) is None else given[o] for o in OPTION_KEYS}
    return Expectations(count=value["expected_count"], model=value["expected_model"] or None,
                        min_driver=value["min_driver"], p2p_policy=value["p2p_policy"],
                        min_gbps=value["min_gbps"])


@dataclass
class ProbeOptions:
    """How the live mode runs the CUDA probe."""

    mib: float = 64
    p2p: bool = True
    timeout_s: float = 600


# ---------------------------------------------------------------------------------------
# collection (live mode)


def _run(argv: Sequence[str] | str, timeout: float) -> tuple[int, str]:
    """(exit status, stdout, then stderr when it failed) of ARGV, a shell command if a str."""
    try:
        proc = subprocess.run(argv, shell=isinstance(argv, str), capture_output=True, text=True,
                              timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        return 124, out + f"\n(timed out after {timeout:g}s)\n"
    text = proc.stdout
    if proc.returncode != 0 and proc.stderr:
        text += proc.stderr
    return proc.returncode, text


def collect(out_dir: str | os.PathLike[str], probe: ProbeOptions | None = None) -> Path:
    """Run every command on this machine and save the raw outputs in ``out_dir``: the shell
    commands of the deploy's own snapshot (``GPU_SECTIONS``, after the nvidia-smi table), its
    open test and the CUDA probe."""
    from sglang_deploy.hostops.facts import GPU_SECTIONS, REMOTE

    opts = probe or ProbeOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    commands: list[tuple[str, int, str]] = []

    def save(name: str, command: str, argv: Sequence[str] | str,
             timeout: float = SMI_TIMEOUT_S) -> None:
        rc, text = _run(argv, timeout)
        (out / name).write_text(text)
        commands.append((name, rc, command))

    for name, command in {FILES["table"]: "nvidia-smi", **GPU_SECTIONS}.items():
        save(name, command, command)
    (out / FILES["open"]).write_text(open_test())
    commands.append((FILES["open"], 0, "(open test of /dev/nvidia*)"))
    python = datamod.KEYS["sglang_system_python"].default
    save(FILES["platform"], f"{python} hoststate.py platform",  # a shell: 127 when absent
         f"{shlex.quote(python)} {shlex.quote(str(REMOTE / 'hoststate.py'))} platform")
    probe_argv = [sys.executable, str(CUDA_PROBE), "--mib", f"{opts.mib:g}",
                  "--timeout", f"{opts.timeout_s:g}"] + (["--p2p"] if opts.p2p else [])
    save(FILES["probe"], " ".join(["python3", "cuda_probe.py"] + probe_argv[2:]), probe_argv,
         timeout=opts.timeout_s + 60)
    (out / FILES["commands"]).write_text(
        "".join(f"{name}\t{rc}\t{command}\n" for name, rc, command in commands))
    return out


# ---------------------------------------------------------------------------------------
# analysis


def _read(folder: Path, key: str) -> str | None:
    path = folder / FILES[key]
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def _exit_codes(text: str | None) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0].strip():
            try:
                codes[parts[0].strip()] = int(parts[1])
            except ValueError:
                codes[parts[0].strip()] = None
    return codes


def _head(text: str, n: int = 2) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[:n]) or "(empty)"


def load_snapshot(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], str | None]:
    """(snapshot for :func:`preflight.evaluate`, raw probe text or None) from a folder."""
    folder = Path(folder)
    codes = _exit_codes(_read(folder, "commands"))
    snapshot: dict[str, Any] = {}
    for key, name in preflight.SNAPSHOT_FILES.items():
        text = _read(folder, key)
        if text is not None:
            snapshot[name] = {"out": text, "rc": codes.get(name)}
    return snapshot, _read(folder, "probe")


def platform_checks(text: str | None) -> list[Check]:
    """The deploy's first two checks (``host-python``, ``host-glibc``) from the text of a
    ``host-platform.json``, against the default lock's target (python 3.11, glibc 2.34)."""
    python = datamod.KEYS["sglang_system_python"].default
    if text is None:
        return [Check(n, "skipped", f"no {FILES['platform']}") for n in ("host-python", "host-glibc")]
    try:
        found = json.loads(text.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = None
    if not isinstance(found, dict):
        return [Check("host-python", "fail", f"{python} did not report its version",
                      expected=f"a JSON object from `{python} hoststate.py platform`",
                      found=_head(text, 3),
                      fix=f"install python3 on this machine ({python}: the deploy's "
                          "`sglang_system_python`), then run doctor again"),
                Check("host-glibc", "skipped", f"{python} did not run")]
    return preflight.check_wheel_platform(found.get("python"), found.get("glibc"),
                                          preflight.WheelTarget(), system_python=python)


def analyse_dir(folder: str | os.PathLike[str], exp: Expectations | None = None) -> dict[str, Any]:
    """Analyse a folder of raw outputs (see the module docstring); runs nothing."""
    exp = exp or deploy_expectations()
    snapshot, probe_text = load_snapshot(folder)
    probe: dict[str, Any] | None = None
    bad_probe: list[Check] = []
    if probe_text is not None:
        try:
            lines = probe_text.strip().splitlines()
            loaded = json.loads(lines[-1]) if lines else None
            probe = loaded if isinstance(loaded, dict) else None
        except json.JSONDecodeError:
            probe = None
        if probe is None:
            bad_probe = [
                Check("cuda-init", "fail", "the CUDA probe did not print its JSON object",
                      expected="one JSON object from cuda_probe.py", found=_head(probe_text, 3),
                      fix="Run `python3 cuda_probe.py` by hand; it needs Python >= 3.9."),
                Check("cuda-devices", "skipped", "no probe result"),
            ]
    facts: dict[str, Any] = {}
    checks, nccl_env, matrix = preflight.evaluate(snapshot, probe, exp, facts)
    if bad_probe:
        checks = [c for c in checks if c.name not in ("cuda-init", "cuda-devices")]
        at = next((i for i, c in enumerate(checks) if c.name.startswith(("topo", "p2p"))), len(checks))
        checks[at:at] = bad_probe
    checks[:0] = platform_checks(_read(Path(folder), "platform"))  # first, as in the deploy
    return {
        "status": preflight.summarise(checks),
        "source": str(folder),
        "expectations": asdict(exp),
        "facts": facts,
        "checks": [c.to_dict() for c in checks],
        "nccl_env": nccl_env,
        "p2p_matrix": matrix,
    }


def run_doctor(collect_dir: str | os.PathLike[str] | None = None,
               from_dir: str | os.PathLike[str] | None = None,
               expectations: Expectations | None = None,
               probe: ProbeOptions | None = None) -> dict[str, Any]:
    """Live pre-flight on this machine (outputs kept in ``collect_dir`` when given), or the
    analysis of an existing folder (``from_dir``). Returns the report dict."""
    exp = expectations or deploy_expectations()
    if from_dir is not None and collect_dir is not None:
        raise ValueError("--from and --collect exclude each other")
    if from_dir is not None:
        if not Path(from_dir).is_dir():
            raise FileNotFoundError(f"--from {from_dir}: no such folder")
        report = analyse_dir(from_dir, exp)
        report["mode"] = "from"
        return report
    if collect_dir is not None:
        report = analyse_dir(collect(collect_dir, probe), exp)
    else:
        with tempfile.TemporaryDirectory(prefix="sglang-doctor-") as tmp:
            report = analyse_dir(collect(tmp, probe), exp)
            report["source"] = None
    report["mode"] = "live"
    return report


# ---------------------------------------------------------------------------------------
# CLI

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}


def render(report: dict[str, Any], out: Any = None) -> None:
    """The report as a table and the fixes, on OUT (stdout): coloured on a terminal, plain
    ASCII (no borders, no padding to a console width) otherwise (``common.table``)."""
    from sglang_deploy.commands import common

    console = common.console(out)
    table = common.table(("status", "check", "result"), out=out,
                         title=f"GPU pre-flight ({report.get('mode', '?')}"
                         + (f": {report['source']}" if report.get("source") else "") + ")")
    for c in report["checks"]:
        style = _STYLE.get(c["status"], "")
        table.add_row(f"[{style}]{c['status']}[/]", c["name"], c["message"])
    common.print_table(table, out)
    for c in report["checks"]:
        if c["status"] in ("fail", "warn") and (c.get("fix") or c.get("found")):
            style = _STYLE[c["status"]]
            console.print(f"[{style}]{c['name']}[/]: {c['message']}", markup=True, highlight=False)
            for label in ("expected", "found", "fix"):
                if c.get(label):
                    text = str(c[label]).replace("\n", "\n" + " " * 12)
                    console.print(f"  {label + ':':<10}{text}", markup=False, highlight=False,
                                  soft_wrap=True)
    if report.get("p2p_matrix"):
        console.print("P2P matrix:", markup=False)
        d = next((c.get("details") or {} for c in report["checks"] if c["name"] == "p2p-matrix"), {})
        colour = d.get("cells") and common.is_terminal(out)
        console.print(preflight.rich_matrix(d["cells"], d["gpus"], d.get("min_gbps")) if colour
                      else report["p2p_matrix"], markup=False, highlight=False)
    if report.get("nccl_env"):
        console.print("NCCL environment for this host: "
                      + " ".join(f"{k}={v}" for k, v in report["nccl_env"].items()), markup=False)
    style = _STYLE.get(report["status"], "")
    console.print(f"overall: [{style}]{report['status']}[/]")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on an ``argparse`` subparsers object."""
    from sglang_deploy.commands import common

    parser = common.add_command(
        subparsers, "doctor",
        help="the deploy's GPU pre-flight on this machine, a collected folder or an inventory's hosts",
        description=__doc__.split("\n\n")[0],
        failed="a check failed (the result is fail)")
    parser.add_argument("inventory", nargs="?", metavar="INVENTORY",
                        help="run the deploy's pre-flight on this inventory's hosts (over SSH)")
    common.add_limit(parser)  # with INVENTORY only
    common.add_data(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--collect", metavar="DIR", help="keep the raw outputs in DIR")
    where.add_argument("--from", dest="from_dir", metavar="DIR",
                       help="analyse DIR (made by --collect) without running anything")
    parser.add_argument("--expected-count", type=int, default=None, metavar="N",
                        help=f"number of GPUs the host must have (default {default('expected_count')})")
    parser.add_argument("--expected-model", default=None, metavar="M",
                        help="the exact GPU name every GPU must report, '' for any "
                             f"(default {default('expected_model')!r})")
    parser.add_argument("--min-driver", default=None, metavar="V",
                        help=f"minimum driver, e.g. 580.95.05 (default {default('min_driver')})")
    parser.add_argument("--p2p-policy", choices=("require", "adapt"), default=None,
                        help="require: missing P2P fails; adapt: run with NCCL_P2P_DISABLE=1 "
                             f"(default {default('p2p_policy')})")
    parser.add_argument("--min-gbps", type=float, default=None, metavar="X",
                        help=f"minimum GPU-to-GPU copy bandwidth, GB/s (default {default('min_gbps')})")
    parser.add_argument("--mib", type=int, default=None, metavar="N",
                        help=f"probe copy size, MiB (default {default('mib')})")
    parser.add_argument("--no-p2p-test", action="store_true", help="skip the pairwise copy test")
    parser.set_defaults(func=run)
    return parser


def data_overrides(given: dict[str, Any], data: list[str]) -> list[str]:
    """``--data`` items for an inventory's hosts: the options GIVEN (not None) as their data
    keys, then DATA."""
    return [f"{OPTION_KEYS[option]}={json.dumps(value) if isinstance(value, str) else value}"
            for option, value in given.items() if value is not None] + list(data)


def run(args: argparse.Namespace) -> int:
    given = {o: getattr(args, o) for o in OPTION_KEYS}
    if args.inventory is not None:
        from sglang_deploy.commands import doctor_remote

        return doctor_remote.run(args, data_overrides(given, args.data), render)
    if args.limit or args.data:
        print("sglang-deploy doctor: --limit and --data need an INVENTORY", file=sys.stderr)
        return 2
    exp = deploy_expectations(**given)
    opts = ProbeOptions(mib=args.mib or default("mib"), p2p=not args.no_p2p_test)
    try:
        report = run_doctor(collect_dir=args.collect, from_dir=args.from_dir, expectations=exp,
                            probe=opts)
    except (FileNotFoundError, ValueError) as exc:
        print(f"sglang-deploy doctor: {exc}; fix: give a folder made by --collect", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))  # "status" first, as analyse_dir builds it
    else:
        render(report)
    return 0 if report["status"] in ("pass", "warn") else 1

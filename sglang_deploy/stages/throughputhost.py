"""The host side of `sglang-deploy bench` (I/O around ``core.throughput``): ``bench_host`` runs
inside `pyinfra INVENTORY throughput_bench.py` (``python.call``), runs
remote/bench_run.py on the host and writes the records: on the host, in the run journal (the
host's ``bench``: what the command reads, ``integration/journal.py``) and in the controller's history
(``.sglang-deploy/bench/<host>.jsonl``: ``append_local``, ``read_local``; what
`sglang-deploy report` draws).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from sglang_deploy.controller import atomicfile
from sglang_deploy.core.journal import BENCH
from sglang_deploy.core.throughput import (
    level_figures,
    make_record,
    num_prompts,
    pick_previous,
    plan,
    record_dir,
)
from sglang_deploy.integration import journal

LOCAL_DIR = Path(".sglang-deploy") / "bench"


def remote_command(settings, secrets_file: str, python: str = "python3") -> str:
    """The shell command that runs remote/bench_run.py (fed on stdin, nothing written)."""
    from sglang_deploy.hostops.facts import stdin_script

    args = ["--root", settings.sglang_root,
            "--unit", f"/etc/systemd/system/{settings.sglang_service}.service",
            "--secrets", secrets_file, "--record-dir", record_dir(settings.sglang_root),
            "--timeout", str(settings.bench_timeout_s),
            "--plan", json.dumps(plan(settings), separators=(",", ":"))]
    for k, v in sorted(settings.bench_env.items()):
        args += ["--env", f"{k}={v}"]
    return stdin_script("bench_run.py", args, python=python)


# --------------------------------------------------------------------------- local records

def local_file(host: str, cwd: str | os.PathLike = ".") -> Path:
    return Path(cwd) / LOCAL_DIR / f"{host}.jsonl"


def append_local(host: str, entry: dict, cwd: str | os.PathLike = ".") -> Path:
    """ENTRY added to HOST's history (the file rewritten atomically: never half a line)."""
    path = local_file(host, cwd)
    try:
        before = path.read_text()
    except FileNotFoundError:
        before = ""
    if before and not before.endswith("\n"):
        before += "\n"
    return atomicfile.write(path, before + json.dumps(entry, sort_keys=True) + "\n")


def read_local(host: str, cwd: str | os.PathLike = ".") -> list[dict]:
    path = local_file(host, cwd)
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# --------------------------------------------------------------------------- in pyinfra

def bench_host(settings, secrets_file: str, run_id: str | None, cwd: str) -> dict:
    """Inside a pyinfra run (python.call): benchmark this host, write the records.

    Returns the local entry {"run_id", "host", "current", "previous"}. Raises BenchError.
    """
    from pyinfra import host, logger

    from sglang_deploy.core.errors import BenchError

    logger.info(f"{host.print_prefix}bench: concurrency {settings.bench_concurrency} "
                f"(python -m sglang.bench_serving of the current release)")
    ok, output = host.run_shell_command(remote_command(settings, secrets_file,
                                                       settings.sglang_system_python),
                                        print_output=False)
    text = output.stdout.strip()
    if not ok or not text:
        raise BenchError(what="the benchmark runner on the host answers with JSON",
                         found=f"failed: {output.stderr[-800:]}",
                         fix="check the SSH connection and `sglang_system_python` on the host")
    raw = json.loads(text.splitlines()[-1])
    if raw.get("error"):
        raise BenchError(what="a deployed release to benchmark", found=raw["error"],
                         fix="deploy first: pyinfra INVENTORY deploy.py --limit HOST")
    levels = []
    for lv in raw["levels"]:
        prompts = num_prompts(lv["concurrency"], settings.bench_num_prompts)
        level = level_figures(lv, expected_prompts=prompts)
        levels.append(level)
        logger.info(f"{host.print_prefix}bench: concurrency {level.concurrency}: "
                    f"{level.output_tok_s:.1f} output tok/s ({lv['seconds']} s)")
    if len(levels) != len(settings.bench_concurrency):
        raise BenchError(what="every concurrency level ran", found=f"{len(levels)} ran",
                         fix="see the output above")
    params = {"dataset": settings.bench_dataset, "input_len": settings.bench_input_len,
              "output_len": settings.bench_output_len, "num_prompts": settings.bench_num_prompts,
              "request_rate": settings.bench_request_rate}
    record = make_record(host.name, raw["identity"], levels, params, run_id=run_id)
    previous = pick_previous(raw["records"], record["identity"])
    path = f"{record_dir(settings.sglang_root)}/{record['identity']}.json"
    body = json.dumps(record, sort_keys=True)
    ok, output = host.run_shell_command(
        f"mkdir -p {shlex.quote(record_dir(settings.sglang_root))} && "
        f"printf '%s\\n' {shlex.quote(body)} > {shlex.quote(path + '.tmp')} && "
        f"mv {shlex.quote(path + '.tmp')} {shlex.quote(path)}", print_output=False)
    if not ok:
        raise BenchError(what=f"the record is written to {path}", found=output.stderr[-500:],
                         fix="check free space and permissions under sglang_root")
    entry = {"run_id": run_id, "host": host.name, "current": record, "previous": previous}
    journal.record(host.name, BENCH, entry)  # what `sglang-deploy bench` reads
    local = append_local(host.name, entry, cwd)
    logger.info(f"{host.print_prefix}bench: recorded {path} and {local}")
    return entry

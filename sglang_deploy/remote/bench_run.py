#!/usr/bin/env python3
"""Run SGLang's own benchmark client on the host, one JSON object on stdout (stdlib only).

Fed on stdin to the host's system python by `sglang-deploy bench` (as root, over SSH):

  bench_run.py --root R --unit FILE --secrets FILE --record-dir DIR --timeout S
               --plan JSON [--env K=V ...]

PLAN is a JSON list of {"concurrency": N, "argv": [...]}: the arguments of
`python -m sglang.bench_serving` for each level, built by the controller
(sglang_deploy/commands/bench.py); they never hold a secret. This script only adds
`--output-file` (a private temporary file) and runs them one after the other with the
CURRENT release's python (`R/current/venv/bin/python`).

The API key reaches bench_serving the way it reads one: the environment variable
OPENAI_API_KEY (sent as `Authorization: Bearer ...`), taken from SGLANG_API_KEY in the
root-only secrets file; never argv. bench_serving writes the server's /server_info (every
server argument, the API key included) into its output file: the file is read, that field
dropped, and the file deleted; any text returned has the key replaced by <redacted>.

Output: {"identity": {"release": ID, "unit_sha256": HEX} | null, "error": null | "...",
         "levels": [{"concurrency", "rc", "seconds", "result" (JSONL line without
                     server_info) | null, "stdout_tail", "stderr_tail"}],
         "records": [every earlier record found in DIR]}
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TAIL_LINES = 60


def secret(path: str | None, name: str) -> str | None:
    """Value of NAME in a systemd EnvironmentFile (the deploy's quoting: "..." with \\ escapes)."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except (OSError, TypeError):  # unreadable, or no file given (None)
        return None
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                return re.sub(r"\\(.)", r"\1", value[1:-1])  # a backslash escapes one character
            return value
    return None


def identity(root: str, unit: str) -> dict | None:
    """The deployed configuration: release id (the `current` link) and the unit's sha256."""
    link = os.path.join(root, "current")
    if not os.path.islink(link):
        return None
    release = os.path.basename(os.readlink(link).rstrip("/"))
    try:
        with open(unit, "rb") as fh:
            unit_sha = hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None
    return {"release": release, "unit_sha256": unit_sha}


def read_records(record_dir: str) -> list:
    out = []
    for path in sorted(glob.glob(os.path.join(record_dir, "*.json"))):
        try:
            with open(path) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            continue
    return out


def tail(text: str, key: str | None) -> str:
    if key:
        text = text.replace(key, "<redacted>")
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def run_level(python: str, level: dict, env: dict, key: str | None, timeout: float,
              workdir: str) -> dict:
    out_file = os.path.join(workdir, f"c{int(level['concurrency'])}.jsonl")
    argv = [python, "-m", "sglang.bench_serving", *level["argv"], "--output-file", out_file]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True, check=False,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = None
        stdout = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = (exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
        stderr += f"\n[bench_run] timed out after {timeout:.0f} s"
    try:
        with open(out_file) as fh:
            result = read_result(fh.read())
    except OSError:
        result = None
    finally:
        if os.path.exists(out_file):
            os.unlink(out_file)
    return {"concurrency": level["concurrency"], "rc": rc, "seconds": round(time.monotonic() - t0, 2),
            "result": result, "stdout_tail": tail(stdout, key), "stderr_tail": tail(stderr, key)}


def read_result(text: str) -> dict | None:
    """The last JSON line of bench_serving's `--output-file`, without `server_info` (the
    server's whole configuration, the API key included: never kept). bench_serving writes
    `Infinity` for an unlimited request rate (Python's json reads it)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        obj = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    obj.pop("server_info", None)
    return obj


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_run.py")
    p.add_argument("--root", required=True)
    p.add_argument("--unit", required=True, help="the service's systemd unit file")
    p.add_argument("--secrets")
    p.add_argument("--record-dir", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--env", action="append", default=[])
    args = p.parse_args(argv)

    out = {"identity": identity(args.root, args.unit), "error": None, "levels": [],
           "records": read_records(args.record_dir)}
    python = os.path.join(args.root, "current", "venv", "bin", "python")
    if out["identity"] is None:
        out["error"] = f"no deployed release: {args.root}/current or {args.unit} is missing"
    elif not os.access(python, os.X_OK):
        out["error"] = f"{python} is missing"
    else:
        key = secret(args.secrets, "SGLANG_API_KEY")
        env = dict(os.environ)
        env.pop("OPENAI_API_KEY", None)
        env.pop("API_KEY", None)
        env["HF_HUB_OFFLINE"] = "1"   # the tokenizer is the local model folder: never the Hub
        for item in args.env:
            k, _, v = item.partition("=")
            env[k] = v
        if key:
            env["OPENAI_API_KEY"] = key
        workdir = tempfile.mkdtemp(prefix="sglang-bench-")  # 0700
        try:
            for level in json.loads(args.plan):
                res = run_level(python, level, env, key, args.timeout, workdir)
                out["levels"].append(res)
                if res["rc"] != 0 or res["result"] is None:
                    break
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

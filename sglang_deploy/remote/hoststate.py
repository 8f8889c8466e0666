#!/usr/bin/env python3
"""Read-only host state for sglang-deploy, one JSON object per call (stdlib only).

Shipped to the host (or fed on stdin) and run with the system python, so that one round
trip returns everything a fact or a verifier poll needs.

  hoststate.py state --root R [--service S] [--model PATH] [--secrets FILE] [--cache DIR]
                     [--path P]... [--dev-open] [--gpu-health FIELDS --kernel-pattern RE]
                     [--watchdog STATE_DIR]
  hoststate.py poll --service S --port P [--host H] [--cursor C] [--invocation ID]
                    [--http] [--generate] [--no-journal] [--secrets FILE]
  hoststate.py platform      # {"python": "3.11", "glibc": "2.36"} (also part of `state`)

With ``--model`` each shard also says how many of its bytes are in the page cache
(``resident``: mincore over a read-only mapping of the file, as util-linux ``fincore`` does;
nothing of the data is read), and ``memory`` gives /proc/meminfo's MemAvailable and MemTotal.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import pwd
import re
import shutil
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else ""
if HERE and HERE not in sys.path:
    sys.path.insert(0, HERE)

from pagecache import RESIDENCY_WINDOW, meminfo, mmap_page_size, resident_bytes, resident_pages  # noqa: F401 (inlined when fed on stdin)

#: ``ExecStart``: the unit's command; ``core.restart`` compares its flags with the new unit's
SHOW_PROPS = ("ActiveState", "SubState", "Result", "InvocationID", "MainPID", "ExecMainCode",
              "ExecMainStatus", "NRestarts", "ActiveEnterTimestampMonotonic", "UnitFileState",
              "LoadState", "FragmentPath", "ExecStart", "NeedDaemonReload")


def entries(folder: str, pattern: str = "*") -> list[str]:
    """Sorted paths of FOLDER's entries matching PATTERN (hidden ones left out)."""
    return sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))


RUN_TIMEOUT_S = 60.0


def run(argv: list[str], timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    """Exit code (-N for signal N) and stdout of a command; its stdin and stderr are
    /dev/null; 127 when it cannot start. A command that does not end within TIMEOUT_S (a hung
    systemctl) is killed and raises TimeoutError: a state read must fail rather than report a
    service it could not read."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except OSError:
        return 127, ""
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def systemd_show(service: str) -> dict:
    _, out = run(["systemctl", "show", f"{service}.service", "--no-pager", "-p", ",".join(SHOW_PROPS)])
    return dict(line.partition("=")[::2] for line in out.splitlines())  # KEY=VALUE lines


def open_test(paths=None) -> str:
    """Open every /dev/nvidia* character device read-write and non-blocking, close it, and
    return one line per node: ``<path> ok`` or ``<path> <ERRNO NAME> <message>`` (the
    ``dev-open.txt`` of a snapshot). EPERM means the container's device cgroup refused the
    open; ENXIO/ENODEV mean the cgroup permitted it and no driver instance answered."""
    import errno
    import stat

    if paths is None:
        paths = entries("/dev", "nvidia*")
    lines = []
    for path in paths:
        try:
            if not stat.S_ISCHR(os.stat(path).st_mode):
                continue
        except OSError:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            lines.append(f"{path} {code} {exc.strerror}")
        else:
            os.close(fd)
            lines.append(f"{path} ok")
    return "\n".join(lines) + ("\n" if lines else "")


GPU_TIMEOUT_S = 20.0


def run_merged(argv: list[str], timeout_s: float = GPU_TIMEOUT_S) -> dict:
    """``{"rc", "out"}`` of a command, stdout and stderr together (nvidia-smi says a lost
    GPU's handle error on stderr, between the other GPUs' rows); ``{"rc": None, "error"}``
    when it cannot start or does not end within TIMEOUT_S (killed): a GPU read must not
    hold the host-state read, nor pass for an answer."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except OSError as exc:
        return {"rc": None, "out": "", "error": f"{argv[0]}: {exc.strerror or exc}"}
    except subprocess.TimeoutExpired:
        return {"rc": None, "out": "", "error": f"`{' '.join(argv)}` did not finish within "
                                                f"{timeout_s:g} s (killed)"}
    return {"rc": proc.returncode, "out": proc.stdout.decode("utf-8", "replace")}


def gpu_health(fields: list[str], kernel_pattern: str) -> dict:
    """The raw answers the GPU health is judged from (``core.gpuhealth``), read-only:
    ``query``: ``nvidia-smi --query-gpu=FIELDS`` (a field this driver does not know is dropped
    and the query asked again: ``dropped``); ``xml``: ``nvidia-smi -q -x`` when a field was
    dropped; ``kernel``: the kernel log's lines matching KERNEL_PATTERN (``dmesg``; its error
    when the container may not read it); ``dcgm``: ``dcgmi health -c`` where DCGM is
    installed (None otherwise)."""
    asked, dropped = list(fields), []
    while True:
        query = run_merged(["nvidia-smi", f"--query-gpu={','.join(asked)}",
                            "--format=csv,noheader,nounits"])
        bad = re.search(r'Field "([^"]+)" is not a valid field to query', query["out"])
        if query["rc"] == 0 or not bad or bad.group(1) not in asked or len(asked) == 1:
            break
        asked.remove(bad.group(1))
        dropped.append(bad.group(1))
    query.update(fields=asked, dropped=dropped)
    out = {"query": query, "xml": run_merged(["nvidia-smi", "-q", "-x"]) if dropped else None}
    if shutil.which("dmesg") is None:
        out["kernel"] = {"rc": None, "error": "dmesg: not installed", "lines": []}
    else:
        log = run_merged(["dmesg"])
        text = log.pop("out", "")
        if log["rc"] == 0:
            pattern = re.compile(kernel_pattern)
            log["lines"] = [line for line in text.splitlines() if pattern.search(line)][-200:]
            log["scanned"] = text.count("\n")
        else:
            log["error"] = log.get("error") or text.strip()[-500:]
        out["kernel"] = log
    out["dcgm"] = run_merged(["dcgmi", "health", "-c"]) if shutil.which("dcgmi") else None
    return out


def read_json(path: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def releases(root: str) -> dict:
    found = {}
    for rel_dir in entries(os.path.join(root, "releases")):
        meta_path = os.path.join(rel_dir, "release.json")
        if not os.path.lexists(meta_path):
            found[os.path.basename(rel_dir)] = {"complete": False, "patch": None}
            continue
        meta = read_json(meta_path) or {}
        meta["complete"] = os.path.exists(os.path.join(rel_dir, ".complete"))
        meta["patch"] = read_json(os.path.join(rel_dir, "autotune-patch.json"))
        # what the controller decides on without running the venv's python or fetching the
        # file: the patched file's sha256 (against the record) and server_args.py's sha256
        patched = (meta["patch"] or {}).get("file") if isinstance(meta["patch"], dict) else None
        meta["patch_file_sha256"] = sha256_file(patched) if patched else None
        args_files = [f for lib in entries(os.path.join(rel_dir, "venv", "lib"), "python*")
                      for f in [os.path.join(lib, "site-packages", "sglang", "srt", "server_args.py")]
                      if os.path.lexists(f)]
        meta["server_args_sha256"] = sha256_file(args_files[0]) if args_files else None
        found[os.path.basename(rel_dir)] = meta
    return found


def safetensors_shard(path: str) -> dict:
    """Size and internal consistency of one shard (header length + data end == file size),
    and its bytes in the page cache (``resident``, None: cannot be told)."""
    info = {"exists": os.path.exists(path)}
    if not info["exists"]:
        return info
    size = os.path.getsize(path)
    info["size"] = size
    info["resident"] = resident_bytes(path)  # before the header's read brings a page in
    try:
        with open(path, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > 100 * 1024 * 1024:
                raise ValueError("header too large")
            header = json.loads(fh.read(hlen))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
        info["expected_size"] = 8 + hlen + end
    except (ValueError, struct.error, KeyError, TypeError) as exc:
        info["error"] = f"unreadable safetensors header: {exc}"
    return info


#: in a model folder that model_fetch.py downloaded: which repo and revision it holds
FETCHED_RECORD = ".sglang-deploy-fetched.json"


def model_state(path: str, revisions: bool = True) -> dict:
    """The model folder at PATH; with REVISIONS also its record (``fetched``: the repo and
    revision model_fetch.py downloaded there) and each sibling ``PATH@REV`` folder (another
    revision, downloaded beside the one that serves)."""
    state = {"path": path, "exists": os.path.isdir(path)}
    if revisions:
        parent, name = os.path.split(path.rstrip("/"))
        state["revisions"] = {os.path.basename(d): model_state(d, revisions=False)
                              for d in entries(parent or "/", glob.escape(name) + "@*")}
    if not state["exists"]:
        return state
    state["fetched"] = read_json(os.path.join(path, FETCHED_RECORD))
    state["config"] = read_json(os.path.join(path, "config.json")) is not None
    index = read_json(os.path.join(path, "model.safetensors.index.json"))
    state["index"] = index is not None
    shards = sorted(set((index or {}).get("weight_map", {}).values()))
    if index is None and os.path.exists(os.path.join(path, "model.safetensors")):
        shards = ["model.safetensors"]
    state["total_size"] = ((index or {}).get("metadata") or {}).get("total_size")
    state["shards"] = {name: safetensors_shard(os.path.join(path, name)) for name in shards}
    return state


def sha256_file(path: str):
    import hashlib

    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def path_state(path: str) -> dict | None:
    """Kind, owner, group, octal mode and (for files) sha256 of PATH; None when absent."""
    import grp
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return None
    kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else \
        "file" if stat.S_ISREG(st.st_mode) else "other"
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    out = {"kind": kind, "user": user, "group": group, "mode": "%o" % stat.S_IMODE(st.st_mode)}
    if kind == "file":
        out["sha256"] = sha256_file(path)
    elif kind == "link":
        out["target"] = os.readlink(path)
    return out


def known_good(root: str):
    """The last verified configuration kept for rollback (ROOT/known-good/)."""
    kg = os.path.join(root, "known-good")
    record = read_json(os.path.join(kg, "record.json"))
    if record is None:
        return None
    return {"record": record, "unit_sha256": sha256_file(os.path.join(kg, "unit.service")),
            "secrets_sha256": sha256_file(os.path.join(kg, "secrets.env"))}


def uv_version(venv: str):
    """Version of the tool venv's uv, as ``uv --version`` gives it (None: absent or failing)."""
    uv = os.path.join(venv, "bin", "uv")
    if not os.access(uv, os.X_OK):
        return None
    rc, out = run([uv, "--version"])
    return out.split()[1] if rc == 0 and len(out.split()) > 1 else None


def glibc_version():
    """The version of the C library this python runs on when it is glibc ("2.36"); None for
    another C library (musl) or a version that cannot be read. The lock's manylinux wheels
    install only on glibc at least as new as their tag."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):  # not a name this C library knows
        text = None
    if text:
        name, _, version = text.partition(" ")
    else:
        name, version = platform.libc_ver()
    return version.strip() if name == "glibc" and version.strip() else None


def host_platform() -> dict:
    """What decides whether the lock's wheels install: this python's X.Y and glibc's version."""
    return {"python": "%d.%d" % sys.version_info[:2], "glibc": glibc_version()}


def cmd_state(args) -> dict:
    root = args.root
    health: dict = {}
    reader = None
    if args.gpu_health:  # read while the rest is: nvidia-smi may take a while per GPU
        reader = threading.Thread(target=lambda: health.update(gpu_health(
            args.gpu_health.split(","), args.kernel_pattern)), daemon=True)
        reader.start()
    current = None
    link = os.path.join(root, "current")
    if os.path.islink(link):
        current = os.path.basename(os.readlink(link).rstrip("/"))
    result = {
        "releases": releases(root),
        "current": current,
        "uv_version": uv_version(os.path.join(root, "tools", "venv")),
        "service": systemd_show(args.service) if args.service else {},
        "last_verified": read_json(os.path.join(root, "last-verified.json")),
        **host_platform(),  # "python", "glibc"
        "secrets_sha256": sha256_file(args.secrets) if args.secrets else None,
        # user names, so the runtime stage needs no pyinfra Users fact (a lastlog loop per user)
        "users": sorted({p.pw_name for p in pwd.getpwall()}),
        "paths": {p: path_state(p) for p in (args.path or [])},
        "known_good": known_good(root),
        "unit_sha256": args.service and sha256_file(f"/etc/systemd/system/{args.service}.service"),
        "p2p_verified": read_json(os.path.join(root, "p2p-verified.json")),
        "hardening": read_json(os.path.join(root, "hardening.json")),
        "monotonic_now": time.monotonic(),  # systemd's *TimestampMonotonic use the same clock
        "watchdog": watchdog_state(args.watchdog) if args.watchdog else None,
    }
    if args.model:
        result["model"] = model_state(args.model)
        result["memory"] = meminfo()
    if args.cache:
        result["cache_files"] = sum(len(files) for _, _, files in os.walk(args.cache))
    if args.dev_open:
        result["dev_open"] = open_test()
    if args.route_to:
        result["route_dev"] = route_dev(args.route_to)
    if reader is not None:
        reader.join()
        result["gpu_health"] = health or None
    return result


def watchdog_state(state_dir: str, keep: int = 20) -> dict:  # its unit, state, last events
    try:
        with open(os.path.join(state_dir, "events.jsonl")) as fh:
            events = [json.loads(line) for line in fh.read().splitlines()[-keep:] if line.strip()]
    except (OSError, ValueError):
        events = []
    return {"service": systemd_show("sglang-watchdog"), "events": events, "now": time.time(),
            "state": read_json(os.path.join(state_dir, "state.json"))}


def route_dev(addr: str) -> str | None:
    """The interface that carries ADDR on this host: the one that holds it (on rank 0 of a
    multi-node group), else the one its route goes out of (``ip``'s own answer)."""
    for argv in (["ip", "-o", "-4", "addr", "show", "to", f"{addr}/32"],
                 ["ip", "-o", "route", "get", addr]):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        words = out.split()
        if argv[3] == "addr" and len(words) > 1:
            return words[1]
        if "dev" in words:
            return words[words.index("dev") + 1]
    return None


def _secret(path: str | None, name: str) -> str | None:
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


def http(method: str, url: str, key: str | None, body: dict | None = None, timeout=5.0):
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return {"status": resp.status, "body": resp.read(4096).decode("utf-8", "replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read(1024).decode("utf-8", "replace")}
    except (OSError, ValueError) as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def journal(service: str, cursor: str | None, invocation: str | None, limit: int = 2000):
    cmd = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID",
           "-n", str(limit)]
    if invocation:
        cmd.append(f"_SYSTEMD_INVOCATION_ID={invocation}")
    else:
        cmd += ["-u", f"{service}.service"]
    if cursor:
        cmd.append(f"--after-cursor={cursor}")
    _, out = run(cmd)
    found, last = [], cursor
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        msg = entry.get("MESSAGE")
        if isinstance(msg, list):  # journald stores non-UTF-8 messages as byte arrays
            msg = bytes(msg).decode("utf-8", "replace")
        last = entry.get("__CURSOR", last)
        found.append({"t": int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6, "msg": msg or ""})
    return found, last


def cmd_poll(args) -> dict:
    result = {"now": time.time(), "service": systemd_show(args.service)}
    invocation = args.invocation or result["service"].get("InvocationID") or None
    if not args.no_journal:
        result["journal"], result["cursor"] = journal(args.service, args.cursor, invocation)
    if args.http:
        base = f"http://{args.host}:{args.port}"
        key = _secret(args.secrets, "SGLANG_API_KEY")
        result["health"] = http("GET", base + "/health", None)
        if result["health"].get("status") == 200:
            result["models"] = http("GET", base + "/v1/models", key)
            if args.generate:
                result["generate"] = http(
                    "POST", base + "/generate", key,
                    {"text": "Hello", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
                    timeout=60,
                )
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hoststate.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("state")
    st.add_argument("--root", required=True)
    st.add_argument("--service", help="the unit whose state is reported (none: not read)")
    st.add_argument("--model")
    st.add_argument("--secrets")
    st.add_argument("--path", action="append", help="report kind/owner/mode/sha256 (repeatable)")
    st.add_argument("--cache")
    st.add_argument("--route-to", help="report the interface that carries this address")
    st.add_argument("--dev-open", action="store_true",
                    help="also the open test of every /dev/nvidia* node (dev_open)")
    st.add_argument("--gpu-health", metavar="FIELDS",
                    help="also the GPU health read (gpu_health): nvidia-smi --query-gpu=FIELDS, "
                         "the kernel log's lines matching --kernel-pattern, dcgmi health -c")
    st.add_argument("--kernel-pattern", default=r"NVRM: Xid")
    st.add_argument("--watchdog", metavar="DIR", help="also sglang-watchdog's state (watchdog)")
    po = sub.add_parser("poll")
    po.add_argument("--service", required=True)
    po.add_argument("--host", default="127.0.0.1")
    po.add_argument("--port", type=int, required=True)
    po.add_argument("--cursor")
    po.add_argument("--invocation")
    po.add_argument("--http", action="store_true")
    po.add_argument("--generate", action="store_true")
    po.add_argument("--no-journal", action="store_true")
    po.add_argument("--secrets")
    sub.add_parser("platform")
    args = parser.parse_args(argv)
    out = cmd_state(args) if args.cmd == "state" else cmd_poll(args) if args.cmd == "poll" \
        else host_platform()
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

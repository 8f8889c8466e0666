#!/usr/bin/env python3
"""Read-only host state for sglang-deploy, one JSON object per call (stdlib only).

Shipped to the host (or fed on stdin) and run with the system python, so that one round
trip returns everything a fact or a verifier poll needs.

  hoststate.py state --root R --service S [--model PATH] [--dev-open]
  hoststate.py state-json '{"root": R, "service": S, ...}'   (the same, options as JSON)
  hoststate.py poll --service S --port P [--host H] [--cursor C] [--invocation ID]
                    [--http] [--generate] [--model-name NAME] [--secrets FILE]

``state-json`` is how the deploy runs it (its pre-flight snapshot, on every deploy): it reads
its options without argparse, whose import and parser cost that read about 4 ms of CPU.
"""

from __future__ import annotations

import os
import pwd
import struct
import sys
import time

SHOW_PROPS = (
    "ActiveState", "SubState", "Result", "InvocationID", "MainPID", "ExecMainCode",
    "ExecMainStatus", "NRestarts", "ActiveEnterTimestampMonotonic", "UnitFileState",
    "LoadState", "FragmentPath",
)


def _json_codec():
    """``(loads, dumps)`` for this script: the json package's own C accelerator (``_json``),
    driven as the package itself drives it. Importing ``json`` also compiles the regular
    expressions of its pure-Python fallbacks (importing ``re`` and ``enum``): about 9 ms of the
    host's CPU on every deploy's state read, a fifth of it. ``dumps`` sorts keys and escapes to
    ASCII, as ``json.dumps(obj, sort_keys=True)``; ``loads`` takes str or UTF-8 bytes. Checked
    on a sample against the answers ``json`` gives; a Python without the accelerator, or one
    whose accelerator answers otherwise, uses ``json`` itself."""
    try:
        import _json
        from types import SimpleNamespace

        constants = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
        scanner = _json.make_scanner(SimpleNamespace(
            strict=True, object_hook=None, object_pairs_hook=None, parse_float=float,
            parse_int=int, parse_constant=constants.__getitem__))

        def default(obj):
            raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

        def dumps(obj) -> str:
            encode = _json.make_encoder({}, default, _json.encode_basestring_ascii, None,
                                        ": ", ", ", True, False, True)
            return "".join(encode(obj, 0))

        def loads(text):
            if isinstance(text, (bytes, bytearray)):
                text = bytes(text).decode("utf-8")
            body = text.strip(" \t\n\r")  # JSON's whitespace, as json.loads skips it
            try:
                obj, end = scanner(body, 0)
                if end == len(body):
                    return obj
            except (StopIteration, SystemError):
                # the accelerator names errors with json.decoder's exception (a SystemError
                # while that module is not loaded)
                pass
            import json  # not JSON (or more after it): the package says why

            return json.loads(text)

        sample = {"b": [1, 2.5, None, True, False, "\u00e9\n\"q\\"], "a": {"z": -0.0, "n": 10 ** 20}}
        text = ('{"a": {"n": 100000000000000000000, "z": -0.0}, '
                '"b": [1, 2.5, null, true, false, "\\u00e9\\n\\"q\\\\"]}')
        if dumps(sample) != text or loads(text) != sample or loads(b" [1] ") != [1]:
            raise ValueError("the json accelerator answers otherwise")
        return loads, dumps
    except Exception:  # noqa: BLE001 (no or another accelerator: the json package itself)
        import json

        return json.loads, lambda obj: json.dumps(obj, sort_keys=True)


loads, dumps = _json_codec()


def entries(folder: str, prefix: str = "", suffix: str = "") -> list[str]:
    """Sorted paths of FOLDER's entries whose names start with PREFIX and end with SUFFIX,
    hidden ones left out (what ``glob.glob(FOLDER/PREFIX*SUFFIX)`` lists, without importing
    glob and compiling a pattern); [] when FOLDER cannot be listed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(os.path.join(folder, n) for n in names
                  if not n.startswith(".") and n.startswith(prefix) and n.endswith(suffix)
                  and len(n) >= len(prefix) + len(suffix))


RUN_TIMEOUT_S = 60.0


def run(argv: list[str], timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    """Exit code (-N for signal N) and stdout of a command; its stdin and stderr are
    /dev/null; 127 when it cannot start. Spawned with ``os.posix_spawnp``: importing
    subprocess (and with it locale, signal, selectors, threading) would cost every state read
    about 6 ms of CPU. The pipe's ends are not inheritable (``os.pipe``), so the command holds
    the write end only as its stdout, and the read ends when it exits. A command that does
    not end within TIMEOUT_S (a hung systemctl) is killed and raises TimeoutError: a state
    read must fail rather than report a service it could not read."""
    import select

    deadline = time.monotonic() + timeout_s
    r, w = os.pipe()
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, w, 1),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    except OSError:
        os.close(r)
        return 127, ""
    finally:
        os.close(w)
    chunks = []
    ready = select.poll()
    ready.register(r, select.POLLIN)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not ready.poll(left * 1000):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise TimeoutError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")


def systemd_show(service: str) -> dict:
    _, out = run(["systemctl", "show", f"{service}.service", "--no-pager", "-p", ",".join(SHOW_PROPS)])
    props = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        props[key] = value
    return props


def open_test(paths=None) -> str:
    """Open every /dev/nvidia* character device read-write and non-blocking, close it, and
    return one line per node: ``<path> ok`` or ``<path> <ERRNO NAME> <message>`` (the
    ``dev-open.txt`` of a snapshot). EPERM means the container's device cgroup refused the
    open; ENXIO/ENODEV mean the cgroup permitted it and no driver instance answered."""
    import errno
    import stat

    if paths is None:
        paths = entries("/dev", "nvidia")
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


def read_json(path: str):
    try:
        with open(path) as fh:
            return loads(fh.read())
    except (OSError, ValueError):
        return None


def releases(root: str) -> dict:
    found = {}
    release_dirs = entries(os.path.join(root, "releases"))
    for rel_dir in release_dirs:
        meta_path = os.path.join(rel_dir, "release.json")
        if not os.path.lexists(meta_path):
            continue
        meta = read_json(meta_path) or {}
        meta["complete"] = os.path.exists(os.path.join(rel_dir, ".complete"))
        meta["patch"] = read_json(os.path.join(rel_dir, "autotune-patch.json"))
        # what the controller decides on without running the venv's python or fetching the
        # file: the patched file's sha256 (against the record) and server_args.py's sha256
        patched = (meta["patch"] or {}).get("file") if isinstance(meta["patch"], dict) else None
        meta["patch_file_sha256"] = sha256_file(patched) if patched else None
        args_files = [f for lib in entries(os.path.join(rel_dir, "venv", "lib"), "python")
                      for f in [os.path.join(lib, "site-packages", "sglang", "srt", "server_args.py")]
                      if os.path.lexists(f)]
        meta["server_args_sha256"] = sha256_file(args_files[0]) if args_files else None
        found[os.path.basename(rel_dir)] = meta
    for rel_dir in release_dirs:
        found.setdefault(os.path.basename(rel_dir), {"complete": False, "patch": None})
    return found


def safetensors_shard(path: str) -> dict:
    """Size and internal consistency of one shard (header length + data end == file size)."""
    info = {"exists": os.path.exists(path)}
    if not info["exists"]:
        return info
    size = os.path.getsize(path)
    info["size"] = size
    try:
        with open(path, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > 100 * 1024 * 1024:
                raise ValueError("header too large")
            header = loads(fh.read(hlen))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
        info["expected_size"] = 8 + hlen + end
    except (ValueError, struct.error, KeyError, TypeError) as exc:
        info["error"] = f"unreadable safetensors header: {exc}"
    return info


def model_state(path: str) -> dict:
    state = {"path": path, "exists": os.path.isdir(path)}
    if not state["exists"]:
        return state
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


def recorded_size(dist_info: str, path: str):
    """The size a wheel's RECORD in DIST_INFO gives for PATH (None when it names no size)."""
    site = os.path.dirname(dist_info)
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8") as fh:
            for line in fh:
                name, _, rest = line.rstrip("\n").partition(",")
                if os.path.normpath(os.path.join(site, name)) == os.path.normpath(path):
                    size = rest.rpartition(",")[2]
                    return int(size) if size.isdigit() else None
    except OSError:
        return None
    return None


def uv_version(venv: str):
    """Version of the tool venv's uv (None: absent or not answering). From the package record
    the installer wrote (``uv-X.dist-info``) when there is exactly one and its RECORD gives the
    binary's size, so that no 38 MB binary is started on every read; anything else (two
    records, a binary replaced by hand) asks ``uv --version``."""
    uv = os.path.join(venv, "bin", "uv")
    if not os.access(uv, os.X_OK):
        return None
    infos = [info for lib in entries(os.path.join(venv, "lib"), "python")
             for info in entries(os.path.join(lib, "site-packages"), "uv-", ".dist-info")]
    if len(infos) == 1 and recorded_size(infos[0], uv) == os.stat(uv).st_size:
        return os.path.basename(infos[0])[len("uv-"):-len(".dist-info")]
    rc, out = run([uv, "--version"])
    return out.split()[1] if rc == 0 and len(out.split()) > 1 else None


def cmd_state(args) -> dict:
    root = args.root
    current = None
    link = os.path.join(root, "current")
    if os.path.islink(link):
        current = os.path.basename(os.readlink(link).rstrip("/"))
    result = {
        "releases": releases(root),
        "current": current,
        "uv_version": uv_version(os.path.join(root, "tools", "venv")),
        "service": systemd_show(args.service),
        "last_verified": read_json(os.path.join(root, "last-verified.json")),
        "python": "%d.%d" % sys.version_info[:2],
        "secrets_sha256": sha256_file(args.secrets) if args.secrets else None,
        # user names, so the runtime stage needs no pyinfra Users fact (a lastlog loop per user)
        "users": sorted({p.pw_name for p in pwd.getpwall()}),
        "paths": {p: path_state(p) for p in (args.path or [])},
        "known_good": known_good(root),
        "unit_sha256": sha256_file(f"/etc/systemd/system/{args.service}.service"),
        "p2p_verified": read_json(os.path.join(root, "p2p-verified.json")),
        "monotonic_now": time.monotonic(),  # systemd's *TimestampMonotonic use the same clock
    }
    if args.model:
        result["model"] = model_state(args.model)
    if args.cache:
        result["cache_files"] = sum(len(files) for _, _, files in os.walk(args.cache))
    if args.dev_open:
        result["dev_open"] = open_test()
    return result


def _secret(path: str | None, name: str) -> str | None:
    if not path:
        return None
    try:
        with open(path) as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep and key == name:
                    value = value.strip()
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        out, it = [], iter(value[1:-1])
                        for ch in it:
                            out.append(next(it, "") if ch == "\\" else ch)
                        return "".join(out)
                    return value
    except OSError:
        return None
    return None


def http(method: str, url: str, key: str | None, body: dict | None = None, timeout=5.0):
    import urllib.error  # here, not at the top: it costs the state read ~60 ms of imports
    import urllib.request

    data = dumps(body).encode() if body is not None else None
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
            entry = loads(line)
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


#: the options of ``state`` (as ``state-json`` takes them) and their defaults
STATE_OPTIONS = {"root": None, "service": None, "model": None, "secrets": None, "path": [],
                 "cache": None, "dev_open": False}


def state_options(text: str):
    """The ``state`` options from ``state-json``'s JSON object (names as in STATE_OPTIONS);
    raises ValueError naming what is wrong."""
    from types import SimpleNamespace

    given = loads(text)
    if not isinstance(given, dict):
        raise ValueError("state-json takes one JSON object")
    unknown = sorted(set(given) - set(STATE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown state option(s): {', '.join(unknown)}")
    opts = {**STATE_OPTIONS, **given}
    for key in ("root", "service"):
        if not isinstance(opts[key], str) or not opts[key]:
            raise ValueError(f"state option {key!r} is required (a string)")
    if not isinstance(opts["path"], list) or not all(isinstance(p, str) for p in opts["path"]):
        raise ValueError("state option 'path' is a list of strings")
    return SimpleNamespace(**opts)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["state-json"]:
        try:
            opts = state_options(argv[1] if len(argv) == 2 else "")
        except ValueError as exc:
            sys.stderr.write(f"hoststate.py state-json: {exc}\n")
            return 2
        sys.stdout.write(dumps(cmd_state(opts)))
        sys.stdout.write("\n")
        return 0
    import argparse

    def _formatter(prog):
        return argparse.HelpFormatter(prog, width=100)

    # a fixed help width: argparse otherwise imports shutil and asks the terminal its size for
    # every argument added (about 4 ms of a state read that runs on every deploy)
    parser = argparse.ArgumentParser(prog="hoststate.py", formatter_class=_formatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("state", formatter_class=_formatter)
    st.add_argument("--root", required=True)
    st.add_argument("--service", required=True)
    st.add_argument("--model")
    st.add_argument("--secrets")
    st.add_argument("--path", action="append", help="report kind/owner/mode/sha256 (repeatable)")
    st.add_argument("--cache")
    st.add_argument("--dev-open", action="store_true",
                    help="also the open test of every /dev/nvidia* node (dev_open)")
    po = sub.add_parser("poll", formatter_class=_formatter)
    po.add_argument("--service", required=True)
    po.add_argument("--host", default="127.0.0.1")
    po.add_argument("--port", type=int, required=True)
    po.add_argument("--cursor")
    po.add_argument("--invocation")
    po.add_argument("--http", action="store_true")
    po.add_argument("--generate", action="store_true")
    po.add_argument("--no-journal", action="store_true")
    po.add_argument("--secrets")
    args = parser.parse_args(argv)
    out = cmd_state(args) if args.cmd == "state" else cmd_poll(args)
    sys.stdout.write(dumps(out))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

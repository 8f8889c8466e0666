#!/usr/bin/env python3
"""FlashInfer's autotune cache on the host: what is there, and a folder copied to a new key
(stdlib only; the decision is the controller's, ``core/autotunekey.py``).

  autotune_cache.py scan --cache DIR --old MODEL --new MODEL
      {"folders": {"<flashinfer version>/sm<XY>": [key, ...]}, "old_config": {...} | null,
       "new_config": {...} | null}
  autotune_cache.py copy --cache DIR --parent P --from KEY --to KEY
      {"ok": true, "files": N, "bytes": B} | {"ok": false, "error": "..."}

DIR is the server's ``SGLANG_CACHE_DIR``; the folders live under ``DIR/flashinfer/autotune``.
``copy`` writes a temporary folder beside the new one and renames it into place, owned as the
old folder is (the service user), so that a server never sees half a cache; an existing
destination is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

KEY = re.compile(r"^[0-9a-f]{16}$")
PART = re.compile(r"^[A-Za-z0-9._+-]+$")


def root(cache: str) -> str:
    return os.path.join(cache, "flashinfer", "autotune")


def read_config(model: str):
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def folders(cache: str) -> dict:
    out = {}
    top = root(cache)
    try:
        versions = sorted(os.listdir(top))
    except OSError:
        return out
    for version in versions:
        try:
            archs = sorted(os.listdir(os.path.join(top, version)))
        except OSError:
            continue
        for arch in archs:
            try:
                keys = os.listdir(os.path.join(top, version, arch))
            except OSError:
                continue
            out[f"{version}/{arch}"] = sorted(k for k in keys if KEY.match(k))
    return out


def copy(cache: str, parent: str, source: str, dest: str) -> dict:
    parts = parent.split("/")
    if len(parts) != 2 or not all(PART.match(p) and p not in (".", "..") for p in parts) \
            or not KEY.match(source) or not KEY.match(dest):
        return {"ok": False, "error": f"refused: parent {parent!r}, keys {source!r} {dest!r}"}
    base = os.path.join(root(cache), *parts)
    src, dst = os.path.join(base, source), os.path.join(base, dest)
    if os.path.exists(dst):
        return {"ok": True, "files": 0, "bytes": 0, "existed": True}
    if not os.path.isdir(src):
        return {"ok": False, "error": f"{src} is not a folder"}
    tmp = os.path.join(base, f".{dest}.tmp-{os.getpid()}")
    try:
        shutil.copytree(src, tmp, symlinks=True)
        st = os.stat(src)
        n = size = 0
        for where, dirs, files in os.walk(tmp):
            for name in [*dirs, *files]:
                path = os.path.join(where, name)
                if os.geteuid() == 0:
                    os.lchown(path, st.st_uid, st.st_gid)
                if name in files:
                    n += 1
                    size += os.lstat(path).st_size
        if os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, st.st_mode & 0o7777)
        os.rename(tmp, dst)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "files": n, "bytes": size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="autotune_cache.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    scan = sub.add_parser("scan")
    scan.add_argument("--cache", required=True)
    scan.add_argument("--old", required=True)
    scan.add_argument("--new", required=True)
    cp = sub.add_parser("copy")
    cp.add_argument("--cache", required=True)
    cp.add_argument("--parent", required=True)
    cp.add_argument("--from", dest="source", required=True)
    cp.add_argument("--to", dest="dest", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "scan":
        out = {"folders": folders(args.cache), "old_config": read_config(args.old),
               "new_config": read_config(args.new)}
    else:
        out = copy(args.cache, args.parent, args.source, args.dest)
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0 if out.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The release smoke: does this venv's sglang import and accept the launch flags?

Run by a release venv's python (stdlib only), on the controller by ``sglang-deploy lock
--check`` and on each host before the switch (``releaseops.release_smoke``, under the unit's
own sandbox). Steps, in order (``--steps``, default all three):

- ``import``: ``import sglang``.
- ``flags``: sglang's own ``prepare_server_args`` on the launch flags (argv after
  ``--``): an unknown flag or a bad value gets sglang's own argparse error. The GPUs are
  hidden from the smoke (the caller sets ``CUDA_VISIBLE_DEVICES=``: the serving release holds
  them), so ``ServerArgs.__post_init__`` stops at sglang's exact "No accelerator ... is
  available" error, after the parse: that stop, and only it, is expected.
- ``entrypoints``: imports of the server's entry modules (``--module``). The one failure
  tolerated is the CUDA driver library being absent on this machine: the error names
  ``libcuda.so.1: cannot open shared object file`` AND loading libcuda.so.1 here fails.

Prints one JSON object on stdout: ``{"ok", "sglang_version", "steps": [{"step", "status",
"detail"}], "error": {"step", "type", "message", "frames", "packages"}|null}``. ``packages``
names the installed distributions whose files the failing traceback passes through, each
with its version and who requires it with which bound (read from the dists' metadata).
Exit status 0 when ok, 1 when a step failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.metadata as md
import io
import json
import os
import re
import sys
import time
import traceback

STEPS = ("import", "flags", "entrypoints")
ENTRYPOINTS = ("sglang.launch_server", "sglang.srt.entrypoints.http_server",
               "sglang.srt.managers.scheduler", "sglang.srt.model_executor.model_runner")
NO_ACCELERATOR = "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is available."
LIBCUDA_ABSENT = "libcuda.so.1: cannot open shared object file: No such file or directory"
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(\(?[^;]*?\)?)\s*(;.*)?$")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def libcuda_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def driver_absent(exc: BaseException) -> bool:
    """EXC comes from the CUDA driver library being absent here, exactly: some error of its
    chain is (or quotes, as sgl_kernel's loader does) the loader's own message for
    libcuda.so.1, and libcuda.so.1 indeed does not load on this machine."""
    quoted = any(str(e) == LIBCUDA_ABSENT or f"ImportError: {LIBCUDA_ABSENT}" in str(e)
                 or f"OSError: {LIBCUDA_ABSENT}" in str(e) for e in _chain(exc))
    return quoted and not libcuda_loads()


def no_accelerator(exc: BaseException) -> bool:
    """EXC is sglang's own get_device() error (after the flags were parsed)."""
    if not (isinstance(exc, RuntimeError) and str(exc) == NO_ACCELERATOR):
        return False
    return any(f.name == "get_device" for f in traceback.extract_tb(exc.__traceback__))


def _site_dirs() -> list[str]:
    import site
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return sorted({os.path.realpath(d) for d in dirs if d}, key=len, reverse=True)


def _top_level(path: str, sites: list[str]) -> str | None:
    real = os.path.realpath(path)
    for d in sites:
        if real.startswith(d + os.sep):
            first = real[len(d) + 1:].split(os.sep, 1)[0]
            return first.removesuffix(".py")
    return None


def _requirers() -> dict[str, list[tuple[str, str, str]]]:
    """canonical name -> [(requirer, its version, the bound it asks for)]."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for dist in md.distributions():
        who = dist.metadata["Name"] or "?"
        for req in dist.requires or ():
            m = _REQ.match(req)
            if not m:
                continue
            marker = m.group(4) or ""
            if "extra ==" in marker:
                continue
            bound = (m.group(3) or "").strip().strip("()").strip()
            out.setdefault(_canon(m.group(1)), []).append((who, dist.version, bound))
    return out


def packages_of(exc: BaseException) -> list[dict]:
    """The installed distributions the traceback of EXC passes through, innermost first."""
    sites = _site_dirs()
    owners = md.packages_distributions()
    tops: list[str] = []
    for e in _chain(exc):
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            top = _top_level(frame.filename, sites)
            if top and top not in tops:
                tops.append(top)
    requirers = _requirers()
    out, seen = [], set()
    for top in tops:
        for name in owners.get(top, ()):
            key = _canon(name)
            if key in seen:
                continue
            seen.add(key)
            try:
                version = md.version(name)
            except md.PackageNotFoundError:
                continue
            out.append({"name": key, "version": version, "required_by": [
                {"name": _canon(w), "version": v, "bound": b} for w, v, b in
                sorted(requirers.get(key, []))]})
    return out


def _error(step: str, exc: BaseException) -> dict:
    frames = [f"{f.filename}:{f.lineno} in {f.name}"
              for f in traceback.extract_tb(exc.__traceback__)[-6:]]
    return {"step": step, "type": type(exc).__name__, "message": str(exc).strip()[-2000:],
            "frames": frames, "packages": packages_of(exc)}


def run(steps: list[str], flags: list[str], modules: list[str]) -> dict:
    result: dict = {"ok": True, "sglang_version": None, "steps": [], "error": None}

    def done(step: str, status: str, detail: str = "", t0: float = 0.0) -> None:
        result["steps"].append({"step": step, "status": status, "detail": detail,
                                "seconds": round(time.monotonic() - t0, 1)})

    def fail(step: str, exc: BaseException, t0: float) -> dict:
        result["ok"] = False
        result["error"] = _error(step, exc)
        done(step, "failed", f"{type(exc).__name__}: {str(exc).strip()[:300]}", t0)
        return result

    t0 = time.monotonic()
    try:
        sglang = importlib.import_module("sglang")
        result["sglang_version"] = getattr(sglang, "__version__", None) or md.version("sglang")
    except BaseException as exc:  # noqa: BLE001 - every import failure is the finding
        return fail("import", exc, t0)
    done("import", "passed", f"sglang {result['sglang_version']}", t0)

    if "flags" in steps:
        t0 = time.monotonic()
        err = io.StringIO()
        try:
            from sglang.srt.server_args import prepare_server_args
            with contextlib.redirect_stderr(err):
                prepare_server_args(list(flags))
            done("flags", "passed", "parsed and post-initialised", t0)
        except SystemExit as exc:  # argparse: usage + "error: ..." on stderr
            text = err.getvalue().strip() or f"exit status {exc.code}"
            return fail("flags", ValueError(text), t0)
        except BaseException as exc:  # noqa: BLE001
            if not no_accelerator(exc):
                return fail("flags", exc, t0)
            done("flags", "passed", "parsed by sglang's own parser; post-init stopped at "
                 "'No accelerator' (the GPUs are hidden from the smoke)", t0)

    if "entrypoints" in steps:
        for module in modules:
            t0 = time.monotonic()
            try:
                importlib.import_module(module)
                done(f"import {module}", "passed", "", t0)
            except BaseException as exc:  # noqa: BLE001
                if driver_absent(exc):
                    done(f"import {module}", "driver-absent",
                         "stopped at the CUDA driver library (libcuda.so.1), absent here", t0)
                    continue
                return fail(f"import {module}", exc, t0)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated, of {', '.join(STEPS)} (import always runs)")
    p.add_argument("--module", action="append", default=None,
                   help=f"entry module to import (default: {', '.join(ENTRYPOINTS)})")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the launch flags")
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        p.error(f"unknown step(s) {', '.join(bad)}; choose from {', '.join(STEPS)}")
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    # Nothing that the server's import prints (warnings, logging) may mix into the JSON.
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = run(steps, flags, args.module or list(ENTRYPOINTS))
    finally:
        sys.stdout = out
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

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

On a host, with ``--device NODE`` (every /dev/nvidia* node the pre-flight found) and
``--device-allow NODE`` (the unit's DeviceAllow list), a first step, ``sandbox``, touches the
GPUs' doors and not their memory: it opens every NODE read-write and closes it, calls
``cuInit`` + ``cuDeviceGetCount`` through libcuda.so.1 in a child process that sees the GPUs
(ctypes; no context, no GPU memory: safe while the old release serves), and reads what the
process really got from its sandbox: ``NoNewPrivs``, ``Seccomp``, ``CapBnd``, ``CapEff`` from
/proc/self/status, whether the device nodes outside DeviceAllow that opened in a control run
outside the sandbox (``--control``, then ``--outside NODE``) are refused, and whether a write
outside ReadWritePaths (the venv, ``sys.prefix``) is refused by a read-only mount (EROFS).
What it saw is ``sandbox`` in the result (``core.hardening`` judges it); a node the server
needs that the sandbox refuses fails the step.

Each step says on stdout that it starts (``release smoke: STEP ...``) before the result.

Prints one JSON object on stdout: ``{"ok", "sglang_version", "steps": [{"step", "status",
"detail"}], "sandbox": {...}|null, "error": {"step", "type", "message", "frames",
"packages"}|null}``. ``packages``
names the installed distributions whose files the failing traceback passes through, each
with its version and who requires it with which bound (read from the dists' metadata).
Exit status 0 when ok, 1 when a step failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import importlib
import importlib.metadata as md
import io
import json
import os
import re
import subprocess
import sys
import tempfile
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


# ------------------------------------------------------------------ the sandbox's doors

#: the nodes a CUDA server opens (``core.hardening.NEEDED`` says the same)
_NEEDED = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools)$")
#: world-usable device nodes outside every DeviceAllow list and outside DevicePolicy=closed's
#: pseudo devices: opening one tells whether DevicePolicy is in force at all
_OUTSIDE = ("/dev/net/tun", "/dev/fuse")
_REFUSED = (errno.EPERM, errno.EACCES)


def progress(text: str) -> None:
    """One progress line on the process's real stdout (``main`` points ``sys.stdout`` at
    stderr while the steps run; the caller shows the line as it arrives)."""
    print(f"release smoke: {text}", file=sys.__stdout__, flush=True)


def open_node(path: str) -> str:
    """"ok" (opened, or the kernel got past the device cgroup: ENXIO/ENODEV, a node without
    its driver), "refused EPERM" or "refused EACCES", "missing", or "error ERRNO"."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno in _REFUSED:
            return f"refused {errno.errorcode[exc.errno]}"
        if exc.errno == errno.ENOENT:
            return "missing"
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EIO, errno.EBUSY):
            return "ok"
        return f"error {errno.errorcode.get(exc.errno, exc.errno)}"
    return "ok"


def proc_status() -> dict:
    out = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("NoNewPrivs", "Seccomp", "Seccomp_filters", "CapBnd", "CapEff", "CapAmb"):
                out[key] = value.strip()
    return out


def write_outside(folder: str) -> str:
    """"refused-readonly" (EROFS: a read-only mount, ProtectSystem), "written" (removed
    again), or "refused ERRNO" (file permissions, not the sandbox)."""
    try:
        fd, path = tempfile.mkstemp(prefix=".smoke-write-", dir=folder)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return "refused-readonly"
        return f"refused {errno.errorcode.get(exc.errno, exc.errno)}"
    os.close(fd)
    os.unlink(path)
    return "written"


def cuda_count() -> dict:
    """cuInit + cuDeviceGetCount through libcuda.so.1 (no context, no memory)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"library": None, "error": str(exc)}
    rc = lib.cuInit(0)
    count = ctypes.c_int(-1)
    rc_count = lib.cuDeviceGetCount(ctypes.byref(count)) if rc == 0 else None
    return {"library": "libcuda.so.1", "init": rc, "count_rc": rc_count,
            "count": count.value if rc_count == 0 else None}


def cuda_in_child() -> dict:
    """``cuda_count`` in a child that sees the GPUs (the smoke hides them from itself:
    CUDA_VISIBLE_DEVICES=, so that sglang's parser stops where it should)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cuda-count"],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    for line in reversed(proc.stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return {"error": f"no result (exit status {proc.returncode}): {proc.stderr.strip()[-300:]}"}


def control(devices: list[str], allowed: list[str]) -> list[str]:
    """Outside the sandbox (``--control``, as root): the nodes that DeviceAllow does not list
    and that open here (found GPU-side nodes, then world-usable ones): under the sandbox a
    refusal of one of them is the sandbox's doing."""
    candidates = [d for d in devices if d not in allowed] + [d for d in _OUTSIDE
                                                               if d not in devices]
    return [d for d in candidates if open_node(d) == "ok"]


def sandbox(devices: list[str], allowed: list[str], outside: list[str]) -> dict:
    """What the process really got (see the module's text); OUTSIDE: ``control``'s nodes."""
    doors = {d: open_node(d) for d in devices}
    outside = {d: doors.get(d) or open_node(d) for d in outside}
    return {"status": proc_status(), "devices": doors, "device_allow": list(allowed),
            "outside": outside, "write_outside": {"path": sys.prefix,
                                                  "result": write_outside(sys.prefix)},
            "cuda": cuda_in_child(), "uid": os.getuid()}


def door_problems(box: dict) -> list[str]:
    """The nodes the server needs that the sandbox refuses, and a CUDA that does not start."""
    out = []
    for node, seen in box["devices"].items():
        if not _NEEDED.match(node) or seen == "ok":
            continue
        listed = node in box["device_allow"]
        out.append(f"{node}: {seen}" + ("" if listed else " (the unit's DeviceAllow does not "
                                                           "list it)"))
    cuda = box.get("cuda") or {}
    if cuda.get("library") and cuda.get("init") not in (0, None):
        out.append(f"cuInit returned {cuda['init']} under the unit's sandbox")
    return out


def _error(step: str, exc: BaseException) -> dict:
    frames = [f"{f.filename}:{f.lineno} in {f.name}"
              for f in traceback.extract_tb(exc.__traceback__)[-6:]]
    return {"step": step, "type": type(exc).__name__, "message": str(exc).strip()[-2000:],
            "frames": frames, "packages": packages_of(exc)}


def sandbox_step(devices: list[str], allowed: list[str] | None,
                 outside: list[str] | None) -> tuple[dict, list[str], str]:
    """(what the sandbox gave, the door problems, the step's detail)."""
    progress(f"sandbox: opening {len(devices)} device nodes, cuInit + cuDeviceGetCount ...")
    box = sandbox(devices, list(allowed or ()), list(outside or ()))
    count = (box.get("cuda") or {}).get("count")
    detail = f"{len(devices)} nodes opened" + (f", {count} CUDA devices" if count is not None
                                               else ", no libcuda here")
    return box, door_problems(box), detail


class DoorsRefused(Exception):
    """A node the server needs is refused by the unit's sandbox, or CUDA does not start."""


def parse_flags(flags: list[str]) -> tuple[str, BaseException | None]:
    """sglang's own ``prepare_server_args`` on FLAGS: (the step's detail, None) when they
    parse, or ("", the error) when not; 'No accelerator' after the parse is a pass (the GPUs
    are hidden from the smoke)."""
    err = io.StringIO()
    try:
        from sglang.srt.server_args import prepare_server_args
        with contextlib.redirect_stderr(err):
            prepare_server_args(list(flags))
        return "parsed and post-initialised", None
    except SystemExit as exc:  # argparse: usage + "error: ..." on stderr
        return "", ValueError(err.getvalue().strip() or f"exit status {exc.code}")
    except BaseException as exc:  # noqa: BLE001
        if not no_accelerator(exc):
            return "", exc
        return ("parsed by sglang's own parser; post-init stopped at 'No accelerator' (the "
                "GPUs are hidden from the smoke)"), None


def run(steps: list[str], flags: list[str], modules: list[str],
        devices: list[str] | None = None, allowed: list[str] | None = None,
        outside: list[str] | None = None) -> dict:
    result: dict = {"ok": True, "sglang_version": None, "steps": [], "error": None,
                    "sandbox": None}

    def done(step: str, status: str, detail: str = "", t0: float = 0.0) -> None:
        result["steps"].append({"step": step, "status": status, "detail": detail,
                                "seconds": round(time.monotonic() - t0, 1)})

    def fail(step: str, exc: BaseException, t0: float) -> dict:
        result["ok"] = False
        result["error"] = _error(step, exc)
        done(step, "failed", f"{type(exc).__name__}: {str(exc).strip()[:300]}", t0)
        return result

    if devices:
        t0 = time.monotonic()
        result["sandbox"], problems, detail = sandbox_step(devices, allowed, outside)
        if problems:
            return fail("sandbox", DoorsRefused("; ".join(problems)), t0)
        done("sandbox", "passed", detail, t0)

    t0 = time.monotonic()
    progress("import: import sglang ...")
    try:
        sglang = importlib.import_module("sglang")
        result["sglang_version"] = getattr(sglang, "__version__", None) or md.version("sglang")
    except BaseException as exc:  # noqa: BLE001 - every import failure is the finding
        return fail("import", exc, t0)
    done("import", "passed", f"sglang {result['sglang_version']}", t0)

    if "flags" in steps:
        t0 = time.monotonic()
        progress("flags: sglang's own parser on the launch flags ...")
        detail, exc = parse_flags(flags)
        if exc is not None:
            return fail("flags", exc, t0)
        done("flags", "passed", detail, t0)

    if "entrypoints" in steps:
        for module in modules:
            t0 = time.monotonic()
            progress(f"entrypoints: import {module} ...")
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
    p.add_argument("--device", action="append", default=[],
                   help="a device node the server needs or the pre-flight found (sandbox step)")
    p.add_argument("--device-allow", action="append", default=[],
                   help="a node of the unit's DeviceAllow list")
    p.add_argument("--outside", action="append", default=[],
                   help="a node outside DeviceAllow that opened outside the sandbox (--control)")
    p.add_argument("--control", action="store_true",
                   help="outside the sandbox: print the nodes to try as --outside, as JSON")
    p.add_argument("--cuda-count", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the launch flags")
    args = p.parse_args(argv)
    if args.cuda_count:  # the child of ``cuda_in_child``
        print(json.dumps(cuda_count()), flush=True)
        return 0
    if args.control:
        print(json.dumps({"outside": control(args.device, args.device_allow)}), flush=True)
        return 0
    steps = [s for s in args.steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        p.error(f"unknown step(s) {', '.join(bad)}; choose from {', '.join(STEPS)}")
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    # Nothing that the server's import prints (warnings, logging) may mix into the JSON.
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = run(steps, flags, args.module or list(ENTRYPOINTS), args.device,
                     args.device_allow, args.outside)
    finally:
        sys.stdout = out
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

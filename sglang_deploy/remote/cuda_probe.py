#!/usr/bin/env python3
"""CUDA driver-API probe (stdlib only, Python >= 3.9), shipped to GPU hosts.

    python3 cuda_probe.py [--p2p] [--mib N] [--iters N] [--timeout S] [--library PATH]

Loads ``libcuda.so.1`` with ctypes, initialises the driver, lists the devices and, with
``--p2p``, copies data between every ordered pair of GPUs (cuMemcpyPeer), checks the
bytes that arrive and measures the bandwidth. Prints ONE JSON object on stdout and exits
0 whatever happened; the object says what failed::

    {"ok": true|false,
     "library": "/usr/lib/x86_64-linux-gnu/libcuda.so.1" | null,
     "error": null | {"call": "cuInit", "code": 999, "name": "CUDA_ERROR_UNKNOWN",
                      "message": "unknown error"},
     "driver_version": 13000,
     "device_count": 8,
     "devices": [{"index": 0, "name": "...", "cc": "12.0", "total_mem_mib": 97887}],
     "p2p": [{"src": 0, "dst": 1, "can_access": true, "verified": true, "gbps": 41.2,
              "error": null}]}

``gbps`` is the fastest of ``--iters`` timed copies of ``--mib`` MiB (a link's speed; a copy
slowed by other load on the host does not lower it). ``ok`` is false when a call outside the
per-pair test failed (``error`` says which) or
the probe timed out; per-pair failures go to that pair's ``error`` and leave ``ok`` alone.
Pairs without peer access are copied too (the driver stages through host memory), so
``verified``/``gbps`` then describe the fallback path.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import struct
import sys
import threading
import time

LIBRARY = "libcuda.so.1"
MIB = 1024 * 1024

CUDA_SUCCESS = 0
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

# used when cuGetErrorName itself is unavailable
_ERROR_NAMES = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",  # runtime-API numbering (cudaErrorInsufficientDriver)
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
    800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

c_int_p = ctypes.POINTER(ctypes.c_int)
c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
c_u64_p = ctypes.POINTER(ctypes.c_uint64)
c_char_pp = ctypes.POINTER(ctypes.c_char_p)

# name -> argtypes (all return CUresult = int). Versioned names as cuda.h maps them.
SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuDriverGetVersion": [c_int_p],
    "cuDeviceGetCount": [c_int_p],
    "cuDeviceGet": [c_int_p, ctypes.c_int],
    "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "cuDeviceTotalMem_v2": [c_size_p, ctypes.c_int],
    "cuDeviceGetAttribute": [c_int_p, ctypes.c_int, ctypes.c_int],
    "cuGetErrorName": [ctypes.c_int, c_char_pp],
    "cuGetErrorString": [ctypes.c_int, c_char_pp],
    # the copy test's
    "cuDevicePrimaryCtxRetain": [c_void_pp, ctypes.c_int],
    "cuDevicePrimaryCtxRelease_v2": [ctypes.c_int],
    "cuCtxSetCurrent": [ctypes.c_void_p],
    "cuCtxSynchronize": [],
    "cuDeviceCanAccessPeer": [c_int_p, ctypes.c_int, ctypes.c_int],
    "cuCtxEnablePeerAccess": [ctypes.c_void_p, ctypes.c_uint],
    "cuMemAlloc_v2": [c_u64_p, ctypes.c_size_t],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t],
    "cuMemcpyPeer": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                     ctypes.c_size_t],
}


class CudaError(Exception):
    def __init__(self, call, code=None, name=None, message=None):
        super().__init__(call, code, name, message)
        self.call, self.code, self.name, self.message = call, code, name, message

    def as_dict(self):
        return {"call": self.call, "code": self.code, "name": self.name, "message": self.message}

    def short(self):
        text = "%s: %s" % (self.call, self.name or self.code)
        if self.code is not None and self.name:
            text += " (%d)" % self.code
        if self.message:
            text += ": %s" % self.message
        return text


class Driver:
    """Thin checked wrapper around the driver API functions the probe needs."""

    def __init__(self, lib):
        self.lib = lib
        self.current_call = None

    def func(self, name):
        try:
            f = getattr(self.lib, name)  # ctypes keeps the function (and its types) on LIB
        except AttributeError:
            raise CudaError("dlsym", None, None, "libcuda has no symbol %s" % name) from None
        f.argtypes = SIGNATURES[name]
        f.restype = ctypes.c_int
        return f

    def error_text(self, code):
        """(name, message) of CODE from the driver; the name from the table otherwise."""
        found = []
        for call in ("cuGetErrorName", "cuGetErrorString"):
            ptr = ctypes.c_char_p()
            try:
                ok = self.func(call)(code, ctypes.byref(ptr)) == 0 and ptr.value
            except CudaError:
                ok = False
            found.append(ptr.value.decode("utf-8", "replace") if ok else None)
        return found[0] or _ERROR_NAMES.get(code), found[1]

    def raw(self, name, *args):
        self.current_call = name
        try:
            return self.func(name)(*args)
        finally:
            self.current_call = None

    def call(self, name, *args):
        code = self.raw(name, *args)
        if code != CUDA_SUCCESS:
            err_name, message = self.error_text(code)
            raise CudaError(name, code, err_name, message)


def library_path(default):
    """Path of the libcuda this process mapped (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libcuda.so"):
                    return parts[5]
    except OSError:
        pass
    return default


def list_devices(drv):
    count = ctypes.c_int()
    drv.call("cuDeviceGetCount", ctypes.byref(count))
    devices = []
    for i in range(count.value):
        dev = ctypes.c_int()
        drv.call("cuDeviceGet", ctypes.byref(dev), i)
        name = ctypes.create_string_buffer(256)
        drv.call("cuDeviceGetName", name, 256, dev.value)
        mem = ctypes.c_size_t()
        drv.call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev.value)
        major, minor = ctypes.c_int(), ctypes.c_int()
        drv.call("cuDeviceGetAttribute", ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev.value)
        drv.call("cuDeviceGetAttribute", ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev.value)
        devices.append({
            "index": i,
            "handle": dev.value,
            "name": name.value.decode("utf-8", "replace"),
            "cc": "%d.%d" % (major.value, minor.value),
            "total_mem_mib": mem.value // MIB,
        })
    return devices


PAGE_STAMP = struct.Struct("<QQ")


def make_pattern(nbytes):
    """The copy pattern of one probe run: a random 1 MiB block repeated (made once per run;
    :func:`stamp` makes it fresh for each pair without allocating 2 x NBYTES again)."""
    import random  # here: only the copy test needs it (the pre-flight's quick probe does not)

    rng = random.Random(os.urandom(16))
    block = rng.randbytes(min(nbytes, MIB))
    buf = bytearray(nbytes)
    view = memoryview(buf)
    for off in range(0, nbytes, len(block)):
        part = min(len(block), nbytes - off)
        view[off:off + part] = block[:part]
    return buf


def stamp(buf, tag):
    """Stamp every 4 KiB page of BUF with TAG and the page's offset: with a new random tag per
    pair, stale bytes of an earlier pair (or a partial copy) never compare equal, and shifted
    or swapped pages do not either."""
    for off in range(0, len(buf) - 15, 4096):
        PAGE_STAMP.pack_into(buf, off, tag, off)
    return buf


class PeerTest:
    """Per-device primary contexts and buffers, released in :meth:`close`."""

    def __init__(self, drv, devices, nbytes, iters):
        self.drv = drv
        self.devices = devices
        self.nbytes = nbytes
        self.iters = iters
        self.ctx = {}
        self.src_buf = {}
        self.dst_buf = {}
        self.host_out = ctypes.create_string_buffer(nbytes)
        self.pattern = make_pattern(nbytes)
        self.pattern_c = (ctypes.c_char * nbytes).from_buffer(self.pattern)
        self.memcmp = ctypes.CDLL(None).memcmp  # libc's: compares without copying the buffers
        self.memcmp.restype = ctypes.c_int
        self.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        self.peer_enabled = set()

    def setup(self):
        for d in self.devices:
            ctx = ctypes.c_void_p()
            self.drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d["handle"])
            self.ctx[d["index"]] = ctx
            self.drv.call("cuCtxSetCurrent", ctx)
            for bufs in (self.src_buf, self.dst_buf):
                ptr = ctypes.c_uint64()
                self.drv.call("cuMemAlloc_v2", ctypes.byref(ptr), self.nbytes)
                bufs[d["index"]] = ptr.value

    def close(self):
        for index, ctx in self.ctx.items():
            try:
                self.drv.raw("cuCtxSetCurrent", ctx)
                for bufs in (self.src_buf, self.dst_buf):
                    if index in bufs:
                        self.drv.raw("cuMemFree_v2", bufs[index])
            except Exception:
                pass
        for d in self.devices:
            if d["index"] in self.ctx:
                try:
                    self.drv.raw("cuDevicePrimaryCtxRelease_v2", d["handle"])
                except Exception:
                    pass

    def pair(self, result):
        """Test result["src"] -> result["dst"], filling ``result`` as it goes."""
        drv, n = self.drv, self.nbytes
        src, dst = result["src"], result["dst"]
        s, d = self.devices[src], self.devices[dst]
        can = ctypes.c_int()
        drv.call("cuDeviceCanAccessPeer", ctypes.byref(can), s["handle"], d["handle"])
        result["can_access"] = bool(can.value)
        ctx_s, ctx_d = self.ctx[src], self.ctx[dst]
        drv.call("cuCtxSetCurrent", ctx_s)
        if can.value and (src, dst) not in self.peer_enabled:
            code = drv.raw("cuCtxEnablePeerAccess", ctx_d, 0)
            if code not in (CUDA_SUCCESS, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                name, message = drv.error_text(code)
                # the copy below still runs (through host memory); report why peer access is off
                result["error"] = CudaError("cuCtxEnablePeerAccess", code, name, message).short()
            else:
                self.peer_enabled.add((src, dst))
        # data check: a fresh random pattern per pair, so stale bytes never pass
        stamp(self.pattern, int.from_bytes(os.urandom(8), "little"))
        drv.call("cuMemcpyHtoD_v2", self.src_buf[src], self.pattern_c, n)
        drv.call("cuMemcpyPeer", self.dst_buf[dst], ctx_d, self.src_buf[src], ctx_s, n)
        drv.call("cuCtxSynchronize")
        drv.call("cuCtxSetCurrent", ctx_d)
        ctypes.memset(self.host_out, 0, n)
        drv.call("cuMemcpyDtoH_v2", self.host_out, self.dst_buf[dst], n)
        result["verified"] = self.memcmp(self.host_out, self.pattern_c, n) == 0
        # bandwidth: the fastest of `iters` timed copies (the verified copy above was the
        # warm-up: peer access enabled, both buffers touched). A slow link is slow on every
        # copy; a copy slowed by something else on the host (a preempted thread) is not the
        # link's speed, so the best copy, not the mean, is the link's bandwidth.
        drv.call("cuCtxSetCurrent", ctx_s)
        best = None
        for _ in range(self.iters):
            start = time.perf_counter()
            drv.call("cuMemcpyPeer", self.dst_buf[dst], ctx_d, self.src_buf[src], ctx_s, n)
            drv.call("cuCtxSynchronize")
            elapsed = time.perf_counter() - start
            if elapsed > 0 and (best is None or elapsed < best):
                best = elapsed
        if best is not None:
            result["gbps"] = round(n / best / 1e9, 2)
        return result


def probe(report, state, p2p, mib, iters, library):
    """Fill ``report`` (the JSON object) in place, and STATE with the driver and the pair under
    test (for the timeout's report); never raises for CUDA failures."""
    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        report["error"] = {"call": "dlopen", "code": None, "name": None, "message": str(exc)}
        return report
    report["library"] = library_path(library)
    drv = Driver(lib)
    state["driver"] = drv
    try:
        drv.call("cuInit", 0)
        version = ctypes.c_int()
        drv.call("cuDriverGetVersion", ctypes.byref(version))
        report["driver_version"] = version.value
        devices = list_devices(drv)
        report["device_count"] = len(devices)
        report["devices"] = [{k: v for k, v in d.items() if k != "handle"} for d in devices]
        if p2p and len(devices) > 1:
            test = PeerTest(drv, devices, max(1, int(mib * MIB)), max(1, iters))
            try:
                test.setup()
                for src, dst in itertools.permutations(range(len(devices)), 2):
                    state["pair"] = (src, dst)
                    entry = {"src": src, "dst": dst, "can_access": None, "verified": None,
                             "gbps": None, "error": None}
                    try:
                        test.pair(entry)
                    except CudaError as exc:
                        entry["error"] = "; ".join(e for e in (entry["error"], exc.short()) if e)
                    report["p2p"].append(entry)
                    state["pair"] = None
            finally:
                test.close()
        report["ok"] = True
    except CudaError as exc:
        report["error"] = exc.as_dict()
    return report


def new_report():
    return {"ok": False, "library": None, "error": None, "driver_version": None,
            "device_count": None, "devices": [], "p2p": []}


def emit(report):
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--p2p", action="store_true", help="copy between every ordered GPU pair")
    parser.add_argument("--mib", type=float, default=64, help="copy size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=3, help="timed copies per pair (default 3)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="give up after this many seconds and report the call that hung")
    parser.add_argument("--library", default=LIBRARY, help="driver library (default libcuda.so.1)")
    args = parser.parse_args(argv)

    report = new_report()
    state = {}
    printing = threading.Lock()  # held by whoever prints the one JSON object, never released

    def on_timeout():
        if not printing.acquire(blocking=False):
            return  # the probe ended and is printing its report
        call = getattr(state.get("driver"), "current_call", None) or "probe"
        pair = state.get("pair")
        where = " while testing GPU%d -> GPU%d" % pair if pair else ""
        report["ok"] = False
        report["error"] = {"call": call, "code": None, "name": "TIMEOUT",
                           "message": "no answer after %gs%s" % (args.timeout, where)}
        emit(report)
        os._exit(0)

    timer = threading.Timer(args.timeout, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        probe(report, state, args.p2p, args.mib, args.iters, args.library)
    except Exception as exc:  # a bug here must still produce the JSON object
        report["ok"] = False
        report["error"] = {"call": "probe", "code": None, "name": type(exc).__name__,
                           "message": str(exc)}
    timer.cancel()
    printing.acquire()  # blocks for good when the timeout is printing: it ends the process
    emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

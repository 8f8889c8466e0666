"""Fake torch for the unit tests of remote/allreduce_check.py (see ../README.md)."""

import json
import os
import sys
import threading

from . import cuda, distributed, multiprocessing  # noqa: F401

__version__ = "0.0.0+unit.fake"
float32 = "float32"

_STATE = {"local": None, "all_reduces": 0}


def _hook(stage: str) -> None:
    """Fail, hang or exit here when the environment says so for this local rank."""
    local = _STATE["local"]
    for var in ("FAKE_TORCH_FAIL", "FAKE_TORCH_HANG", "FAKE_TORCH_EXIT"):
        spec = os.environ.get(var)
        if not spec:
            continue
        parts = spec.split(":", 3)
        if int(parts[0]) != local or parts[1] != stage:
            continue
        if var == "FAKE_TORCH_FAIL":
            kind = {"RuntimeError": RuntimeError, "ValueError": ValueError}.get(parts[2])
            if kind is None:
                kind = type(parts[2], (RuntimeError,), {})
            raise kind(parts[3])
        if var == "FAKE_TORCH_HANG":
            threading.Event().wait()
        sys.stdout.flush()
        os._exit(3)


def _log(**values) -> None:
    folder = os.environ.get("FAKE_TORCH_LOG")
    if folder:
        with open(os.path.join(folder, f"rank{values['rank']}.json"), "w") as fh:
            json.dump(values, fh)


class _Flag:
    def __init__(self, value: bool):
        self.value = value

    def all(self):
        return self

    def __bool__(self):
        return self.value


class Tensor:
    def __init__(self, numel: int, dtype, device):
        self.numel_, self.dtype, self.device, self.value = numel, dtype, device, 1.0

    def eq(self, other):
        return _Flag(self.value == other)


def ones(numel, dtype=None, device=None):
    _hook("allocate")
    _STATE["device"] = device
    return Tensor(numel, dtype, device)

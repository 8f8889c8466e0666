"""Testbed-only stand-in for the torch that `remote/allreduce_check.py` uses (stdlib only).

The testbed hosts have no GPU, no NCCL and no real torch (locks/testbed.txt installs sglang
without its CUDA stack), so the deploy's all-reduce check (`gpu_allreduce_check`) would stop
at `import torch`. With this folder on the check's PYTHONPATH (inventory/testbed.py,
`gpu_allreduce_env`), the check's orchestration runs for real: one spawned process per GPU
device node of the container, `init_process_group` over `tcp://ADDR:PORT` across the
testbed network (rank 0 listens, every other rank connects, with the deadline torch takes),
and `all_reduce` as a real sum over those TCP connections. Nothing here is NCCL: the
bandwidth it yields means nothing, and `torch.cuda.nccl.version()` says (0, 0, 0).

Never used outside the testbed. The production release venv has the real torch.
"""

import os

from . import cuda, distributed, multiprocessing  # noqa: F401

__version__ = "0.0.0+testbed.standin"
float32 = "float32"


class _Flag:
    def __init__(self, value: bool):
        self.value = value

    def all(self):
        return self

    def __bool__(self):
        return self.value


class Tensor:
    """One value stands for every element (all equal: the check all-reduces ones)."""

    def __init__(self, numel: int, dtype, device):
        self.numel_, self.dtype, self.device, self.value = numel, dtype, device, 1.0

    def eq(self, other):
        return _Flag(self.value == other)


def ones(numel, dtype=None, device=None):
    return Tensor(numel, dtype, device)


def _pid() -> int:  # for the stand-in's own messages
    return os.getpid()

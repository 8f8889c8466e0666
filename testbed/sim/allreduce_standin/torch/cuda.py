"""torch.cuda of the testbed's all-reduce stand-in: the container's GPU device nodes."""

import glob
import re


class nccl:  # torch.cuda.nccl is a module in torch
    @staticmethod
    def version():
        return (0, 0, 0)  # no NCCL here: see the package's docstring


def device_count() -> int:
    return sum(1 for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p))


def set_device(index: int) -> None:
    if not 0 <= index < device_count():
        raise RuntimeError(f"CUDA error: invalid device ordinal (device {index})")


def synchronize() -> None:
    pass

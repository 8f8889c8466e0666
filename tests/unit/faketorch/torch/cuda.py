"""torch.cuda of the fake torch."""

import os


class nccl:  # torch.cuda.nccl is a module in torch
    @staticmethod
    def version():
        return (2, 27, 3)


def device_count() -> int:
    return int(os.environ.get("FAKE_TORCH_DEVICES", "8"))


def set_device(index: int) -> None:
    import torch

    torch._STATE["local"] = index
    torch._hook("set_device")


def synchronize() -> None:
    pass

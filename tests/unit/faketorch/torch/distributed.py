"""torch.distributed of the fake torch: no transport, the sum of identical tensors."""

import os

_GROUP = {}


def init_process_group(backend, init_method=None, rank=None, world_size=None, timeout=None):
    import torch

    torch._hook("init_process_group")
    _GROUP.update(backend=backend, init_method=init_method, rank=rank, world_size=world_size)
    torch._log(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
               local_rank=torch._STATE["local"], timeout_s=timeout.total_seconds(),
               device=None)


def is_initialized() -> bool:
    return bool(_GROUP)


def destroy_process_group() -> None:
    _GROUP.clear()


def all_reduce(tensor) -> None:
    import torch

    torch._STATE["all_reduces"] += 1
    torch._hook("warm-up" if torch._STATE["all_reduces"] == 1 else "timed")
    tensor.value *= _GROUP["world_size"]
    if os.environ.get("FAKE_TORCH_CORRUPT") == str(torch._STATE["local"]):
        tensor.value -= 1

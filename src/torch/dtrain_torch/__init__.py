"""dtrain's collectives as a torch.distributed backend.

    import dtrain_torch
    torch.distributed.init_process_group("dtrain")

Importing the package registers the "dtrain" backend; every process group
made with it (the default group, and new_group's) runs its collectives on a
dtrain communicator of its own, joined through the group's store. See
docs/pytorch.md in dtrain's repository.
"""
import math

import torch
import torch.distributed as dist

from ._C import ProcessGroupDtrain, comm_mem_bytes

__all__ = ["ProcessGroupDtrain", "empty"]


def empty(*size, dtype=torch.float32):
    """An uninitialised (in fact zeroed) CPU tensor in dtrain's communication
    memory (dt_comm_mem_alloc, as NCCL's ncclMemAlloc): the ranks of this
    host read it through a mapping when a collective sends it, no system
    call and no page pinning, where a tensor from torch.empty is pulled by
    cross-memory attach. Any tensor works with the backend; these move
    faster. Shaped like torch.empty: empty(2, 3) or empty((2, 3))."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    esz = torch.empty((), dtype=dtype).element_size()
    raw = comm_mem_bytes(math.prod(size) * esz)
    return raw.view(dtype).view(size)


def _create(store, rank, world_size, timeout):
    return ProcessGroupDtrain(store, rank, world_size, timeout)


if "DTRAIN" not in dist.Backend._plugins:
    dist.Backend.register_backend("dtrain", _create)

"""dtrain's collectives as a torch.distributed backend.

    import dtrain_torch
    torch.distributed.init_process_group("dtrain")

Importing the package registers the "dtrain" backend; every process group
made with it (the default group, and new_group's) runs its collectives on a
dtrain communicator of its own, joined through the group's store. See
docs/pytorch.md in dtrain's repository.
"""
import torch.distributed as dist

from ._C import ProcessGroupDtrain

__all__ = ["ProcessGroupDtrain"]


def _create(store, rank, world_size, timeout):
    return ProcessGroupDtrain(store, rank, world_size, timeout)


if "DTRAIN" not in dist.Backend._plugins:
    dist.Backend.register_backend("dtrain", _create)

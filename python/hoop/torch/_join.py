"""hoop.torch: join(), uneven inputs: a rank out of data takes part in the others'
DistributedOptimizer steps with zero gradients until every rank has joined."""

import torch

from . import _optimizer
from ._job import _live


def join(device=-1):
    """Say this rank has no more data: until every rank has joined, take part in the other ranks'
    DistributedOptimizer steps with zero gradients (uneven inputs end without a hang). Returns the
    rank that joined last. Other calls made by ranks that have not joined (a metric's allreduce)
    are not matched and fail with hoop.Mismatch or a timeout."""
    call = "hvd.join"
    comm = _live(call)
    if comm.size == 1:
        return comm.rank
    active = _join_cycle(comm)
    rounds = 0
    while True:
        rounds += 1
        if active:
            joined = [o._join_round() for o in active][-1]
        else:
            flag = torch.ones(1, dtype=torch.int32)
            comm.allreduce(flag)
            joined = int(flag.item())
        if joined >= comm.size:
            break
    last = torch.tensor([comm.rank if rounds == 1 else -1], dtype=torch.int64)
    comm.allreduce(last, op="max")
    return int(last.item())


def _join_cycle(comm):
    """The optimizers whose steps a joined rank repeats: those that synchronized since the latest
    one last synchronized before (the loop's cycle; usually one optimizer)."""
    log = [ref() for ref in _optimizer._synchronized]
    log = [o for o in log if o is not None and o._comm is comm and o._buckets]
    if not log:
        return []
    latest = log[-1]
    earlier = [i for i, o in enumerate(log[:-1]) if o is latest]
    return log[earlier[-1] + 1:] if earlier else [latest]
